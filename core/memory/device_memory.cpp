// Memory contexts: an allocator per device, the meta target, the context current on each thread.
#include "core/memory/device_memory.h"

namespace hr::core {

namespace {

std::shared_ptr<CachingAllocator> make_allocator(Device d, const DeviceMemoryOptions& o) {
  std::unique_ptr<RawAllocator> raw;
  switch (d.type) {
    case DeviceType::CPU:
      raw = o.capacity ? make_capped_host_allocator(o.capacity) : make_host_allocator();
      break;
    case DeviceType::Host:
      raw = o.pinned_for_gpu >= 0 ? make_pinned_host_allocator(o.pinned_for_gpu) : make_host_allocator();
      break;
    case DeviceType::Meta:
      raw = make_meta_allocator(o.capacity);
      break;
    case DeviceType::CUDA:
      raw = make_cuda_allocator(d.index, o.capacity);
      break;
  }
  return std::make_shared<CachingAllocator>(std::move(raw), d.name(),
                                            d.type == DeviceType::Host ? AllocatorKind::Caching : o.kind);
}

std::pair<int, int> key_of(Device d) {
  return {int(d.type), d.index};
}

MemoryContext& default_context() {
  static MemoryContext c;
  return c;
}

thread_local MemoryContext* t_current = nullptr;

}  // namespace

std::shared_ptr<CachingAllocator> MemoryContext::allocator(Device device) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocators_.find(key_of(device));
  if (it != allocators_.end()) return it->second;
  auto a = make_allocator(device, {});
  allocators_.emplace(key_of(device), a);
  return a;
}

void MemoryContext::configure(Device device, const DeviceMemoryOptions& options) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocators_.find(key_of(device));
  if (it != allocators_.end()) {
    int64_t live = it->second->stats().allocated_bytes.current;
    HR_CHECK(live == 0, "[device] cannot reconfigure ", device.name(), " while ", format_bytes(double(live)),
             " of tensors are alive on it");
    allocators_.erase(it);
  }
  HR_CHECK(!(device.type == DeviceType::Host && options.capacity),
           "[device] the host device cannot be capped; cap 'cpu'");
  HR_CHECK(options.pinned_for_gpu < 0 || device.type == DeviceType::Host,
           "[device] only the host device can be pinned; got ", device.name());
  allocators_.emplace(key_of(device), make_allocator(device, options));
  if (device.type == DeviceType::Meta) meta_target_ = options.sizing.backend;
  if (options.sizing.cuda_arch) cuda_arch_ = options.sizing.cuda_arch;
}

Backend MemoryContext::meta_target() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return meta_target_;
}

int MemoryContext::cuda_arch() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cuda_arch_;
}

MemoryContext::Use::Use(MemoryContext& context) : saved_(t_current) {
  t_current = &context;
}
MemoryContext::Use::~Use() {
  t_current = saved_;
}

MemoryContext& current_memory_context() {
  return t_current ? *t_current : default_context();
}

std::shared_ptr<CachingAllocator> allocator_for(Device device) {
  return current_memory_context().allocator(device);
}

void configure_device(Device device, const DeviceMemoryOptions& options) {
  current_memory_context().configure(device, options);
}

Backend meta_target() {
  return current_memory_context().meta_target();
}

int sizing_cuda_arch() {
  return current_memory_context().cuda_arch();
}

Backend workspace_backend(Device device) {
  switch (device.type) {
    case DeviceType::CUDA:
      return Backend::CUDA;
    case DeviceType::Meta:
      return meta_target();
    default:
      return Backend::CPU;
  }
}

}  // namespace hr::core
