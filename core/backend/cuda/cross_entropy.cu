// CUDA kernels of one chunk of the fused cross-entropy: the twins of backend/cpu/cross_entropy.cpp. The forward
// saves each row's log-sum-exp (one block per row), then one block adds the chunk's row losses to the scalar in a
// fixed order; the backward overwrites the logits with their gradient.
#include "core/backend/cuda/cuda_common.h"
#include "core/backend/cuda/cuda_kernels.h"
#include "core/backend/cuda/device/reduce.cuh"
#include "core/backend/cuda/first_index.cuh"

namespace hr::cuda {

namespace {

using device::block_max;
using device::block_sum;

constexpr int kRowThreads = 256;

__device__ unsigned long long g_bad_label;  // the first row whose label is neither a token nor ignore_index

template <typename I>
__global__ void lse_kernel(const float* logits, const I* labels, float* lse, long long vocab, long long ignore) {
  __shared__ float scratch[device::kWarp];
  const long long r = blockIdx.x;
  const float* x = logits + r * vocab;
  float mx = -INFINITY;
  for (long long c = threadIdx.x; c < vocab; c += blockDim.x) mx = fmaxf(mx, x[c]);
  mx = block_max(mx, scratch);
  float s = 0.f;
  for (long long c = threadIdx.x; c < vocab; c += blockDim.x) s += expf(x[c] - mx);
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) {
    lse[r] = mx + logf(s);
    const long long l = labels[r];
    if (l != ignore && (l < 0 || l >= vocab)) atomicMin(&g_bad_label, (unsigned long long)r);
  }
}

// loss += sum over valid rows of (lse - logit[label]) * inv_normalizer, each thread's rows in order, then the block.
template <typename I>
__global__ void add_loss_kernel(const float* logits, const I* labels, const float* lse, float* loss, long long rows,
                                long long vocab, long long ignore, float inv_normalizer) {
  __shared__ double scratch[device::kWarp];
  double s = 0.0;
  for (long long r = threadIdx.x; r < rows; r += blockDim.x)
    if (labels[r] != ignore) s += double(lse[r]) - double(logits[r * vocab + labels[r]]);
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) loss[0] += float(s * inv_normalizer);
}

template <typename I>
__global__ void ce_backward_kernel(float* logits, const I* labels, const float* lse, const float* dloss, long long n,
                                   long long vocab, long long ignore, float inv_normalizer) {
  const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const long long r = t / vocab, c = t % vocab, l = labels[r];
  if (l == ignore) {
    logits[t] = 0.f;
    return;
  }
  const float g = dloss[0] * inv_normalizer;
  logits[t] = g * expf(logits[t] - lse[r]) - (c == l ? g : 0.f);
}

}  // namespace

void cross_entropy_forward(const CrossEntropyArgs& a) {
  const int64_t rows = a.logits.size(0), vocab = a.logits.size(1);
  if (rows == 0) return;
  dispatch_index(a.labels.dtype(), "cross_entropy", [&](auto itag) {
    using I = decltype(itag);
    clear_first_index(g_bad_label);
    lse_kernel<<<unsigned(rows), kRowThreads, 0, stream()>>>(a.logits.data<float>(), a.labels.data<I>(),
                                                             a.lse.data<float>(), vocab, a.ignore_index);
    HR_CUDA_CHECK(cudaGetLastError());
    const unsigned long long bad = first_index(g_bad_label);
    HR_CHECK(bad == kNoIndex, "[cross_entropy] label ", index_at(a.labels, bad), " at row ", bad, " is outside [0, ",
             vocab, ") and is not ignore_index ", a.ignore_index);
    add_loss_kernel<<<1, 1024, 0, stream()>>>(a.logits.data<float>(), a.labels.data<I>(), a.lse.data<float>(),
                                              a.loss.data<float>(), rows, vocab, a.ignore_index, a.inv_normalizer);
  });
  HR_CUDA_CHECK(cudaGetLastError());
}

void cross_entropy_backward(const CrossEntropyArgs& a) {
  const int64_t rows = a.logits.size(0), vocab = a.logits.size(1), n = rows * vocab;
  if (n == 0) return;
  dispatch_index(a.labels.dtype(), "cross_entropy_backward", [&](auto itag) {
    using I = decltype(itag);
    ce_backward_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(a.logits.data<float>(), a.labels.data<I>(),
                                                                 a.lse.data<float>(), a.dloss.data<float>(), n, vocab,
                                                                 a.ignore_index, a.inv_normalizer);
  });
  HR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hr::cuda
