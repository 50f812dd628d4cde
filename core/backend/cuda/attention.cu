// CUDA attention forward with an online softmax over key tiles: one block per (query, head, sequence), the
// contract of the CPU twin (backend/cpu/attention.cpp), with or without a KV cache's per-row positions.
// Built for generation (a few queries against a long cache); the training path's tiled kernel is not here yet.
#include "core/backend/cuda/cuda_common.h"
#include "core/backend/cuda/cuda_kernels.h"
#include "core/backend/cuda/device/dtype.cuh"

namespace hr::cuda {

namespace {

using device::load;
using device::store;

constexpr int kAttnThreads = 128;
constexpr int kKeyTile = 256;         // scores held in shared memory per tile
constexpr int kMaxHeadDim = 256;      // head_dim the per-thread accumulators cover
constexpr int kDimsPerThread = kMaxHeadDim / kAttnThreads;

// The block's maximum (op 0) or sum (op 1) of one value per thread; every thread gets the result.
__device__ float block_reduce(float v, float* scratch, int op) {
  scratch[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s)
      scratch[threadIdx.x] = op == 0 ? fmaxf(scratch[threadIdx.x], scratch[threadIdx.x + s])
                                     : scratch[threadIdx.x] + scratch[threadIdx.x + s];
    __syncthreads();
  }
  const float r = scratch[0];
  __syncthreads();
  return r;
}

template <typename T>
__global__ void attention_kernel(const T* q, const T* k, const T* v, T* out, float* lse, const long long* past,
                                 int q_len, int kv_len, int q_heads, int kv_heads, int d, float scale, bool causal) {
  __shared__ float qs[kMaxHeadDim];
  __shared__ float sc[kKeyTile];
  __shared__ float scratch[kAttnThreads];
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, kvh = h / (q_heads / kv_heads);
  const long long off = past ? past[b] : (long long)(kv_len - q_len);
  const int kend = causal ? int(min((long long)kv_len, off + i + 1)) : kv_len;
  const long long q_row = (((long long)b * q_len + i) * q_heads + h) * d;
  for (int c = threadIdx.x; c < d; c += blockDim.x) qs[c] = load(q, q_row + c) * scale;
  __syncthreads();
  float m = -INFINITY, l = 0.f, acc[kDimsPerThread];
  for (int a = 0; a < kDimsPerThread; ++a) acc[a] = 0.f;
  for (int j0 = 0; j0 < kend; j0 += kKeyTile) {
    const int n = min(kKeyTile, kend - j0);
    float mt = -INFINITY;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      const long long k_row = (((long long)b * kv_len + j0 + j) * kv_heads + kvh) * d;
      float s = 0.f;
      for (int c = 0; c < d; ++c) s += qs[c] * load(k, k_row + c);
      sc[j] = s;
      mt = fmaxf(mt, s);
    }
    const float m_new = fmaxf(m, block_reduce(mt, scratch, 0));
    const float alpha = m == -INFINITY ? 0.f : __expf(m - m_new);
    float st = 0.f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) st += (sc[j] = __expf(sc[j] - m_new));
    l = l * alpha + block_reduce(st, scratch, 1);  // also orders the writes of sc before the reads below
    for (int a = 0, c = threadIdx.x; a < kDimsPerThread && c < d; ++a, c += blockDim.x) {
      float x = acc[a] * alpha;
      for (int j = 0; j < n; ++j) x += sc[j] * load(v, (((long long)b * kv_len + j0 + j) * kv_heads + kvh) * d + c);
      acc[a] = x;
    }
    m = m_new;
    __syncthreads();  // the next tile overwrites sc
  }
  const float inv = l > 0.f ? 1.f / l : 0.f;
  for (int a = 0, c = threadIdx.x; a < kDimsPerThread && c < d; ++a, c += blockDim.x) store(out, q_row + c, acc[a] * inv);
  if (threadIdx.x == 0) lse[((long long)b * q_heads + h) * q_len + i] = l > 0.f ? m + logf(l) : -INFINITY;
}

}  // namespace

void attention_forward(const AttentionArgs& a) {
  const AttentionDesc& s = a.desc;
  HR_CHECK(s.head_dim <= kMaxHeadDim, "[attention] head_dim ", s.head_dim, " is larger than the CUDA kernel's ",
           kMaxHeadDim);
  if (s.batch == 0 || s.q_len == 0) return;
  const dim3 grid(unsigned(s.q_len), unsigned(s.q_heads), unsigned(s.batch));
  const long long* past = a.past.defined() ? a.past.data<long long>() : nullptr;
  dispatch_float(s.dtype, "attention", [&](auto tag) {
    using T = decltype(tag);
    attention_kernel<T><<<grid, kAttnThreads, 0, stream()>>>(
        a.q.data<T>(), a.k.data<T>(), a.v.data<T>(), a.out.data<T>(), a.lse.data<float>(), past, int(s.q_len),
        int(s.kv_len), int(s.q_heads), int(s.kv_heads), int(s.head_dim), a.scale, s.mask == Mask::Causal);
  });
  HR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hr::cuda
