// cudaMalloc/cudaFree raw allocator: segments for the caching allocator on one GPU; and the driver's virtual
// memory (cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemUnmap) for expandable segments, reached through
// cudaGetDriverEntryPointByVersion so that the binary needs no libcuda to load on a machine without a GPU.
#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "core/backend/cuda/cuda_check.h"
#include "core/memory/raw_allocator.h"

namespace hr::core {

namespace {

// The driver's virtual memory functions, or none of them (an old driver: expandable segments are unavailable).
struct Vmm {
  CUresult (*reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*free)(CUdeviceptr, size_t) = nullptr;
  CUresult (*create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long) = nullptr;
  CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) = nullptr;
  CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*granularity)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) = nullptr;

  template <class F>
  static void get(F& f, const char* name) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess)
      f = reinterpret_cast<F>(fn);
  }
  Vmm() {
    get(reserve, "cuMemAddressReserve");
    get(free, "cuMemAddressFree");
    get(create, "cuMemCreate");
    get(release, "cuMemRelease");
    get(map, "cuMemMap");
    get(unmap, "cuMemUnmap");
    get(access, "cuMemSetAccess");
    get(granularity, "cuMemGetAllocationGranularity");
  }
  bool ok() const { return reserve && free && create && release && map && unmap && access && granularity; }
};

class CudaAllocator : public RawAllocator {
 public:
  // cap > 0: a capped GPU (device.memory_limit): it runs out at `cap` bytes as a smaller card would.
  CudaAllocator(int device, std::size_t cap) : device_(device) {
    HR_CUDA_CHECK(cudaSetDevice(device_));
    std::size_t free_bytes = 0, total = 0;
    HR_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    capacity_ = cap ? std::min(cap, total) : total;
    capped_ = cap != 0;
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = device_;
    std::size_t g = 0;
    if (vmm_.ok() && vmm_.granularity(&g, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS &&
        kPageSize % g == 0)
      page_ = kPageSize;
  }

  // Expandable segments: one physical allocation of kPageSize per page, mapped read-write for this device.
  std::size_t page_size() const override { return page_; }
  std::size_t reservable() const override { return capacity_ / kPageSize * kPageSize; }
  void* reserve(std::size_t bytes) override {
    CUdeviceptr p = 0;
    return vmm_.reserve(&p, bytes, kPageSize, 0, 0) == CUDA_SUCCESS ? reinterpret_cast<void*>(p) : nullptr;
  }
  void release(void* base, std::size_t bytes) override { vmm_.free(reinterpret_cast<CUdeviceptr>(base), bytes); }
  bool map(void* at, std::size_t bytes) override {
    if (capped_ && used_ + bytes > capacity_) return false;
    const auto base = reinterpret_cast<CUdeviceptr>(at);
    for (std::size_t off = 0; off < bytes; off += kPageSize) {
      CUmemGenericAllocationHandle h{};
      if (vmm_.create(&h, kPageSize, &prop_, 0) != CUDA_SUCCESS ||
          (vmm_.map(base + off, kPageSize, 0, h, 0) != CUDA_SUCCESS && (vmm_.release(h), true))) {
        if (off) unmap(at, off);  // all or nothing
        return false;
      }
      pages_[base + off] = h;
      used_ += kPageSize;
    }
    CUmemAccessDesc access{};
    access.location = prop_.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (vmm_.access(base, bytes, &access, 1) != CUDA_SUCCESS) {
      unmap(at, bytes);
      return false;
    }
    return true;
  }
  void unmap(void* at, std::size_t bytes) override {
    cudaDeviceSynchronize();  // kernels queued before the blocks were freed may still read these pages
    const auto base = reinterpret_cast<CUdeviceptr>(at);
    vmm_.unmap(base, bytes);
    for (std::size_t off = 0; off < bytes; off += kPageSize) {
      auto it = pages_.find(base + off);
      if (it == pages_.end()) continue;
      vmm_.release(it->second);
      pages_.erase(it);
      used_ -= kPageSize;
    }
  }
  void* allocate(std::size_t bytes) override {
    if (capped_ && used_ + bytes > capacity_) return nullptr;
    HR_CUDA_CHECK(cudaSetDevice(device_));
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clear the sticky-free error so later calls see success
      return nullptr;
    }
    HR_CUDA_CHECK(err);
    used_ += bytes;
    return p;
  }
  void deallocate(void* ptr, std::size_t bytes) override {
    cudaFree(ptr);  // never throws: called from destructors
    used_ -= bytes;
  }
  std::size_t capacity() const override { return capacity_; }
  std::size_t used() const override { return used_; }
  std::string name() const override { return str("cuda:", device_); }

 private:
  int device_;
  std::size_t capacity_ = 0, used_ = 0, page_ = 0;
  bool capped_ = false;
  Vmm vmm_;
  CUmemAllocationProp prop_{};
  std::unordered_map<CUdeviceptr, CUmemGenericAllocationHandle> pages_;
};

}  // namespace

namespace {

// The host device's segments when a run is on a GPU: page-locked, so that copies to the GPU are DMA transfers
// that run beside compute. Accounted on the host allocator like any host memory. The run's GPU is made current
// first (loader threads allocate too, and would otherwise make a context on GPU 0); a segment the driver does
// not pin (locked-memory limits, a huge offloaded state) comes from the heap instead.
class PinnedHostAllocator : public RawAllocator {
 public:
  explicit PinnedHostAllocator(int gpu) : gpu_(gpu) {}
  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    if (cudaSetDevice(gpu_) != cudaSuccess || cudaHostAlloc(&p, bytes, cudaHostAllocDefault) != cudaSuccess) {
      cudaGetLastError();
      p = std::aligned_alloc(kSegmentAlignment,
                             (bytes + kSegmentAlignment - 1) / kSegmentAlignment * kSegmentAlignment);
      if (!p) return nullptr;
      std::lock_guard<std::mutex> lock(mutex_);
      pageable_.insert(p);
    }
    used_ += bytes;
    return p;
  }
  void deallocate(void* ptr, std::size_t bytes) override {
    bool pageable = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pageable = pageable_.erase(ptr) > 0;
    }
    if (pageable)
      std::free(ptr);
    else
      cudaFreeHost(ptr);
    used_ -= bytes;
  }
  std::size_t capacity() const override { return 0; }
  std::size_t used() const override { return used_; }
  std::string name() const override { return "host"; }

 private:
  int gpu_;
  std::atomic<std::size_t> used_{0};
  std::mutex mutex_;
  std::unordered_set<void*> pageable_;
};

}  // namespace

std::unique_ptr<RawAllocator> make_pinned_host_allocator(int gpu_index) {
  return std::make_unique<PinnedHostAllocator>(gpu_index);
}

std::unique_ptr<RawAllocator> make_cuda_allocator(int device_index, std::size_t capacity) {
  return std::make_unique<CudaAllocator>(device_index, capacity);
}

}  // namespace hr::core
