// CUDA layer norm and RMS norm, forward and backward: the twins of backend/cpu/norm.cpp. One block per row with
// f32 statistics (and the fused residual add, forward and backward); the weight and bias gradients are column sums in a
// fixed order (column_sums.cuh: stretches of rows into partials in the workspace, then each column's partials in
// order), so the result does not depend on scheduling.
#include "core/backend/cuda/column_sums.cuh"
#include "core/backend/cuda/cuda_common.h"
#include "core/backend/cuda/cuda_kernels.h"
#include "core/backend/cuda/device/dtype.cuh"
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
      launch_rows("norm", rows, kRowThreads, norm_forward_kernel<T, W>, a.x.data<T>(),
                  a.residual.defined() ? a.residual.data<T>() : nullptr, a.weight.data<W>(),
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
      launch_rows("norm_backward", rows, kRowThreads, norm_dx_kernel<T, W>, a.x.data<T>(), a.dy.data<T>(),
                  a.weight.data<W>(), mean, rstd, a.dresidual.defined() ? a.dresidual.data<T>() : nullptr,
                  a.dx.data<T>(), cols, ln);
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
