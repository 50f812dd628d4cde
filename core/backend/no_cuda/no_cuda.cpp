// Stand-in for the CUDA back-end in builds without nvcc: every entry point says so by name.
#include "core/backend/device_info.h"
#include "core/backend/kernels.h"
#include "core/memory/raw_allocator.h"

namespace hr::core {

const Kernels& cuda_kernels() {
  throw Error("[cuda] no CUDA back-end in this build (configure found no nvcc; see the CUDA line of cmake's output)");
}

std::unique_ptr<RawAllocator> make_cuda_allocator(int device_index, std::size_t) {
  throw Error(str("[cuda] cannot use cuda:", device_index, ": no CUDA back-end in this build"));
}

std::unique_ptr<RawAllocator> make_pinned_host_allocator(int) {
  throw Error("[cuda] cannot pin host memory: no CUDA back-end in this build");
}

CudaInfo query_cuda(FreeMemory) {
  CudaInfo info;
  info.absent = "no CUDA back-end in this build";
  return info;
}

std::vector<std::string> cuda_libraries() {
  return {};
}

CudaMemInfo cuda_memory_after_start(int index) {
  throw Error(str("[cuda] cannot use cuda:", index, ": no CUDA back-end in this build"));
}

CudaMemInfo cuda_memory_now(int index) {
  return cuda_memory_after_start(index);
}

}  // namespace hr::core
