// The memory of a run or of a plan (a MemoryContext: an allocator per device, the backend a meta device
// mirrors), and the functions that reach the current one.
#pragma once

#include <map>
#include <memory>
#include <mutex>

#include "core/device.h"
#include "core/memory/caching_allocator.h"

namespace hr::core {

// Whose workspace sizes a device's ops allocate: the back-end whose kernels run there (for meta, the one it
// mirrors) and, for CUDA, the GPU's architecture as major * 10 + minor of its compute capability (0: before
// Hopper), which cuBLASLt's workspace depends on (core/backend/cuda/sizing_rules.h).
struct SizingTarget {
  Backend backend = Backend::CPU;
  int cuda_arch = 0;
  SizingTarget(Backend b = Backend::CPU, int arch = 0) : backend(b), cuda_arch(arch) {}  // NOLINT: from a Backend
};

struct DeviceMemoryOptions {
  std::size_t capacity = 0;  // 0: unlimited (cpu, host, meta) or the GPU's own size (cuda)
  // meta: whose workspace sizes to mirror; cuda: its architecture. A CUDA architecture given for either becomes
  // the context's (cuda_arch()): a context runs or plans one kind of GPU.
  SizingTarget sizing = {};
  AllocatorKind kind = AllocatorKind::Caching;  // not for the host device, which always caches
  int pinned_for_gpu = -1;  // host only: page-locked memory (cudaHostAlloc) for this GPU's run; -1: pageable
};

// One caching allocator per device and the backend a meta device mirrors. A process starts with a default
// context, which a real run uses (its devices are the machine's); a predictor owns one of its own, so that
// dry runs at different capacities or for different targets can exist at once beside each other and the
// real run. Tensors allocate from the context current on their thread: the default one unless a `Use`
// guard made another current.
class MemoryContext {
 public:
  MemoryContext() = default;
  MemoryContext(const MemoryContext&) = delete;
  MemoryContext& operator=(const MemoryContext&) = delete;

  // The allocator serving `device`, created with default options on first use.
  std::shared_ptr<CachingAllocator> allocator(Device device);
  // Replaces the device's allocator. Throws if the current one still has live allocations.
  void configure(Device device, const DeviceMemoryOptions& options);
  // The backend whose workspace sizes this context's meta device mirrors.
  Backend meta_target() const;
  // The GPU architecture this context's CUDA workspaces are sized for (0: before Hopper, until one is given).
  int cuda_arch() const;

  // Makes a context current on this thread while it lives.
  class Use {
   public:
    explicit Use(MemoryContext& context);
    ~Use();
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;

   private:
    MemoryContext* saved_;
  };

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<int, int>, std::shared_ptr<CachingAllocator>> allocators_;
  Backend meta_target_ = Backend::CPU;
  int cuda_arch_ = 0;
};

MemoryContext& current_memory_context();

// The current context's allocator for `device` (created with default options on first use).
std::shared_ptr<CachingAllocator> allocator_for(Device device);
// Configures `device` in the current context. Throws if its allocator still has live allocations.
void configure_device(Device device, const DeviceMemoryOptions& options);
// The backend the current context's meta device mirrors.
Backend meta_target();
// The GPU architecture the current context's CUDA and meta:cuda workspaces are sized for.
int sizing_cuda_arch();
// The backend an op on `device` sizes its workspace for.
Backend workspace_backend(Device device);

}  // namespace hr::core
