// query_cuda through the CUDA runtime: versions, then each device's properties and free memory; a device's memory
// once the back-end has started on it.
#include "core/backend/device_info.h"

#include <cuda_runtime.h>

#include "core/backend/cuda/cuda_check.h"
#include "core/backend/cuda/cuda_kernels.h"
#include "core/backend/cuda/cuda_libraries.h"
#include "core/backend/cuda/cudnn_attention.h"

namespace hr::core {

std::vector<std::string> cuda_libraries() {
  std::vector<std::string> out;
  for (cuda::Library lib : cuda::kLibraries) {
    const cuda::Found found = cuda::library_found(lib);
    out.push_back(found.ok ? str(cuda::library_name(lib), ": ", cuda::library_file(lib), " (", found.text, ")")
                           : str(cuda::library_name(lib), ": not found: ", found.text));
  }
  return out;
}

CudaInfo query_cuda(FreeMemory query) {
  const bool free_memory = query == FreeMemory::Query;
  CudaInfo info;
  cudaRuntimeGetVersion(&info.runtime_version);
  info.fused_attention = cuda::cudnn_attention_version();
  if (cudaDriverGetVersion(&info.driver_version) != cudaSuccess || info.driver_version == 0) {
    info.driver_version = 0;
    info.absent = "no NVIDIA driver on this machine";
    return info;
  }
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    info.absent = e != cudaSuccess ? str("cudaGetDeviceCount: ", cudaGetErrorString(e)) : "the driver sees no GPU";
    cudaGetLastError();
    return info;
  }
  // Asking a GPU for its free memory makes it current (and, since CUDA 12, so does cudaSetDevice alone make a
  // context): the current device is put back below, and neither happens without FreeMemory::Query.
  int current = 0;
  if (free_memory) cudaGetDevice(&current);
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    GpuInfo g;
    g.index = i;
    g.name = p.name;
    g.major = p.major, g.minor = p.minor;
    g.multiprocessors = p.multiProcessorCount;
    g.total_bytes = int64_t(p.totalGlobalMem);
    std::size_t free = 0, total = 0;
    if (free_memory && cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free, &total) == cudaSuccess)
      g.free_bytes = int64_t(free);
    info.gpus.push_back(g);
  }
  if (free_memory) cudaSetDevice(current);
  cudaGetLastError();
  if (info.gpus.empty()) info.absent = "no GPU answered cudaGetDeviceProperties";
  return info;
}

CudaMemInfo cuda_memory_now(int index) {
  HR_CUDA_CHECK(cudaSetDevice(index));
  std::size_t free_bytes = 0, total = 0;
  HR_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  return {int64_t(free_bytes), int64_t(total)};
}

CudaMemInfo cuda_memory_after_start(int index) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  HR_CHECK(e == cudaSuccess && index >= 0 && index < count, "[device] cuda:", index, " is not usable: ",
           e != cudaSuccess ? std::string(cudaGetErrorString(e)) : str(count, " GPU(s) on this machine"));
  HR_CUDA_CHECK(cudaSetDevice(index));
  HR_CUDA_CHECK(cudaFree(nullptr));  // the context
  cuda::create_library_handles();
  HR_CUDA_CHECK(cudaDeviceSynchronize());
  return cuda_memory_now(index);
}

}  // namespace hr::core
