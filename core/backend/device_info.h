// What the CUDA runtime says about the machine's GPUs, for `headroom info` and the GPU checks. Never throws: no
// CUDA back-end, no driver or no GPU is a reason in `CudaInfo::absent`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hr::core {

struct GpuInfo {
  int index = 0;
  std::string name;
  int major = 0, minor = 0;  // compute capability
  int multiprocessors = 0;
  int64_t total_bytes = 0, free_bytes = 0;
};

struct CudaInfo {
  int runtime_version = 0, driver_version = 0;  // 13000 = 13.0; 0 where there is none
  std::vector<GpuInfo> gpus;
  std::string absent;           // why there is no GPU to use ("" when gpus is not empty)
  std::string fused_attention;  // the cuDNN (and frontend) behind fused attention, or why there is none
};

// FreeMemory::Query: also each GPU's free memory (headroom info). Asking for it makes a CUDA context on every GPU
// (hundreds of MiB each, for the process's life), so a training rank, which must hold a context only on its own
// GPU, asks without it: GpuInfo::free_bytes stays 0.
enum class FreeMemory : uint8_t { Skip, Query };
CudaInfo query_cuda(FreeMemory free_memory = FreeMemory::Skip);

struct CudaMemInfo {
  int64_t free_bytes = 0, total_bytes = 0;
};
// cuda:`index` once its context and the back-end's library handles (cuBLAS) exist, created here when they do not
// yet. total - free is what no allocator of headroom's sees (the context, the handles' workspaces, other
// processes): the plan's runtime reserve on this machine. Throws naming the device when it cannot be used.
CudaMemInfo cuda_memory_after_start(int index);
// cudaMemGetInfo of cuda:`index` now (the memory log's device_free and device_total).
CudaMemInfo cuda_memory_now(int index);

// The libraries the CUDA back-end opens on first use (cuBLAS, cuBLASLt, NVRTC: backend/cuda/cuda_libraries.h), each
// as "name: file (where it was found)" or "name: not found: why"; opens them. Empty without the back-end.
std::vector<std::string> cuda_libraries();

// "13.0" from 13000.
std::string cuda_version_text(int version);

}  // namespace hr::core
