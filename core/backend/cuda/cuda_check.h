// Check macros for every CUDA runtime and cuBLAS call: a failure throws naming the call and the error.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/check.h"

#define HR_CUDA_CHECK(call)                                                                                        \
  do {                                                                                                             \
    cudaError_t hr_err_ = (call);                                                                                  \
    if (hr_err_ != cudaSuccess)                                                                                    \
      throw ::hr::Error(                                                                                           \
          ::hr::str("[cuda] ", #call, " failed: ", cudaGetErrorString(hr_err_), " at ", __FILE__, ":", __LINE__)); \
  } while (0)

#define HR_CUBLAS_CHECK(call)                                                                                          \
  do {                                                                                                                 \
    cublasStatus_t hr_st_ = (call);                                                                                    \
    if (hr_st_ != CUBLAS_STATUS_SUCCESS)                                                                               \
      throw ::hr::Error(                                                                                               \
          ::hr::str("[cublas] ", #call, " failed: ", cublasGetStatusString(hr_st_), " at ", __FILE__, ":", __LINE__)); \
  } while (0)

namespace hr::cuda {

// The stream every kernel of this back-end runs on (the legacy default stream for now).
inline cudaStream_t stream() {
  return nullptr;
}

// Threads a block of an element-wise kernel (launch.cuh launches them, checking the grid).
constexpr int kThreads = 256;

}  // namespace hr::cuda
