// Shared argument checks and workspace allocation for ops.
#include "core/ops/dispatch.h"

#include <atomic>

#include "core/memory/device_memory.h"

namespace hr::core {

namespace {
std::atomic<KernelObserver*> g_observer{nullptr};
std::atomic<double> g_matmul_flops{0};
}  // namespace

double matmul_flops() {
  return g_matmul_flops.load(std::memory_order_relaxed);
}
void add_matmul_flops(Device device, double flops) {
  if (device.type != DeviceType::Meta) g_matmul_flops.fetch_add(flops, std::memory_order_relaxed);
}

void set_kernel_observer(KernelObserver* observer) {
  g_observer.store(observer);
}
KernelObserver* kernel_observer() {
  return g_observer.load(std::memory_order_relaxed);
}

Tensor allocate_workspace(std::size_t bytes, Device device) {
  if (bytes == 0) return {};
  MemoryScope scope(Category::Workspace);
  return Tensor::empty({int64_t(bytes)}, DType::U8, device);
}

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  HR_CHECK(a.device() == b.device(), "[", op, "] inputs on different devices: ", a.describe(), " and ", b.describe());
}

void check_float(const char* op, const char* name, const Tensor& t) {
  HR_CHECK(t.defined() && is_float(t.dtype()), "[", op, "] ", name, " must be f32, bf16 or f16; got ", t.describe());
}

void check_shape(const char* op, const char* name, const Tensor& t, const Shape& expected) {
  HR_CHECK(t.defined() && t.shape() == expected, "[", op, "] ", name, " must have shape ", shape_str(expected),
           "; got ", t.describe());
}

std::vector<std::pair<const char*, bool>> kernel_entries(const Kernels& k) {
  std::vector<std::pair<const char*, bool>> entries;
#define HR_ENTRY(name, ret, params) entries.emplace_back(#name, k.name != nullptr);
  HR_SIZING_FUNCTIONS(HR_ENTRY)
  HR_KERNELS(HR_ENTRY)
#undef HR_ENTRY
  return entries;
}

const Kernels* kernels_for(Device device) {
  switch (device.type) {
    case DeviceType::CPU:
    case DeviceType::Host:
      return &cpu_kernels();
    case DeviceType::CUDA:
      return &cuda_kernels();
    case DeviceType::Meta:
      return nullptr;
  }
  return nullptr;
}

const Kernels& sizing_kernels(Device device) {
  return sizing_kernels(workspace_backend(device));
}

const Kernels& sizing_kernels(Backend backend) {
  return backend == Backend::CUDA ? cuda_sizing_kernels() : cpu_kernels();
}

}  // namespace hr::core
