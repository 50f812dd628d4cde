// query_cuda through the CUDA runtime: versions, then each device's properties and free memory.
#include "core/backend/device_info.h"

#include <cuda_runtime.h>

#include "core/check.h"

namespace hr::core {

CudaInfo query_cuda() {
  CudaInfo info;
  cudaRuntimeGetVersion(&info.runtime_version);
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
    if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free, &total) == cudaSuccess) g.free_bytes = int64_t(free);
    info.gpus.push_back(g);
  }
  cudaGetLastError();
  if (info.gpus.empty()) info.absent = "no GPU answered cudaGetDeviceProperties";
  return info;
}

}  // namespace hr::core
