// CUDA layer norm and RMS norm, forward and backward: the twins of backend/cpu/norm.cpp. One block per row with
// f32 statistics; the weight and bias gradients are summed per 32-row partial into the workspace (sizing.cpp),
// then the partials in order per column, so the result does not depend on scheduling.
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
constexpr long long kRowsPerPartial = 32;  // must match sizing.cpp

std::size_t align256(std::size_t n) {
  return (n + 255) / 256 * 256;
}

template <typename T, typename W>
__global__ void norm_forward_kernel(const T* x, const W* w, const W* b, T* y, float* mean, float* rstd, long long cols,
                                    float eps, bool ln) {
  __shared__ float scratch[device::kWarp];
  const long long row = blockIdx.x;
  const T* xr = x + row * cols;
  T* yr = y + row * cols;
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

// dx = rs * (dy w - mean(dy w) - xhat mean(dy w xhat)), the mean(dy w) term for layer norm only.
template <typename T, typename W>
__global__ void norm_dx_kernel(const T* x, const T* dy, const W* w, const float* mean, const float* rstd, T* dx,
                               long long cols, bool ln) {
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
  }
}

// Partial p of column c: the sums of dy xhat and dy over rows [32 p, 32 p + 32).
template <typename T>
__global__ void norm_partials_kernel(const T* x, const T* dy, const float* mean, const float* rstd, float* pw,
                                     float* pb, long long rows, long long cols, bool ln) {
  const long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x, p = blockIdx.y;
  if (c >= cols) return;
  float sw = 0.f, sb = 0.f;
  for (long long r = p * kRowsPerPartial; r < min(rows, (p + 1) * kRowsPerPartial); ++r) {
    const float g = load(dy, r * cols + c);
    sw += g * (load(x, r * cols + c) - (ln ? mean[r] : 0.f)) * rstd[r];
    sb += g;
  }
  pw[p * cols + c] = sw;
  pb[p * cols + c] = sb;
}

template <typename O>
__global__ void sum_partials_kernel(const float* partial, O* out, long long partials, long long cols, bool accumulate) {
  const long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float t = accumulate ? load(out, c) : 0.f;
  for (long long p = 0; p < partials; ++p) t += partial[p * cols + c];
  store(out, c, t);
}

}  // namespace

void norm_forward(const NormArgs& a) {
  const int64_t rows = a.x.size(0), cols = a.x.size(1);
  if (rows == 0) return;
  const bool ln = a.kind == NormKind::LayerNorm;
  dispatch_float(a.x.dtype(), "norm", [&](auto tag) {
    using T = decltype(tag);
    dispatch_float(a.weight.dtype(), "norm", [&](auto wtag) {
      using W = decltype(wtag);
      norm_forward_kernel<<<unsigned(rows), kRowThreads, 0, stream()>>>(
          a.x.data<T>(), a.weight.data<W>(), a.bias.defined() ? a.bias.data<W>() : nullptr, a.y.data<T>(),
          ln ? a.mean.data<float>() : nullptr, a.rstd.data<float>(), cols, a.eps, ln);
    });
  });
  HR_CUDA_CHECK(cudaGetLastError());
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
      if (rows > 0)
        norm_dx_kernel<<<unsigned(rows), kRowThreads, 0, stream()>>>(a.x.data<T>(), a.dy.data<T>(), a.weight.data<W>(),
                                                                     mean, rstd, a.dx.data<T>(), cols, ln);
    });
    if (!a.dweight.defined() || cols == 0) return;
    const long long partials = std::max<long long>(1, (rows + kRowsPerPartial - 1) / kRowsPerPartial);
    float* pw = static_cast<float*>(a.workspace.data_ptr());
    float* pb = reinterpret_cast<float*>(static_cast<char*>(a.workspace.data_ptr()) +
                                         align256(std::size_t(partials * cols) * 4));
    const dim3 grid(blocks_for(cols), unsigned(partials));
    norm_partials_kernel<<<grid, kThreads, 0, stream()>>>(a.x.data<T>(), a.dy.data<T>(), mean, rstd, pw, pb, rows, cols,
                                                          ln);
    const bool acc = a.accumulate == Accumulate::Yes;
    auto finish = [&](const Tensor& out, const float* partial) {
      dispatch_float(out.dtype(), "norm_backward", [&](auto otag) {
        using O = decltype(otag);
        sum_partials_kernel<<<blocks_for(cols), kThreads, 0, stream()>>>(partial, out.data<O>(), partials, cols, acc);
      });
    };
    finish(a.dweight, pw);
    if (a.dbias.defined()) finish(a.dbias, pb);
  });
  HR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hr::cuda
