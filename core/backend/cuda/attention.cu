// CUDA attention where cuDNN's fused attention does not take the shape (cudnn_attention.cpp: f32, KV caches,
// head dims cuDNN's flash kernels do not cover), with the contract of the CPU twin (backend/cpu/attention.cpp): O(L)
// memory, the forward saving each query's log-sum-exp and the backward recomputing the probabilities from it.
// - Forward: an online softmax over key tiles, one block per (query, head, sequence), with or without a KV
//   cache's per-row positions.
// - Backward: delta = rowsum(dO * O); then one block per (key, kv head, sequence) sums dK and dV over the queries
//   of its head group, and one block per (query, head, sequence) sums dQ over its keys. Each block's warps take
//   every fourth query (or key) and their sums are added in warp order: no atomics, the same bits every run.
//   The probabilities are recomputed in both passes (FlashAttention-2 keeps one pass and an f32 dQ accumulated
//   with atomics instead).
#include "core/backend/cuda/cuda_common.h"
#include "core/backend/cuda/cuda_kernels.h"
#include "core/backend/cuda/cudnn_attention.h"
#include "core/backend/cuda/device/dtype.cuh"
#include "core/backend/cuda/device/reduce.cuh"

namespace hr::cuda {

namespace {

using device::load;
using device::store;

constexpr int kAttnThreads = 128;
constexpr int kKeyTile = 256;     // scores held in shared memory per tile
constexpr int kMaxHeadDim = 256;  // head_dim the per-thread accumulators cover
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
  for (int a = 0, c = threadIdx.x; a < kDimsPerThread && c < d; ++a, c += blockDim.x)
    store(out, q_row + c, acc[a] * inv);
  if (threadIdx.x == 0) lse[((long long)b * q_heads + h) * q_len + i] = l > 0.f ? m + logf(l) : -INFINITY;
}

// delta[b, h, i] = sum_c dO[b, i, h, c] * O[b, i, h, c], one thread per (b, i, h).
template <typename T>
__global__ void attention_delta_kernel(const T* dout, const T* o, float* delta, long long rows, int q_len, int q_heads,
                                       int d) {
  const long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  float acc = 0.f;
  for (int c = 0; c < d; ++c) acc += load(dout, row * d + c) * load(o, row * d + c);
  const long long h = row % q_heads, i = (row / q_heads) % q_len, b = row / ((long long)q_heads * q_len);
  delta[(b * q_heads + h) * q_len + i] = acc;
}

constexpr int kBwdWarps = 4;
constexpr int kDimsPerLane = kMaxHeadDim / device::kWarp;

// One (query, key) pair as a warp sees it: lane l holds dims l, l + 32, ... of both rows. Returns p and dS (the
// softmax scale folded in) from the rows' dot products.
struct PairGrad {
  float p, ds;
};
__device__ __forceinline__ PairGrad pair_grad(float qk, float dov, float lse, float delta, float scale) {
  qk = device::warp_sum(qk);
  dov = device::warp_sum(dov);
  const float p = lse == -INFINITY ? 0.f : __expf(qk * scale - lse);
  return {p, p * (dov - delta) * scale};
}

// The warps' accumulators (kBwdWarps x d floats in shared memory) added in warp order into out's row.
template <typename T>
__device__ void store_warp_sums(const float* acc, T* out, int d) {
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float s = 0.f;
    for (int w = 0; w < kBwdWarps; ++w) s += acc[w * kMaxHeadDim + c];
    store(out, c, s);
  }
}

template <typename T>
__global__ void attention_dkv_kernel(const T* q, const T* k, const T* v, const T* dout, const float* lse,
                                     const float* delta, T* dk, T* dv, int q_len, int kv_len, int q_heads, int kv_heads,
                                     int d, float scale, bool causal) {
  __shared__ float ks[kMaxHeadDim], vs[kMaxHeadDim];
  __shared__ float dks[kBwdWarps * kMaxHeadDim], dvs[kBwdWarps * kMaxHeadDim];
  const int j = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z, group = q_heads / kv_heads;
  const int lane = threadIdx.x % device::kWarp, warp = threadIdx.x / device::kWarp;
  const long long k_row = (((long long)b * kv_len + j) * kv_heads + kvh) * d;
  for (int c = threadIdx.x; c < d; c += blockDim.x) ks[c] = load(k, k_row + c), vs[c] = load(v, k_row + c);
  __syncthreads();
  float dk_acc[kDimsPerLane], dv_acc[kDimsPerLane];
  for (int a = 0; a < kDimsPerLane; ++a) dk_acc[a] = dv_acc[a] = 0.f;
  // Query i sees key j when j <= i + kv_len - q_len.
  const int first = causal ? max(0, j - (kv_len - q_len)) : 0, nq = q_len - first;
  for (int t = warp; t < group * nq; t += kBwdWarps) {
    const int h = kvh * group + t / nq, i = first + t % nq;
    const long long q_row = (((long long)b * q_len + i) * q_heads + h) * d;
    float qk = 0.f, dov = 0.f;
    for (int a = 0, c = lane; a < kDimsPerLane && c < d; ++a, c += device::kWarp)
      qk += load(q, q_row + c) * ks[c], dov += load(dout, q_row + c) * vs[c];
    const long long stat = ((long long)b * q_heads + h) * q_len + i;
    const PairGrad g = pair_grad(qk, dov, lse[stat], delta[stat], scale);
    for (int a = 0, c = lane; a < kDimsPerLane && c < d; ++a, c += device::kWarp) {
      dv_acc[a] += g.p * load(dout, q_row + c);
      dk_acc[a] += g.ds * load(q, q_row + c);
    }
  }
  for (int a = 0, c = lane; a < kDimsPerLane && c < d; ++a, c += device::kWarp)
    dks[warp * kMaxHeadDim + c] = dk_acc[a], dvs[warp * kMaxHeadDim + c] = dv_acc[a];
  __syncthreads();
  store_warp_sums(dks, dk + k_row, d);
  store_warp_sums(dvs, dv + k_row, d);
}

template <typename T>
__global__ void attention_dq_kernel(const T* q, const T* k, const T* v, const T* dout, const float* lse,
                                    const float* delta, T* dq, int q_len, int kv_len, int q_heads, int kv_heads, int d,
                                    float scale, bool causal) {
  __shared__ float qs[kMaxHeadDim], dos[kMaxHeadDim];
  __shared__ float dqs[kBwdWarps * kMaxHeadDim];
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, kvh = h / (q_heads / kv_heads);
  const int lane = threadIdx.x % device::kWarp, warp = threadIdx.x / device::kWarp;
  const long long q_row = (((long long)b * q_len + i) * q_heads + h) * d;
  for (int c = threadIdx.x; c < d; c += blockDim.x) qs[c] = load(q, q_row + c), dos[c] = load(dout, q_row + c);
  __syncthreads();
  const long long stat = ((long long)b * q_heads + h) * q_len + i;
  const float l = lse[stat], dl = delta[stat];
  float dq_acc[kDimsPerLane];
  for (int a = 0; a < kDimsPerLane; ++a) dq_acc[a] = 0.f;
  const int kend = causal ? min(kv_len, i + (kv_len - q_len) + 1) : kv_len;
  for (int j = warp; j < kend; j += kBwdWarps) {
    const long long k_row = (((long long)b * kv_len + j) * kv_heads + kvh) * d;
    float qk = 0.f, dov = 0.f;
    for (int a = 0, c = lane; a < kDimsPerLane && c < d; ++a, c += device::kWarp)
      qk += qs[c] * load(k, k_row + c), dov += dos[c] * load(v, k_row + c);
    const PairGrad g = pair_grad(qk, dov, l, dl, scale);
    for (int a = 0, c = lane; a < kDimsPerLane && c < d; ++a, c += device::kWarp)
      dq_acc[a] += g.ds * load(k, k_row + c);
  }
  for (int a = 0, c = lane; a < kDimsPerLane && c < d; ++a, c += device::kWarp) dqs[warp * kMaxHeadDim + c] = dq_acc[a];
  __syncthreads();
  store_warp_sums(dqs, dq + q_row, d);
}

}  // namespace

void attention_forward(const AttentionArgs& a) {
  if (cudnn_attention_forward(a)) return;
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

void attention_backward(const AttentionArgs& a) {
  if (cudnn_attention_backward(a)) return;
  const AttentionDesc& s = a.desc;
  HR_CHECK(s.head_dim <= kMaxHeadDim, "[attention_backward] head_dim ", s.head_dim,
           " is larger than the CUDA kernel's ", kMaxHeadDim);
  if (s.batch == 0) return;
  const bool causal = s.mask == Mask::Causal;
  float* delta = static_cast<float*>(a.workspace.data_ptr());  // sizing.cpp: (batch, q_heads, q_len) f32
  const long long rows = s.batch * s.q_len * s.q_heads;
  const int threads = kBwdWarps * device::kWarp;
  dispatch_float(s.dtype, "attention_backward", [&](auto tag) {
    using T = decltype(tag);
    if (rows > 0)
      attention_delta_kernel<<<blocks_for(rows), kThreads, 0, stream()>>>(
          a.dout.data<T>(), a.out.data<T>(), delta, rows, int(s.q_len), int(s.q_heads), int(s.head_dim));
    if (s.kv_len > 0)
      attention_dkv_kernel<<<dim3(unsigned(s.kv_len), unsigned(s.kv_heads), unsigned(s.batch)), threads, 0, stream()>>>(
          a.q.data<T>(), a.k.data<T>(), a.v.data<T>(), a.dout.data<T>(), a.lse.data<float>(), delta, a.dk.data<T>(),
          a.dv.data<T>(), int(s.q_len), int(s.kv_len), int(s.q_heads), int(s.kv_heads), int(s.head_dim), a.scale,
          causal);
    if (s.q_len > 0)
      attention_dq_kernel<<<dim3(unsigned(s.q_len), unsigned(s.q_heads), unsigned(s.batch)), threads, 0, stream()>>>(
          a.q.data<T>(), a.k.data<T>(), a.v.data<T>(), a.dout.data<T>(), a.lse.data<float>(), delta, a.dq.data<T>(),
          int(s.q_len), int(s.kv_len), int(s.q_heads), int(s.kv_heads), int(s.head_dim), a.scale, causal);
  });
  HR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hr::cuda
