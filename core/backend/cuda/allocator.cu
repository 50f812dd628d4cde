// cudaMalloc/cudaFree raw allocator: segments for the caching allocator on one GPU.
#include "core/backend/cuda/cuda_check.h"
#include "core/memory/raw_allocator.h"

namespace hr::core {

namespace {

class CudaAllocator : public RawAllocator {
 public:
  explicit CudaAllocator(int device) : device_(device) {
    HR_CUDA_CHECK(cudaSetDevice(device_));
    std::size_t free_bytes = 0, total = 0;
    HR_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    capacity_ = total;
  }
  void* allocate(std::size_t bytes) override {
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
  std::size_t capacity_ = 0, used_ = 0;
};

}  // namespace

std::unique_ptr<RawAllocator> make_cuda_allocator(int device_index) {
  return std::make_unique<CudaAllocator>(device_index);
}

}  // namespace hr::core
