// CUDA layer norm and RMS norm, forward and backward: the twins of backend/cpu/norm.cpp. One block per row with
// f32 statistics (and the fused residual add, forward and backward); the weight and bias gradients are column sums in a
// fixed order (column_sums.cuh: stretches of rows into partials in the workspace, then each column's partials in
// order), so the result does not depend on scheduling.
// A row that is a whole number of 16-byte packs (pack.cuh) with every tensor aligned, and at most kMaxRowPacks packs
// a thread, is held in registers: each thread reads its packs of x (and of the residual, or of dy and the residual's
// gradient) once with 16-byte loads and writes its packs of the output (and of the residual sum) once, where the
// general kernels read a row two or three times an element at a time. The arithmetic per element is the general
// kernels'; the statistics sum each thread's columns in another order, so the two paths' statistics agree to f32
// rounding and their stored bf16 / f16 outputs can differ by one unit in the last place. Which path a row takes
// depends on its length and its tensors' alignment (the allocators align every block to 512 bytes).
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "core/backend/cuda/column_sums.cuh"
#include "core/backend/cuda/cuda_common.h"
#include "core/backend/cuda/cuda_kernels.h"
#include "core/backend/cuda/device/dtype.cuh"
#include "core/backend/cuda/device/pack.cuh"
#include "core/backend/cuda/device/reduce.cuh"

namespace hr::cuda {

namespace {

using device::block_sum;
using device::load;
using device::store;

constexpr int kRowThreads = 256;

// With `res`, x += res first (each thread its own columns, which it alone reads back): the fused residual add.
template <typename T, typename W>
__global__ void norm_forward_kernel(const T* x, const T* res, const W* w, const W* b, T* y, float* mean, float* rstd,
                                    long long cols, float eps, bool ln) {
  __shared__ float scratch[device::kWarp];
  const long long row = blockIdx.x;
  const T* xr = x + row * cols;
  T* yr = y + row * cols;
  if (res) {
    T* sum = const_cast<T*>(xr);
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) store(sum, c, load(xr, c) + load(res + row * cols, c));
  }
  float m = 0.f;
  if (ln) {
    float s = 0.f;
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) s += load(xr, c);
    m = block_sum(s, scratch) / float(cols);
  }
  float v = 0.f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
    const float d = load(xr, c) - m;
    v += d * d;
  }
  const float rs = 1.f / sqrtf(block_sum(v, scratch) / float(cols) + eps);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x)
    store(yr, c, (load(xr, c) - m) * rs * load(w, c) + (b ? load(b, c) : 0.f));
  if (threadIdx.x == 0) {
    if (ln) mean[row] = m;
    rstd[row] = rs;
  }
}

// The first element of this thread's q-th pack of a row held in registers, or -1 past the row's end (the packed
// kernels' rows are whole packs).
template <int P>
__device__ __forceinline__ long long row_pack(int q, long long cols) {
  const long long i = (threadIdx.x + (long long)q * blockDim.x) * P;
  return i < cols ? i : -1;
}

// The packed forward: block threads cover the row's packs, NP packs a thread (blockDim.x * NP >= cols / kPack).
template <typename T, typename W, int NP>
__global__ void norm_forward_packed_kernel(T* x, const T* res, const W* w, const W* b, T* y, float* mean, float* rstd,
                                           long long cols, float eps, bool ln) {
  constexpr int P = device::kPack<T>;
  __shared__ float scratch[device::kWarp];
  const long long row = blockIdx.x;
  T* xr = x + row * cols;
  float v[NP][P];
  float s = 0.f;
#pragma unroll
  for (int q = 0; q < NP; ++q) {
    const long long i = row_pack<P>(q, cols);
#pragma unroll
    for (int k = 0; k < P; ++k) v[q][k] = 0.f;
    if (i < 0) continue;
    device::load_pack(xr, i, cols, true, v[q]);
    if (res) {  // the sum as stored, rounded to T, is what the norm reads
      float r[P];
      device::load_pack(res + row * cols, i, cols, true, r);
#pragma unroll
      for (int k = 0; k < P; ++k) v[q][k] = device::round_as<T>(v[q][k] + r[k]);
      device::store_pack(xr, i, cols, true, v[q]);
    }
#pragma unroll
    for (int k = 0; k < P; ++k) s += v[q][k];
  }
  const float m = ln ? block_sum(s, scratch) / float(cols) : 0.f;
  float var = 0.f;
#pragma unroll
  for (int q = 0; q < NP; ++q) {
    const long long i = row_pack<P>(q, cols);
    if (i < 0) continue;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const float d = v[q][k] - m;
      var += d * d;
    }
  }
  const float rs = 1.f / sqrtf(block_sum(var, scratch) / float(cols) + eps);
#pragma unroll
  for (int q = 0; q < NP; ++q) {
    const long long i = row_pack<P>(q, cols);
    if (i < 0) continue;
    float o[P];
#pragma unroll
    for (int k = 0; k < P; ++k) o[k] = (v[q][k] - m) * rs * load(w, i + k) + (b ? load(b, i + k) : 0.f);
    device::store_pack(y + row * cols, i, cols, true, o);
  }
  if (threadIdx.x == 0) {
    if (ln) mean[row] = m;
    rstd[row] = rs;
  }
}

// dx = rs * (dy w - mean(dy w) - xhat mean(dy w xhat)), the mean(dy w) term for layer norm only; plus dres, the
// residual stream's gradient, onto dx as stored.
template <typename T, typename W>
__global__ void norm_dx_kernel(const T* x, const T* dy, const W* w, const float* mean, const float* rstd, const T* dres,
                               T* dx, long long cols, bool ln) {
  __shared__ float scratch[device::kWarp];
  const long long row = blockIdx.x;
  const T* xr = x + row * cols;
  const T* dyr = dy + row * cols;
  const float m = ln ? mean[row] : 0.f, rs = rstd[row];
  float s1 = 0.f, s2 = 0.f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
    const float dxh = load(dyr, c) * load(w, c);
    s1 += dxh;
    s2 += dxh * (load(xr, c) - m) * rs;
  }
  const float m1 = ln ? block_sum(s1, scratch) / float(cols) : 0.f;
  const float m2 = block_sum(s2, scratch) / float(cols);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
    const float xh = (load(xr, c) - m) * rs;
    store(dx + row * cols, c, rs * (load(dyr, c) * load(w, c) - m1 - xh * m2));
    // __fadd_rn: never merged with the product above into one FMA, so f32 rounds twice, as the add_ beside it does
    if (dres) store(dx + row * cols, c, __fadd_rn(load(dx + row * cols, c), load(dres + row * cols, c)));
  }
}

// The packed dx: norm_dx_kernel's arithmetic over rows held in registers.
template <typename T, typename W, int NP>
__global__ void norm_dx_packed_kernel(const T* x, const T* dy, const W* w, const float* mean, const float* rstd,
                                      const T* dres, T* dx, long long cols, bool ln) {
  constexpr int P = device::kPack<T>;
  __shared__ float scratch[device::kWarp];
  const long long row = blockIdx.x;
  const float m = ln ? mean[row] : 0.f, rs = rstd[row];
  float xv[NP][P], gv[NP][P];
  float s1 = 0.f, s2 = 0.f;
#pragma unroll
  for (int q = 0; q < NP; ++q) {
    const long long i = row_pack<P>(q, cols);
    if (i < 0) continue;
    device::load_pack(x + row * cols, i, cols, true, xv[q]);
    device::load_pack(dy + row * cols, i, cols, true, gv[q]);
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const float dxh = gv[q][k] * load(w, i + k);
      s1 += dxh;
      s2 += dxh * (xv[q][k] - m) * rs;
    }
  }
  const float m1 = ln ? block_sum(s1, scratch) / float(cols) : 0.f;
  const float m2 = block_sum(s2, scratch) / float(cols);
#pragma unroll
  for (int q = 0; q < NP; ++q) {
    const long long i = row_pack<P>(q, cols);
    if (i < 0) continue;
    float o[P];
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const float xh = (xv[q][k] - m) * rs;
      o[k] = device::round_as<T>(rs * (gv[q][k] * load(w, i + k) - m1 - xh * m2));
    }
    if (dres) {  // onto dx as stored, rounded twice like norm_dx_kernel
      float r[P];
      device::load_pack(dres + row * cols, i, cols, true, r);
#pragma unroll
      for (int k = 0; k < P; ++k) o[k] = __fadd_rn(o[k], r[k]);
    }
    device::store_pack(dx + row * cols, i, cols, true, o);
  }
}

// Threads a block and packs a thread for a row of `cols` elements of T held in registers, or {0, 0} where the row
// takes the general kernels (not whole packs, a tensor not 16-byte aligned, or more than kMaxRowPacks packs a thread).
constexpr int kMaxRowPacks = 4;
struct RowPacks {
  int threads = 0, per_thread = 0;
};
template <typename T>
RowPacks row_packs(long long cols, std::initializer_list<const void*> tensors) {
  constexpr int P = device::kPack<T>;
  if (cols <= 0 || cols % P != 0) return {};
  for (const void* t : tensors)
    if (t && reinterpret_cast<std::uintptr_t>(t) % 16 != 0) return {};
  const long long packs = cols / P;
  const int threads =
      int(std::min<long long>(kRowThreads, (packs + device::kWarp - 1) / device::kWarp * device::kWarp));
  const long long per = (packs + threads - 1) / threads;
  if (per > kMaxRowPacks) return {};
  return {threads, per == 1 ? 1 : per == 2 ? 2 : 4};
}

// Calls f(std::integral_constant<int, NP>) for the packs a thread, 1, 2 or 4.
template <typename F>
void with_row_packs(int per_thread, F&& f) {
  if (per_thread == 1)
    f(std::integral_constant<int, 1>{});
  else if (per_thread == 2)
    f(std::integral_constant<int, 2>{});
  else
    f(std::integral_constant<int, 4>{});
}

// The weight gradient (sum of dy * xhat) and the bias gradient (sum of dy) of each column, as partials per stretch
// of rows (column_sums.cuh).
template <typename T>
__global__ void norm_partials_kernel(const T* x, const T* dy, const float* mean, const float* rstd, double* partial,
                                     long long rows, long long cols, ColumnSplit split, bool ln) {
  column_partials<2>(rows, cols, split, partial, [&](long long r, long long c, double* s) {
    const float g = load(dy, r * cols + c);
    s[0] += g * (load(x, r * cols + c) - (ln ? mean[r] : 0.f)) * rstd[r];
    s[1] += g;
  });
}

template <typename O>
__global__ void norm_totals_kernel(const double* partial, O* out, long long partials, long long cols, int which,
                                   bool accumulate) {
  const long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const double t = column_total<2>(partial, partials, cols, c, which);
  store(out, c, (accumulate ? load(out, c) : 0.f) + float(t));
}

}  // namespace

void norm_forward(const NormArgs& a) {
  const int64_t rows = a.x.size(0), cols = a.x.size(1);
  const bool ln = a.kind == NormKind::LayerNorm;
  dispatch_float(a.x.dtype(), "norm", [&](auto tag) {
    using T = decltype(tag);
    dispatch_float(a.weight.dtype(), "norm", [&](auto wtag) {
      using W = decltype(wtag);
      const T* res = a.residual.defined() ? a.residual.data<T>() : nullptr;
      const RowPacks rp = row_packs<T>(cols, {a.x.data_ptr(), res, a.y.data_ptr()});
      if (rp.threads > 0) {
        with_row_packs(rp.per_thread, [&](auto np) {
          launch_rows("norm", rows, rp.threads, norm_forward_packed_kernel<T, W, decltype(np)::value>, a.x.data<T>(),
                      res, a.weight.data<W>(), a.bias.defined() ? a.bias.data<W>() : nullptr, a.y.data<T>(),
                      ln ? a.mean.data<float>() : nullptr, a.rstd.data<float>(), cols, a.eps, ln);
        });
        return;
      }
      launch_rows("norm", rows, kRowThreads, norm_forward_kernel<T, W>, a.x.data<T>(), res, a.weight.data<W>(),
                  a.bias.defined() ? a.bias.data<W>() : nullptr, a.y.data<T>(), ln ? a.mean.data<float>() : nullptr,
                  a.rstd.data<float>(), cols, a.eps, ln);
    });
  });
}

void norm_backward(const NormArgs& a) {
  const int64_t rows = a.x.size(0), cols = a.x.size(1);
  const bool ln = a.kind == NormKind::LayerNorm;
  const float* mean = ln ? a.mean.data<float>() : nullptr;
  const float* rstd = a.rstd.data<float>();
  dispatch_float(a.x.dtype(), "norm_backward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_float(a.weight.dtype(), "norm_backward", [&](auto wtag) {
      using W = decltype(wtag);
      const T* dres = a.dresidual.defined() ? a.dresidual.data<T>() : nullptr;
      const RowPacks rp = row_packs<T>(cols, {a.x.data_ptr(), a.dy.data_ptr(), dres, a.dx.data_ptr()});
      if (rp.threads > 0) {
        with_row_packs(rp.per_thread, [&](auto np) {
          launch_rows("norm_backward", rows, rp.threads, norm_dx_packed_kernel<T, W, decltype(np)::value>,
                      a.x.data<T>(), a.dy.data<T>(), a.weight.data<W>(), mean, rstd, dres, a.dx.data<T>(), cols, ln);
        });
        return;
      }
      launch_rows("norm_backward", rows, kRowThreads, norm_dx_kernel<T, W>, a.x.data<T>(), a.dy.data<T>(),
                  a.weight.data<W>(), mean, rstd, dres, a.dx.data<T>(), cols, ln);
    });
    if (!a.dweight.defined() || cols == 0) return;
    const ColumnSplit split = column_split(rows, cols);
    HR_CHECK(a.workspace.nbytes() >= column_sums_workspace_bytes(rows, cols, 2),
             "[norm_backward] the workspace is smaller than its sizing rule");
    double* partial = static_cast<double*>(a.workspace.data_ptr());
    launch_kernel(column_partials_grid("norm_backward", split), column_partials_block(), 0, norm_partials_kernel<T>,
                  a.x.data<T>(), a.dy.data<T>(), mean, rstd, partial, rows, cols, split, ln);
    const bool acc = a.accumulate == Accumulate::Yes;
    auto finish = [&](const Tensor& out, int which) {
      dispatch_float(out.dtype(), "norm_backward", [&](auto otag) {
        using O = decltype(otag);
        launch_elements("norm_backward", cols, norm_totals_kernel<O>, partial, out.data<O>(), split.partials, cols,
                        which, acc);
      });
    };
    finish(a.dweight, 0);
    if (a.dbias.defined()) finish(a.dbias, 1);
  });
}

}  // namespace hr::cuda
