// CUDA attention where cuDNN's fused attention does not take the shape (cudnn_attention.cpp: f32, head dims
// cuDNN's flash kernels do not cover, KV caches), with the contract of the CPU twin (backend/cpu/attention.cpp):
// O(L) memory, the forward saving each query's log-sum-exp and the backward recomputing the probabilities from it.
//
// Training shapes take tiled kernels in FlashAttention-2's manner on CUDA cores (f32 arithmetic): a block holds a
// tile of queries (or keys) in shared memory and streams tiles of 32 keys (or queries) past it, one per lane.
// - Forward: block (query tile, head, sequence); each warp owns R query rows; lane l scores key l of the tile
//   against them, the row's online softmax is a warp reduction, and the probabilities multiply the value tile
//   into per-lane accumulators (lane l holds dims l, l + 32, ...).
// - Backward: delta = rowsum(dO * O); then block (key tile, kv head, sequence) streams the query tiles of its head
//   group and sums dK and dV (warp per R keys, lane per query), and block (query tile, head, sequence) streams the
//   key tiles and sums dQ. No atomics: each output row has one warp adding into it in a fixed order, the same bits
//   every run. The probabilities are recomputed in both passes (FlashAttention-2 keeps one pass with an f32 dQ
//   accumulated by atomics instead). Tiles and rows per warp are set by the head dim so that shared memory stays
//   within 96 KiB (Volta and every part from Ampere on take that with the opt-in attribute; Turing's 64 KiB is not
//   a target of the build); the only workspace is delta.
// A NaN score makes its row NaN, as the reference's softmax does (fmaxf alone would drop it).
//
// Queries against a KV cache (generation: a few new rows against a long cache) take one block per query row.
#include <algorithm>
#include <cstddef>
#include <mutex>
#include <set>
#include <tuple>
#include <type_traits>

#include "core/backend/cuda/attention_path.h"
#include "core/backend/cuda/cuda_common.h"
#include "core/backend/cuda/cuda_kernels.h"
#include "core/backend/cuda/cudnn_attention.h"
#include "core/backend/cuda/device/dtype.cuh"
#include "core/backend/cuda/device/reduce.cuh"
#include "core/backend/cuda/launch.cuh"

namespace hr::cuda {

namespace {

using device::kFullMask;
using device::kWarp;
using device::load;
using device::store;

constexpr int kMaxHeadDim = 256;  // head_dim the per-lane accumulators cover (8 dims a lane)

// ---- Shapes ----

struct AttnShape {
  int q_len, kv_len, q_heads, kv_heads, d;
  long long off;     // kv_len - q_len: query i sees keys j <= i + off under the causal mask
  long long window;  // and with a sliding window (> 0) only keys j > i + off - window
  float scale;
  bool causal;
};

AttnShape shape_of(const AttentionArgs& a) {
  const AttentionDesc& s = a.desc;
  return {int(s.q_len),       int(s.kv_len),      int(s.q_heads), int(s.kv_heads),       int(s.head_dim),
          s.kv_len - s.q_len, s.applied_window(), a.scale,        s.mask == Mask::Causal};
}

__device__ __forceinline__ bool visible(const AttnShape& s, long long i, long long j) {
  return i < s.q_len && j < s.kv_len && (!s.causal || (j <= i + s.off && (s.window == 0 || j > i + s.off - s.window)));
}

// The first key tile (a multiple of kTile) that query row i0, the first of a block, sees under a sliding window.
__device__ __forceinline__ long long first_key_tile(const AttnShape& s, long long i0, int tile) {
  return s.window > 0 ? max(0LL, i0 + s.off - s.window + 1) / tile * tile : 0;
}

// ---- Tiled kernels (training) ----

constexpr int kWarps = 4;
constexpr int kTiledThreads = kWarps * kWarp;
constexpr int kTile = kWarp;  // keys (forward, dQ) or queries (dK, dV) streamed per step: one per lane

// Rows (queries, or keys for dK/dV) each warp owns, by dims per lane: fewer for wide heads, so that shared memory
// stays within kMaxShared.
constexpr int forward_rows(int dl) {
  return dl <= 4 ? 8 : 4;
}
constexpr int backward_rows(int dl) {
  return dl <= 4 ? 8 : 2;
}
constexpr std::size_t kMaxShared = std::size_t(96) << 10;

// Shared floats of each kernel (the layouts below): a padded row (d + 1) where lanes read rows, a plain one where
// they read columns.
constexpr std::size_t forward_floats(int d, int rows) {
  return std::size_t(kWarps * rows * d + kTile * (d + 1) + kTile * d + kWarps * rows * kTile);
}
constexpr std::size_t dkv_floats(int d, int rows) {
  return std::size_t(2 * kWarps * rows * d + 2 * kTile * (d + 1) + 2 * kTile + 2 * kWarps * rows * kTile);
}
constexpr std::size_t dq_floats(int d, int rows) {
  return std::size_t(2 * kWarps * rows * d + 2 * kTile * (d + 1) + kWarps * rows * kTile);
}
static_assert(forward_floats(kMaxHeadDim, forward_rows(8)) * 4 <= kMaxShared);
static_assert(dkv_floats(kMaxHeadDim, backward_rows(8)) * 4 <= kMaxShared);
static_assert(dq_floats(kMaxHeadDim, backward_rows(8)) * 4 <= kMaxShared);
static_assert(forward_floats(128, forward_rows(4)) * 4 <= kMaxShared);
static_assert(dkv_floats(128, backward_rows(4)) * 4 <= kMaxShared);
static_assert(dq_floats(128, backward_rows(4)) * 4 <= kMaxShared);

// Rows [0, n) of `rows` x d values at (row -> global offset of its first element) into shared memory with row
// pitch `pitch`, times `mul`; rows past n are zeros.
template <typename T, typename Offset>
__device__ __forceinline__ void load_rows(float* dst, int rows, int pitch, int d, int n, const T* src, Offset offset,
                                          float mul = 1.f) {
  for (int t = threadIdx.x; t < rows * d; t += blockDim.x) {
    const int r = t / d, c = t % d;
    dst[r * pitch + c] = r < n ? load(src, offset(r) + c) * mul : 0.f;
  }
}

template <typename T, int DL, int R>
__global__ void tiled_forward_kernel(const T* q, const T* k, const T* v, T* out, float* lse, AttnShape s) {
  extern __shared__ float smem[];
  constexpr int BR = kWarps * R;
  const int d = s.d, dp = d + 1;
  float* qs = smem;             // [BR][d]   the block's queries, scaled
  float* ks = qs + BR * d;      // [kTile][dp]
  float* vs = ks + kTile * dp;  // [kTile][d]
  float* ps = vs + kTile * d;   // [kWarps][R][kTile] a warp's probabilities of the tile
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const long long i0 = (long long)blockIdx.x * BR;
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / (s.q_heads / s.kv_heads);
  const int nq = int(min((long long)BR, s.q_len - i0));
  load_rows(
      qs, BR, d, d, nq, q, [&](int r) { return (((long long)b * s.q_len + i0 + r) * s.q_heads + h) * d; }, s.scale);
  float m[R], l[R], acc[R][DL];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    m[r] = -INFINITY, l[r] = 0.f;
#pragma unroll
    for (int a = 0; a < DL; ++a) acc[r][a] = 0.f;
  }
  const long long kend = s.causal ? min((long long)s.kv_len, i0 + nq - 1 + s.off + 1) : s.kv_len;
  const float* qw = qs + warp * R * d;  // the warp's rows
  float* pw = ps + warp * R * kTile;
  for (long long j0 = first_key_tile(s, i0, kTile); j0 < kend; j0 += kTile) {
    __syncthreads();  // the queries are in; the last tile's readers are done
    const int nk = int(min((long long)kTile, s.kv_len - j0));
    auto key_row = [&](int r) { return (((long long)b * s.kv_len + j0 + r) * s.kv_heads + kvh) * d; };
    load_rows(ks, kTile, dp, d, nk, k, key_row);
    load_rows(vs, kTile, d, d, nk, v, key_row);
    __syncthreads();
    // Scores of the warp's rows against key j0 + lane: the key's element once, every row's beside it.
    float sc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) sc[r] = 0.f;
    const float* kr = ks + lane * dp;
    for (int c = 0; c < d; ++c) {
      const float kc = kr[c];
#pragma unroll
      for (int r = 0; r < R; ++r) sc[r] += qw[r * d + c] * kc;
    }
    const long long j = j0 + lane;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float x = visible(s, i0 + warp * R + r, j) ? sc[r] : -INFINITY;
      const bool nan = __any_sync(kFullMask, x != x) || m[r] != m[r];
      const float m_new = nan ? NAN : fmaxf(m[r], device::warp_max(x));
      const float p = m_new == -INFINITY ? 0.f : __expf(x - m_new);
      const float alpha = m[r] == -INFINITY ? 0.f : __expf(m[r] - m_new);
      l[r] = l[r] * alpha + device::warp_sum(p);
      pw[r * kTile + lane] = p;
#pragma unroll
      for (int a = 0; a < DL; ++a) acc[r][a] *= alpha;
      m[r] = m_new;
    }
    __syncwarp();
    // acc += P V: each value element once, every row's probability beside it.
    for (int jj = 0; jj < kTile; ++jj) {
      float p[R];
#pragma unroll
      for (int r = 0; r < R; ++r) p[r] = pw[r * kTile + jj];
      const float* vr = vs + jj * d;
#pragma unroll
      for (int a = 0; a < DL; ++a) {
        const int c = lane + kWarp * a;
        const float vc = c < d ? vr[c] : 0.f;
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][a] += p[r] * vc;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const long long i = i0 + warp * R + r;
    if (i >= s.q_len) continue;
    const bool nan = l[r] != l[r];
    const float inv = l[r] > 0.f || nan ? 1.f / l[r] : 0.f;
    const long long o = (((long long)b * s.q_len + i) * s.q_heads + h) * d;
#pragma unroll
    for (int a = 0; a < DL; ++a) {
      const int c = lane + kWarp * a;
      if (c < d) store(out, o + c, acc[r][a] * inv);
    }
    if (lane == 0)
      lse[((long long)b * s.q_heads + h) * s.q_len + i] = nan ? NAN : l[r] > 0.f ? m[r] + logf(l[r]) : -INFINITY;
  }
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

// dK and dV of the block's keys: warp w owns keys j0 + w R .. + R; lane l takes query l of each streamed tile.
template <typename T, int DL, int R>
__global__ void tiled_dkv_kernel(const T* q, const T* k, const T* v, const T* dout, const float* lse,
                                 const float* delta, T* dk, T* dv, AttnShape s) {
  extern __shared__ float smem[];
  constexpr int BK = kWarps * R;
  const int d = s.d, dp = d + 1;
  float* ks = smem;                     // [BK][d]     the block's keys
  float* vs = ks + BK * d;              // [BK][d]     and values
  float* qs = vs + BK * d;              // [kTile][dp] the tile's queries (unscaled)
  float* dos = qs + kTile * dp;         // [kTile][dp] and their output gradients
  float* ls = dos + kTile * dp;         // [kTile]     log-sum-exp
  float* ds = ls + kTile;               // [kTile]     delta
  float* pw = ds + kTile;               // [kWarps][R][kTile] probabilities
  float* gw = pw + kWarps * R * kTile;  // [kWarps][R][kTile] dS (scale folded in)
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const long long j0 = (long long)blockIdx.x * BK;
  const int kvh = blockIdx.y, b = blockIdx.z, group = s.q_heads / s.kv_heads;
  const int nk = int(min((long long)BK, s.kv_len - j0));
  auto key_row = [&](int r) { return (((long long)b * s.kv_len + j0 + r) * s.kv_heads + kvh) * d; };
  load_rows(ks, BK, d, d, nk, k, key_row);
  load_rows(vs, BK, d, d, nk, v, key_row);
  float gk[R][DL], gv[R][DL];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int a = 0; a < DL; ++a) gk[r][a] = gv[r][a] = 0.f;
  const float* kw = ks + warp * R * d;  // the warp's keys
  const float* vw = vs + warp * R * d;
  float* pwarp = pw + warp * R * kTile;
  float* gwarp = gw + warp * R * kTile;
  // Query i sees key j when j <= i + off: the block's first key is seen from query j0 - off on; with a window its
  // last key is seen up to query j0 + nk - 1 + window - off (exclusive).
  const long long first = s.causal ? max(0LL, j0 - s.off) / kTile * kTile : 0;
  const long long qend = s.window > 0 ? min((long long)s.q_len, max(0LL, j0 + nk - 1 + s.window - s.off)) : s.q_len;
  for (int g = 0; g < group; ++g) {
    const int h = kvh * group + g;
    for (long long i0 = first; i0 < qend; i0 += kTile) {
      __syncthreads();  // the keys are in; the last tile's readers are done
      const int nq = int(min((long long)kTile, s.q_len - i0));
      auto query_row = [&](int r) { return (((long long)b * s.q_len + i0 + r) * s.q_heads + h) * d; };
      load_rows(qs, kTile, dp, d, nq, q, query_row);
      load_rows(dos, kTile, dp, d, nq, dout, query_row);
      for (int t = threadIdx.x; t < kTile; t += blockDim.x) {
        const long long stat = ((long long)b * s.q_heads + h) * s.q_len + i0 + t;
        ls[t] = t < nq ? lse[stat] : -INFINITY;
        ds[t] = t < nq ? delta[stat] : 0.f;
      }
      __syncthreads();
      // Query i0 + lane against the warp's keys: scores and dO . V, each query element once.
      float sc[R], dpv[R];
#pragma unroll
      for (int r = 0; r < R; ++r) sc[r] = dpv[r] = 0.f;
      const float* qr = qs + lane * dp;
      const float* dr = dos + lane * dp;
      for (int c = 0; c < d; ++c) {
        const float qc = qr[c], dc = dr[c];
#pragma unroll
        for (int r = 0; r < R; ++r) sc[r] += qc * kw[r * d + c], dpv[r] += dc * vw[r * d + c];
      }
      const long long i = i0 + lane;
      const float L = ls[lane], delta_i = ds[lane];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float p = visible(s, i, j0 + warp * R + r) && L != -INFINITY ? __expf(sc[r] * s.scale - L) : 0.f;
        pwarp[r * kTile + lane] = p;
        gwarp[r * kTile + lane] = p * (dpv[r] - delta_i) * s.scale;
      }
      __syncwarp();
      // dV += P^T dO and dK += dS^T Q: each query element once, every key's weight beside it.
      for (int ii = 0; ii < kTile; ++ii) {
        float p[R], gs[R];
#pragma unroll
        for (int r = 0; r < R; ++r) p[r] = pwarp[r * kTile + ii], gs[r] = gwarp[r * kTile + ii];
        const float* dri = dos + ii * dp;
        const float* qri = qs + ii * dp;
#pragma unroll
        for (int a = 0; a < DL; ++a) {
          const int c = lane + kWarp * a;
          const float dc = c < d ? dri[c] : 0.f, qc = c < d ? qri[c] : 0.f;
#pragma unroll
          for (int r = 0; r < R; ++r) gv[r][a] += p[r] * dc, gk[r][a] += gs[r] * qc;
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (warp * R + r >= nk) continue;
    const long long o = key_row(warp * R + r);
#pragma unroll
    for (int a = 0; a < DL; ++a) {
      const int c = lane + kWarp * a;
      if (c < d) store(dk, o + c, gk[r][a]), store(dv, o + c, gv[r][a]);
    }
  }
}

// dQ of the block's queries: warp w owns query rows i0 + w R .. + R; lane l takes key l of each streamed tile.
template <typename T, int DL, int R>
__global__ void tiled_dq_kernel(const T* q, const T* k, const T* v, const T* dout, const float* lse, const float* delta,
                                T* dq, AttnShape s) {
  extern __shared__ float smem[];
  constexpr int BR = kWarps * R;
  const int d = s.d, dp = d + 1;
  float* qs = smem;             // [BR][d]     the block's queries (unscaled)
  float* dos = qs + BR * d;     // [BR][d]     and their output gradients
  float* ks = dos + BR * d;     // [kTile][dp] the tile's keys
  float* vs = ks + kTile * dp;  // [kTile][dp] and values
  float* gw = vs + kTile * dp;  // [kWarps][R][kTile] dS (scale folded in)
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const long long i0 = (long long)blockIdx.x * BR;
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / (s.q_heads / s.kv_heads);
  const int nq = int(min((long long)BR, s.q_len - i0));
  auto query_row = [&](int r) { return (((long long)b * s.q_len + i0 + r) * s.q_heads + h) * d; };
  load_rows(qs, BR, d, d, nq, q, query_row);
  load_rows(dos, BR, d, d, nq, dout, query_row);
  float L[R], dl[R], gq[R][DL];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int rr = warp * R + r;
    const long long stat = ((long long)b * s.q_heads + h) * s.q_len + i0 + rr;
    L[r] = rr < nq ? lse[stat] : -INFINITY;
    dl[r] = rr < nq ? delta[stat] : 0.f;
#pragma unroll
    for (int a = 0; a < DL; ++a) gq[r][a] = 0.f;
  }
  const long long kend = s.causal ? min((long long)s.kv_len, i0 + nq - 1 + s.off + 1) : s.kv_len;
  const float* qw = qs + warp * R * d;  // the warp's rows
  const float* dw = dos + warp * R * d;
  float* gwarp = gw + warp * R * kTile;
  for (long long j0 = first_key_tile(s, i0, kTile); j0 < kend; j0 += kTile) {
    __syncthreads();  // the queries are in; the last tile's readers are done
    const int nk = int(min((long long)kTile, s.kv_len - j0));
    auto key_row = [&](int r) { return (((long long)b * s.kv_len + j0 + r) * s.kv_heads + kvh) * d; };
    load_rows(ks, kTile, dp, d, nk, k, key_row);
    load_rows(vs, kTile, dp, d, nk, v, key_row);
    __syncthreads();
    // The warp's rows against key j0 + lane: scores and dO . V, each key element once.
    float sc[R], dpv[R];
#pragma unroll
    for (int r = 0; r < R; ++r) sc[r] = dpv[r] = 0.f;
    const float* kr = ks + lane * dp;
    const float* vr = vs + lane * dp;
    for (int c = 0; c < d; ++c) {
      const float kc = kr[c], vc = vr[c];
#pragma unroll
      for (int r = 0; r < R; ++r) sc[r] += qw[r * d + c] * kc, dpv[r] += dw[r * d + c] * vc;
    }
    const long long j = j0 + lane;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float p = visible(s, i0 + warp * R + r, j) && L[r] != -INFINITY ? __expf(sc[r] * s.scale - L[r]) : 0.f;
      gwarp[r * kTile + lane] = p * (dpv[r] - dl[r]) * s.scale;
    }
    __syncwarp();
    // dQ += dS K: each key element once, every row's weight beside it.
    for (int jj = 0; jj < kTile; ++jj) {
      float gs[R];
#pragma unroll
      for (int r = 0; r < R; ++r) gs[r] = gwarp[r * kTile + jj];
      const float* krj = ks + jj * dp;
#pragma unroll
      for (int a = 0; a < DL; ++a) {
        const int c = lane + kWarp * a;
        const float kc = c < d ? krj[c] : 0.f;
#pragma unroll
        for (int r = 0; r < R; ++r) gq[r][a] += gs[r] * kc;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (warp * R + r >= nq) continue;
    const long long o = query_row(warp * R + r);
#pragma unroll
    for (int a = 0; a < DL; ++a) {
      const int c = lane + kWarp * a;
      if (c < d) store(dq, o + c, gq[r][a]);
    }
  }
}

// ---- The per-row kernel (queries against a KV cache) ----

constexpr int kRowThreads = 128;
constexpr int kKeyTile = 256;  // scores held in shared memory per tile
constexpr int kDimsPerThread = kMaxHeadDim / kRowThreads;

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
__global__ void cached_kernel(const T* q, const T* k, const T* v, T* out, float* lse, const long long* past, int q_len,
                              int kv_len, int q_heads, int kv_heads, int d, float scale, long long window) {
  __shared__ float qs[kMaxHeadDim];
  __shared__ float sc[kKeyTile];
  __shared__ float scratch[kRowThreads];
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, kvh = h / (q_heads / kv_heads);
  const int kend = int(min((long long)kv_len, past[b] + i + 1));
  // A sliding window's first key, never past kend (so never wrapped below 0 by the narrowing, whatever `past` holds).
  const int kbegin = window > 0 ? int(min((long long)kend, max(0LL, past[b] + i + 1 - window))) : 0;
  const long long q_row = (((long long)b * q_len + i) * q_heads + h) * d;
  for (int c = threadIdx.x; c < d; c += blockDim.x) qs[c] = load(q, q_row + c) * scale;
  __syncthreads();
  float m = -INFINITY, l = 0.f, acc[kDimsPerThread];
  for (int a = 0; a < kDimsPerThread; ++a) acc[a] = 0.f;
  for (int j0 = kbegin; j0 < kend; j0 += kKeyTile) {
    const int n = min(kKeyTile, kend - j0);
    float mt = -INFINITY;
    int nan = 0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      const long long k_row = (((long long)b * kv_len + j0 + j) * kv_heads + kvh) * d;
      float s = 0.f;
      for (int c = 0; c < d; ++c) s += qs[c] * load(k, k_row + c);
      sc[j] = s;
      mt = fmaxf(mt, s);
      nan |= s != s;
    }
    const bool any_nan = __syncthreads_or(nan) || m != m;
    const float m_new = any_nan ? NAN : fmaxf(m, block_reduce(mt, scratch, 0));
    const float alpha = m == -INFINITY ? 0.f : __expf(m - m_new);
    float st = 0.f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) st += (sc[j] = m_new == -INFINITY ? 0.f : __expf(sc[j] - m_new));
    l = l * alpha + block_reduce(st, scratch, 1);  // also orders the writes of sc before the reads below
    for (int a = 0, c = threadIdx.x; a < kDimsPerThread && c < d; ++a, c += blockDim.x) {
      float x = acc[a] * alpha;
      for (int j = 0; j < n; ++j) x += sc[j] * load(v, (((long long)b * kv_len + j0 + j) * kv_heads + kvh) * d + c);
      acc[a] = x;
    }
    m = m_new;
    __syncthreads();  // the next tile overwrites sc
  }
  const bool nan = l != l;
  const float inv = l > 0.f || nan ? 1.f / l : 0.f;
  for (int a = 0, c = threadIdx.x; a < kDimsPerThread && c < d; ++a, c += blockDim.x)
    store(out, q_row + c, acc[a] * inv);
  if (threadIdx.x == 0) lse[((long long)b * q_heads + h) * q_len + i] = nan ? NAN : l > 0.f ? m + logf(l) : -INFINITY;
}

// ---- Launching ----

// Dims per lane for a head dim (1, 2, 4 or 8).
int dims_per_lane(int64_t d) {
  return d <= 32 ? 1 : d <= 64 ? 2 : d <= 128 ? 4 : 8;
}

// A kernel that takes `bytes` of dynamic shared memory: beyond 48 KiB it needs the opt-in, once per kernel, device
// and size.
template <typename... Params>
void allow_shared(void (*kernel)(Params...), std::size_t bytes) {
  if (bytes <= (std::size_t(48) << 10)) return;
  static std::mutex mu;
  static std::set<std::tuple<const void*, int, std::size_t>> done;
  int device = 0;
  HR_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  if (!done.insert({reinterpret_cast<const void*>(kernel), device, bytes}).second) return;
  HR_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// Calls f(std::integral_constant<int, DL>) for the head dim's dims per lane.
template <typename F>
void by_dims(int64_t d, F&& f) {
  switch (dims_per_lane(d)) {
    case 1:
      f(std::integral_constant<int, 1>{});
      return;
    case 2:
      f(std::integral_constant<int, 2>{});
      return;
    case 4:
      f(std::integral_constant<int, 4>{});
      return;
    default:
      f(std::integral_constant<int, 8>{});
      return;
  }
}

void check_head_dim(const char* op, const AttentionDesc& s) {
  HR_CHECK(s.head_dim >= 1 && s.head_dim <= kMaxHeadDim, "[", op, "] head_dim ", s.head_dim,
           " is outside the CUDA kernels' 1 to ", kMaxHeadDim);
}

void tiled_forward(const AttentionArgs& a) {
  const AttentionDesc& s = a.desc;
  const AttnShape shape = shape_of(a);
  dispatch_float(s.dtype, "attention", [&](auto tag) {
    using T = decltype(tag);
    by_dims(s.head_dim, [&](auto dl) {
      constexpr int DL = decltype(dl)::value, R = forward_rows(DL);
      const std::size_t bytes = forward_floats(int(s.head_dim), R) * sizeof(float);
      allow_shared(tiled_forward_kernel<T, DL, R>, bytes);
      launch_kernel(checked_grid("attention", blocks_of(s.q_len, kWarps * R), s.q_heads, s.batch), dim3(kTiledThreads),
                    bytes, tiled_forward_kernel<T, DL, R>, a.q.data<T>(), a.k.data<T>(), a.v.data<T>(), a.out.data<T>(),
                    a.lse.data<float>(), shape);
    });
  });
  note_attention_kernel(AttentionKernel::Tiled);
}

void cached_forward(const AttentionArgs& a) {
  const AttentionDesc& s = a.desc;
  dispatch_float(s.dtype, "attention_cached", [&](auto tag) {
    using T = decltype(tag);
    launch_kernel(checked_grid("attention_cached", s.q_len, s.q_heads, s.batch), dim3(kRowThreads), 0, cached_kernel<T>,
                  a.q.data<T>(), a.k.data<T>(), a.v.data<T>(), a.out.data<T>(), a.lse.data<float>(),
                  a.past.data<long long>(), int(s.q_len), int(s.kv_len), int(s.q_heads), int(s.kv_heads),
                  int(s.head_dim), a.scale, (long long)s.applied_window());
  });
  note_attention_kernel(AttentionKernel::Rows);
}

}  // namespace

void attention_forward(const AttentionArgs& a) {
  const AttentionDesc& s = a.desc;
  check_head_dim(a.past.defined() ? "attention_cached" : "attention", s);
  if (s.batch == 0 || s.q_len == 0 || s.q_heads == 0) return;
  if (cudnn_attention_forward(a)) return;  // notes its own kernel
  if (a.past.defined())
    cached_forward(a);
  else
    tiled_forward(a);
}

void attention_backward(const AttentionArgs& a) {
  const AttentionDesc& s = a.desc;
  check_head_dim("attention_backward", s);
  if (s.batch == 0 || s.q_heads == 0 || (s.q_len == 0 && s.kv_len == 0)) return;
  if (cudnn_attention_backward(a)) return;
  const AttnShape shape = shape_of(a);
  const long long rows = s.batch * s.q_len * s.q_heads;
  // sizing.cpp: (batch, q_heads, q_len) f32; none without queries (then dK = dV = 0 and delta is never read).
  float* delta = rows > 0 ? static_cast<float*>(a.workspace.data_ptr()) : nullptr;
  dispatch_float(s.dtype, "attention_backward", [&](auto tag) {
    using T = decltype(tag);
    launch_elements("attention_backward", rows, attention_delta_kernel<T>, a.dout.data<T>(), a.out.data<T>(), delta,
                    rows, int(s.q_len), int(s.q_heads), int(s.head_dim));
    by_dims(s.head_dim, [&](auto dl) {
      constexpr int DL = decltype(dl)::value, R = backward_rows(DL);
      const int d = int(s.head_dim);
      if (s.kv_len > 0) {
        const std::size_t bytes = dkv_floats(d, R) * sizeof(float);
        allow_shared(tiled_dkv_kernel<T, DL, R>, bytes);
        launch_kernel(checked_grid("attention_backward", blocks_of(s.kv_len, kWarps * R), s.kv_heads, s.batch),
                      dim3(kTiledThreads), bytes, tiled_dkv_kernel<T, DL, R>, a.q.data<T>(), a.k.data<T>(),
                      a.v.data<T>(), a.dout.data<T>(), a.lse.data<float>(), delta, a.dk.data<T>(), a.dv.data<T>(),
                      shape);
      }
      if (s.q_len > 0) {
        const std::size_t bytes = dq_floats(d, R) * sizeof(float);
        allow_shared(tiled_dq_kernel<T, DL, R>, bytes);
        launch_kernel(checked_grid("attention_backward", blocks_of(s.q_len, kWarps * R), s.q_heads, s.batch),
                      dim3(kTiledThreads), bytes, tiled_dq_kernel<T, DL, R>, a.q.data<T>(), a.k.data<T>(),
                      a.v.data<T>(), a.dout.data<T>(), a.lse.data<float>(), delta, a.dq.data<T>(), shape);
      }
    });
  });
  note_attention_kernel(AttentionKernel::Tiled);
}

}  // namespace hr::cuda
