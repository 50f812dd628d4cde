// How a CUDA kernel reports bad input (an id outside the vocabulary, a label outside it) without allocating:
// the kernel atomicMin's the element's position into a __device__ variable of its file, and the host reads it
// after the launch (a synchronisation: these checks guard the batch's ids, once per op).
#pragma once

#include <cstdint>

#include "core/backend/cuda/cuda_common.h"
#include "core/backend/dispatch_index.h"

namespace hr::cuda {

using core::dispatch_index;

constexpr unsigned long long kNoIndex = ~0ull;

template <typename Symbol>
void clear_first_index(const Symbol& symbol) {
  HR_CUDA_CHECK(cudaMemcpyToSymbolAsync(symbol, &kNoIndex, sizeof kNoIndex, 0, cudaMemcpyHostToDevice, stream()));
}

template <typename Symbol>
unsigned long long first_index(const Symbol& symbol) {
  unsigned long long v = kNoIndex;
  HR_CUDA_CHECK(cudaMemcpyFromSymbolAsync(&v, symbol, sizeof v, 0, cudaMemcpyDeviceToHost, stream()));
  HR_CUDA_CHECK(cudaStreamSynchronize(stream()));
  return v;
}

// Element i of a device tensor of i32 or i64 indices, on the host.
inline int64_t index_at(const Tensor& ids, unsigned long long i) {
  int64_t v = 0;
  if (ids.dtype() == DType::I32) {
    int32_t w = 0;
    HR_CUDA_CHECK(cudaMemcpy(&w, static_cast<const int32_t*>(ids.data_ptr()) + i, sizeof w, cudaMemcpyDeviceToHost));
    v = w;
  } else {
    HR_CUDA_CHECK(cudaMemcpy(&v, static_cast<const int64_t*>(ids.data_ptr()) + i, sizeof v, cudaMemcpyDeviceToHost));
  }
  return v;
}

}  // namespace hr::cuda
