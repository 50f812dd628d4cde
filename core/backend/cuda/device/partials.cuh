// A whole-array sum in a fixed order without a workspace: kPartials blocks of a fixed size each sum a fixed
// stride of the terms (a thread's in index order, then the block's by device::block_sum) into a buffer of the
// including file's own; one block of kPartials threads then adds the buffer up. Everything runs on the back-end's
// one stream, so one buffer per file is enough.
#pragma once

#include "core/backend/cuda/device/reduce.cuh"

namespace hr::cuda::device {

constexpr int kPartials = 256;        // blocks of the first pass, threads of the second
constexpr int kPartialThreads = 256;  // threads per block of the first pass

static __device__ double g_partials[kPartials];

// First pass, launched as <<<kPartials, kPartialThreads>>>: block b's sum of term(i) lands in g_partials[b].
template <typename Term>
__device__ void partial_sums(long long n, Term term) {
  __shared__ double scratch[kWarp];
  const long long stride = (long long)kPartials * kPartialThreads;
  double s = 0.0;
  for (long long i = (long long)blockIdx.x * kPartialThreads + threadIdx.x; i < n; i += stride) s += term(i);
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) g_partials[blockIdx.x] = s;
}

// Second pass, launched as <<<1, kPartials>>>: every thread gets the total.
__device__ __forceinline__ double total_of_partials() {
  __shared__ double scratch[kWarp];
  return block_sum(g_partials[threadIdx.x], scratch);
}

}  // namespace hr::cuda::device
