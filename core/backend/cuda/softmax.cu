// CUDA softmax over the last dim (one block per row) and rotary position embedding (one thread per rotated
// pair; with a table and a half head dim of whole packs, one thread per pack of pairs): the twins of
// backend/cpu/softmax.cpp. RoPE's angles are taken in double, as the CPU takes them, so long positions rotate alike on
// both.
#include "core/backend/cuda/cuda_common.h"
#include "core/backend/cuda/cuda_kernels.h"
#include "core/backend/cuda/device/dtype.cuh"
#include "core/backend/cuda/device/pack.cuh"
#include "core/backend/cuda/device/reduce.cuh"
#include "core/backend/cuda/first_index.cuh"
#include "core/backend/cuda/launch.cuh"

namespace hr::cuda {

namespace {

using device::block_max;
using device::block_sum;
using device::kPack;
using device::load;
using device::load_pack;
using device::store;
using device::store_pack;

constexpr int kRowThreads = 256;

template <typename T>
__global__ void softmax_kernel(const T* x, T* y, long long cols) {
  __shared__ float scratch[device::kWarp];
  const T* xr = x + (long long)blockIdx.x * cols;
  T* yr = y + (long long)blockIdx.x * cols;
  float mx = -INFINITY;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) mx = fmaxf(mx, load(xr, c));
  mx = block_max(mx, scratch);
  float s = 0.f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) s += expf(load(xr, c) - mx);
  const float inv = 1.f / block_sum(s, scratch);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) store(yr, c, expf(load(xr, c) - mx) * inv);
}

template <typename T>
__global__ void softmax_backward_kernel(const T* y, const T* dy, T* dx, long long cols) {
  __shared__ float scratch[device::kWarp];
  const long long o = (long long)blockIdx.x * cols;
  float dot = 0.f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) dot += load(y, o + c) * load(dy, o + c);
  dot = block_sum(dot, scratch);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) store(dx, o + c, load(y, o + c) * (load(dy, o + c) - dot));
}

// (x1 c - x2 s, x2 c + x1 s) with every product and sum rounded on its own (no FMA), as the CPU twin computes it:
// the per-pair and the packed kernels give the same bits, and the same as the CPU's from the same table.
__device__ __forceinline__ void rotate(float x1, float x2, float c, float s, float& y1, float& y2) {
  y1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
  y2 = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

// Thread t rotates the pair (i, i + half) of one head of one position, by angles computed here or read from the
// table (per token a row of cosines, then one of sines: rope_table_kernel's output).
template <typename T, typename I>
__global__ void rope_kernel(const T* x, const I* pos, const float* table, T* out, long long pairs, long long heads,
                            long long hd, double theta, float sign) {
  const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= pairs) return;
  const long long half = hd / 2, i = t % half, bsh = t / half, bs = bsh / heads;
  float c, s;
  if (table) {
    c = table[bs * hd + i];
    s = sign * table[bs * hd + half + i];
  } else {
    const double ang = double(pos[bs]) * pow(theta, -2.0 * double(i) / double(hd));
    c = float(cos(ang));
    s = sign * float(sin(ang));
  }
  const long long o = bsh * hd;
  float y1, y2;
  rotate(load(x, o + i), load(x, o + i + half), c, s, y1, y2);
  store(out, o + i, y1);
  store(out, o + i + half, y2);
}

// Thread t rotates kPack pairs (i .. i + kPack - 1, i + half ..) of one head of one position by the table: the
// table path of rope_kernel, the same rotation per pair, for a half head dim that is whole packs and x and
// out 16-byte aligned (so every pack is).
template <typename T>
__global__ void rope_packs_kernel(const T* x, const float* table, T* out, long long packs, long long heads,
                                  long long hd, float sign) {
  constexpr int K = kPack<T>;
  const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= packs) return;
  const long long half = hd / 2, per_head = half / K, i = (t % per_head) * K, bsh = t / per_head, bs = bsh / heads;
  const long long o = bsh * hd;
  const float* cos_row = table + bs * hd + i;
  const float* sin_row = cos_row + half;
  float x1[K], x2[K], y1[K], y2[K];
  load_pack(x, o + i, 0, true, x1);
  load_pack(x, o + i + half, 0, true, x2);
#pragma unroll
  for (int k = 0; k < K; ++k) rotate(x1[k], x2[k], cos_row[k], sign * sin_row[k], y1[k], y2[k]);
  store_pack(out, o + i, 0, true, y1);
  store_pack(out, o + i + half, 0, true, y2);
}

// Thread t writes pair i of token bs's table: the angle's cos and sin as rope_kernel computes them.
template <typename I>
__global__ void rope_table_kernel(const I* pos, float* table, long long entries, long long half, double theta) {
  const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= entries) return;
  const long long i = t % half, bs = t / half;
  const double ang = double(pos[bs]) * pow(theta, -2.0 * double(i) / double(2 * half));
  table[bs * 2 * half + i] = float(cos(ang));
  table[bs * 2 * half + half + i] = float(sin(ang));
}

}  // namespace

void softmax_forward(const Tensor& x, const Tensor& y) {
  const int64_t cols = x.dim() ? x.size(-1) : 1, rows = cols ? x.numel() / cols : 0;
  if (rows == 0) return;
  dispatch_float(x.dtype(), "softmax", [&](auto tag) {
    using T = decltype(tag);
    launch_rows("softmax", rows, kRowThreads, softmax_kernel<T>, x.data<T>(), y.data<T>(), cols);
  });
}

void softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  const int64_t cols = y.dim() ? y.size(-1) : 1, rows = cols ? y.numel() / cols : 0;
  if (rows == 0) return;
  dispatch_float(y.dtype(), "softmax_backward", [&](auto tag) {
    using T = decltype(tag);
    launch_rows("softmax_backward", rows, kRowThreads, softmax_backward_kernel<T>, y.data<T>(), dy.data<T>(),
                dx.data<T>(), cols);
  });
}

void rope(const RopeArgs& a) {
  const int64_t heads = a.x.size(2), hd = a.x.size(3), pairs = a.x.numel() / 2;
  if (pairs == 0) return;
  const float* table = a.table.defined() ? a.table.data<float>() : nullptr;
  dispatch_float(a.x.dtype(), "rope", [&](auto tag) {
    using T = decltype(tag);
    constexpr int K = kPack<T>;
    if (table && (hd / 2) % K == 0 && aligned16(a.x.data<T>(), a.out.data<T>())) {
      const int64_t packs = pairs / K;
      launch_kernel(checked_grid("rope", blocks_of(packs, kThreads)), dim3(kThreads), 0, rope_packs_kernel<T>,
                    a.x.data<T>(), table, a.out.data<T>(), packs, heads, hd, a.inverse ? -1.f : 1.f);
      return;
    }
    if (table) {
      launch_elements("rope", pairs, rope_kernel<T, int64_t>, a.x.data<T>(), nullptr, table, a.out.data<T>(), pairs,
                      heads, hd, 0.0, a.inverse ? -1.f : 1.f);
      return;
    }
    dispatch_index(a.positions.dtype(), "rope", [&](auto itag) {
      using I = decltype(itag);
      launch_elements("rope", pairs, rope_kernel<T, I>, a.x.data<T>(), a.positions.data<I>(), table, a.out.data<T>(),
                      pairs, heads, hd, double(a.theta), a.inverse ? -1.f : 1.f);
    });
  });
}

void rope_table(const RopeArgs& a) {
  const int64_t half = a.out.size(-1), entries = a.positions.numel() * half;
  if (entries == 0) return;
  dispatch_index(a.positions.dtype(), "rope_table", [&](auto itag) {
    using I = decltype(itag);
    launch_elements("rope_table", entries, rope_table_kernel<I>, a.positions.data<I>(), a.out.data<float>(), entries,
                    half, double(a.theta));
  });
}

}  // namespace hr::cuda
