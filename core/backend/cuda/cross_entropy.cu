// CUDA kernels of one chunk of the fused cross-entropy: the twins of backend/cpu/cross_entropy.cpp. The forward
// saves each row's log-sum-exp (one block per row), then one block adds the chunk's row losses to the scalar in a
// fixed order; the backward writes the logit gradient over the logits and, cast, into the GEMMs' operand buffer.
// Labels are checked here only where the caller has not checked them already (LabelCheck): the check reads its
// result back, which waits for everything queued before it.
#include "core/backend/cuda/cuda_common.h"
#include "core/backend/cuda/cuda_kernels.h"
#include "core/backend/cuda/device/dtype.cuh"
#include "core/backend/cuda/device/reduce.cuh"
#include "core/backend/cuda/first_index.cuh"
#include "core/backend/cuda/launch.cuh"

namespace hr::cuda {

namespace {

using device::block_max;
using device::block_sum;

constexpr int kRowThreads = 256;
constexpr int kLossThreads = 1024;

__device__ unsigned long long g_bad_label;  // the first row whose label is neither a token nor ignore_index

template <typename I>
__global__ void lse_kernel(const float* logits, const I* labels, float* lse, long long vocab, long long ignore,
                           bool check) {
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
    if (check && l != ignore && (l < 0 || l >= vocab)) atomicMin(&g_bad_label, (unsigned long long)r);
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

// d(loss)/d(logit) of element t over the logit and, where `cast` is given, into cast[t] in its type too.
template <typename O, typename I>
__global__ void ce_backward_kernel(float* logits, O* cast, const I* labels, const float* lse, const float* dloss,
                                   long long n, long long vocab, long long ignore, float inv_normalizer) {
  const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const long long r = t / vocab, c = t % vocab, l = labels[r];
  const float g = dloss[0] * inv_normalizer;
  const float v = l == ignore ? 0.f : g * expf(logits[t] - lse[r]) - (c == l ? g : 0.f);
  logits[t] = v;
  if (cast) device::store(cast, t, v);
}

}  // namespace

void cross_entropy_forward(const CrossEntropyArgs& a) {
  const int64_t rows = a.logits.size(0), vocab = a.logits.size(1);
  if (rows == 0) return;
  const bool check = a.check == LabelCheck::InKernel;
  dispatch_index(a.labels.dtype(), "cross_entropy", [&](auto itag) {
    using I = decltype(itag);
    if (check) clear_first_index(g_bad_label);
    launch_rows("cross_entropy", rows, kRowThreads, lse_kernel<I>, a.logits.data<float>(), a.labels.data<I>(),
                a.lse.data<float>(), vocab, a.ignore_index, check);
    if (check) {
      const unsigned long long bad = first_index(g_bad_label);
      HR_CHECK(bad == kNoIndex, "[cross_entropy] label ", index_at(a.labels, bad), " at row ", bad, " is outside [0, ",
               vocab, ") and is not ignore_index ", a.ignore_index);
    }
    launch_kernel(dim3(1), dim3(kLossThreads), 0, add_loss_kernel<I>, a.logits.data<float>(), a.labels.data<I>(),
                  a.lse.data<float>(), a.loss.data<float>(), rows, vocab, a.ignore_index, a.inv_normalizer);
  });
}

void cross_entropy_backward(const CrossEntropyArgs& a) {
  const int64_t rows = a.logits.size(0), vocab = a.logits.size(1), n = rows * vocab;
  const Tensor& out = a.dlogits.defined() ? a.dlogits : a.logits;
  HR_CHECK(out.numel() == n && out.is_contiguous(), "[cross_entropy_backward] dlogits ", out.describe(),
           " does not hold the chunk's ", rows, " x ", vocab, " logits");
  dispatch_index(a.labels.dtype(), "cross_entropy_backward", [&](auto itag) {
    using I = decltype(itag);
    dispatch_float(out.dtype(), "cross_entropy_backward", [&](auto otag) {
      using O = decltype(otag);
      launch_elements("cross_entropy_backward", n, ce_backward_kernel<O, I>, a.logits.data<float>(),
                      a.dlogits.defined() ? out.data<O>() : static_cast<O*>(nullptr), a.labels.data<I>(),
                      a.lse.data<float>(), a.dloss.data<float>(), n, vocab, a.ignore_index, a.inv_normalizer);
    });
  });
}

}  // namespace hr::cuda
