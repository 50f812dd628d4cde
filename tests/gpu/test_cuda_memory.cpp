// The three memory.allocator kinds on a GPU (label gpu): expandable segments map and unmap driver pages
// (cudaMemGetInfo sees them come and go), and a planned stretch recorded on the meta device runs from a
// cudaMalloc'd arena with the same peaks. Skipped where no GPU is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <memory>

#include "core/memory/arena_plan.h"
#include "core/memory/caching_allocator.h"
#include "core/memory/device_memory.h"
#include "core/memory/replay.h"
#include "core/ops/copy.h"
#include "core/ops/elementwise.h"

using namespace hr;
using namespace hr::core;

namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::size_t device_free() {
  std::size_t free_bytes = 0, total = 0;
  cudaMemGetInfo(&free_bytes, &total);
  return free_bytes;
}

}  // namespace

TEST(CudaMemory, ExpandableSegmentsMapAndUnmapDriverPages) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  CachingAllocator a(make_cuda_allocator(0), "cuda:0", AllocatorKind::Expandable);
  const std::size_t before = device_free();
  auto* x = a.allocate(64_MiB + 3_MiB);
  ASSERT_EQ(cudaMemset(CachingAllocator::data(x), 1, 64_MiB + 3_MiB), cudaSuccess);
  EXPECT_EQ(a.stats().reserved_bytes.current, int64_t(68_MiB));
  EXPECT_LE(device_free() + 68_MiB, before + 2_MiB);  // the driver gave out the pages
  auto* y = a.allocate(1_MiB);
  a.free(x);
  a.empty_cache();  // y's page stays
  EXPECT_EQ(a.stats().reserved_bytes.current, int64_t(2_MiB));
  EXPECT_GE(device_free() + 4_MiB, before);
  ASSERT_EQ(cudaMemset(CachingAllocator::data(y), 2, 1_MiB), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  a.free(y);
}

TEST(CudaMemory, APlannedStretchRunsFromItsArena) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  auto script = [](CachingAllocator& a) {
    auto* kept = a.allocate(5_MiB);
    auto* t1 = a.allocate(30_MiB);
    auto* t2 = a.allocate(10_MiB);
    a.free(t1);
    auto* t3 = a.allocate(20_MiB);
    a.free(t2);
    a.free(t3);
    return kept;
  };
  CachingAllocator meta(make_meta_allocator(0), "meta", AllocatorKind::Planned);
  RequestTrace trace;
  meta.begin_stretch(nullptr);
  meta.set_trace([&](const TraceEvent& e) { trace.record(e); });
  auto* kept_meta = script(meta);
  meta.set_trace({});
  auto layout = std::make_shared<const ArenaLayout>(layout_arena(trace));
  meta.end_stretch(layout);
  EXPECT_EQ(layout->arena, 40_MiB);  // t3 takes t1's place

  CachingAllocator gpu(make_cuda_allocator(0), "cuda:0", AllocatorKind::Planned);
  gpu.begin_stretch(layout);
  auto* kept = script(gpu);
  gpu.end_stretch();
  EXPECT_FALSE(gpu.stretch_broken());
  EXPECT_EQ(gpu.stats().reserved_bytes.peak, meta.stats().reserved_bytes.peak);
  EXPECT_EQ(gpu.stats().allocated_bytes.peak, meta.stats().allocated_bytes.peak);
  ASSERT_EQ(cudaMemset(CachingAllocator::data(kept), 3, 5_MiB), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  gpu.free(kept);
  meta.free(kept_meta);
}

TEST(CudaMemory, APinnedHostDeviceIsPageLockedAndCopiesFromItAsynchronously) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  MemoryContext context;
  MemoryContext::Use use(context);
  configure_device(Device::host(), {0, Backend::CPU, AllocatorKind::Caching, 0});
  std::vector<float> values(3 << 20);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = float(i % 1000) * 0.5f;
  const Tensor batch = Tensor::from_floats(values, {3, 1 << 20}, DType::F32, Device::host());
  cudaPointerAttributes attributes{};
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, batch.data_ptr()), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeHost) << "the host device's memory is not page-locked";
  EXPECT_EQ(allocator_for(Device::host())->stats().allocated_bytes.current, int64_t(12_MiB));
  const Tensor on_gpu = Tensor::empty(batch.shape(), DType::F32, Device::cuda());
  copy_async_(on_gpu, batch);
  EXPECT_EQ(on_gpu.to(Device::cpu()).to_floats(), values);  // the copy back waits for the stream
  // Side copies (offloaded gradients out, updated parameters in): ordered after the compute stream's kernels
  // that wrote their source, arrived once side_copies_done returns.
  const Tensor doubled = axpby(2.f, on_gpu, 0.f, on_gpu);
  const Tensor out = Tensor::empty(batch.shape(), DType::F32, Device::host());
  copy_side_(out, doubled);
  side_copies_done(Device::cuda());
  const std::vector<float> got = out.to_floats();
  for (std::size_t i = 0; i < values.size(); i += 4099) ASSERT_EQ(got[i], 2.f * values[i]) << i;
  const Tensor in = Tensor::empty(batch.shape(), DType::F32, Device::cuda());
  copy_side_(in, out);
  side_copies_done(Device::cuda());
  EXPECT_EQ(in.to(Device::cpu()).to_floats(), out.to_floats());
}
