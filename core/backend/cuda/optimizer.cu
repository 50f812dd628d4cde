// CUDA optimizer updates: the twins of backend/cpu/optimizer.cpp, one fused element-wise pass per parameter in
// f32 (AdamW, SGD), and Adafactor's row, column (column_sums.cuh, partials in the workspace) and RMS reductions
// in a fixed order before its update. The scalars
// one pass hands the next (Adafactor's mean row moment and clipping divisor) stay on the device.
#include <cmath>

#include "core/backend/cuda/column_sums.cuh"
#include "core/backend/cuda/cuda_common.h"
#include "core/backend/cuda/cuda_kernels.h"
#include "core/backend/cuda/device/dtype.cuh"
#include "core/backend/cuda/device/partials.cuh"
#include "core/backend/cuda/launch.cuh"
#include "core/backend/dynamic_maps.h"

namespace hr::cuda {

namespace {

using device::load;
using device::store;

// w is the master weight where there is one, else the parameter; the result goes to both.
template <typename P, typename G, typename F>
__device__ __forceinline__ void update_at(long long i, P* p, const G* g, float* master, float grad_scale, F&& f) {
  const float w = master ? master[i] : load(p, i);
  const float updated = f(load(g, i) * grad_scale, w);
  if (master) master[i] = updated;
  store(p, i, updated);
}

template <typename P, typename G>
__global__ void adamw_kernel(P* p, const G* g, float* master, float* m, float* v, long long n, AdamWHyper h,
                             float step_size, float bc2_sqrt, float decay) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  update_at(i, p, g, master, h.grad_scale, [&](float gi, float w) {
    m[i] = h.beta1 * m[i] + (1.f - h.beta1) * gi;
    v[i] = h.beta2 * v[i] + (1.f - h.beta2) * gi * gi;
    return w * decay - step_size * m[i] / (sqrtf(v[i]) / bc2_sqrt + h.eps);
  });
}

// 8-bit AdamW: one block of kAdam8bitBlock threads per quantization block, a thread an element (the twin of the
// CPU's loop over a block). The maps go to shared memory: every thread looks up codes of its own.
__constant__ float c_signed_map[256] = {HR_DYNAMIC_MAP_SIGNED};
__constant__ float c_unsigned_map[256] = {HR_DYNAMIC_MAP_UNSIGNED};

// The index of the map's value nearest to x (the lower one on a tie): the CPU twin's bisection.
__device__ __forceinline__ unsigned char nearest_code(const float* map, float x) {
  const float* b = map;
  for (int n = 256; n > 1;) {
    const int half = n / 2;
    b = b[half] < x ? b + half : b;
    n -= half;
  }
  const int hi = int(b - map) + (*b < x);
  if (hi == 0) return 0;
  if (hi == 256) return 255;
  return (unsigned char)(x - map[hi - 1] <= map[hi] - x ? hi - 1 : hi);
}

__device__ __forceinline__ float block_max(float x, float* scratch) {
  for (int o = 16; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < int(blockDim.x / 32) ? scratch[lane] : 0.f;
  for (int o = 16; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  __syncthreads();
  return x;
}

template <typename P, typename G>
__global__ void adamw8bit_kernel(P* p, const G* g, float* master, unsigned char* mc, float* ma, unsigned char* vc,
                                 float* va, long long n, AdamWHyper h, Adam8bitScalars k) {
  __shared__ float maps[2][256];
  __shared__ float scratch[2][32];
  for (int k = threadIdx.x; k < 256; k += blockDim.x) maps[0][k] = c_signed_map[k], maps[1][k] = c_unsigned_map[k];
  __syncthreads();
  const long long b = blockIdx.x, i = b * kAdam8bitBlock + threadIdx.x;
  const bool valid = i < n;
  float m = 0.f, v = 0.f;
  if (valid) {
    const float gi = load(g, i) * h.grad_scale;
    m = maps[0][mc[i]] * ma[b] * h.beta1 + k.a1 * gi;
    v = maps[1][vc[i]] * va[b] * h.beta2 + k.a2 * gi * gi;
    const float w = (master ? master[i] : load(p, i)) * k.decay;
    const float updated = w + k.neg_step * m / (sqrtf(v) / k.bc2_sqrt + h.eps);
    if (master) master[i] = updated;
    store(p, i, updated);
  }
  const float m_max = block_max(fabsf(m), scratch[0]), v_max = block_max(v, scratch[1]);
  if (threadIdx.x == 0) ma[b] = m_max, va[b] = v_max;
  if (valid) {
    mc[i] = nearest_code(maps[0], m_max > 0.f ? m / m_max : 0.f);
    vc[i] = nearest_code(maps[1], v_max > 0.f ? v / v_max : 0.f);
  }
}

template <typename P, typename G>
__global__ void sgd_kernel(P* p, const G* g, float* master, float* buf, long long n, SgdHyper h) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  update_at(i, p, g, master, h.grad_scale, [&](float gi, float w) {
    gi += h.weight_decay * w;  // coupled weight decay, as torch.optim.SGD
    if (buf) {
      buf[i] = h.momentum * buf[i] + gi;
      gi = h.nesterov ? gi + h.momentum * buf[i] : buf[i];
    }
    return w - h.lr * gi;
  });
}

// Adafactor's scalars between passes.
__device__ double g_rmean;  // mean of the row moments (factored)
__device__ float g_clip;    // max(1, rms(u) / clip_threshold)

template <typename G>
__global__ void adafactor_rows_kernel(const G* g, float* r, long long cols, float scale, float eps1, float decay) {
  __shared__ double scratch[device::kWarp];
  const long long row = blockIdx.x;
  double s = 0.0;
  for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
    const float x = load(g, row * cols + j) * scale;
    s += double(x) * x + eps1;
  }
  s = device::block_sum(s, scratch);
  if (threadIdx.x == 0) r[row] = decay * r[row] + (1.f - decay) * float(s / double(cols));
}

// The column moments' sums over the rows, as partials per stretch of rows (column_sums.cuh), then in order.
template <typename G>
__global__ void adafactor_col_partials_kernel(const G* g, double* partial, long long rows, long long cols,
                                              ColumnSplit split, float scale, float eps1) {
  column_partials<1>(rows, cols, split, partial, [&](long long i, long long j, double* s) {
    const float x = load(g, i * cols + j) * scale;
    s[0] += double(x) * x + eps1;
  });
}

__global__ void adafactor_cols_kernel(const double* partial, float* c, long long partials, long long rows,
                                      long long cols, float decay) {
  const long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  const double s = column_total<1>(partial, partials, cols, j, 0);
  c[j] = decay * c[j] + (1.f - decay) * float(s / double(rows));
}

template <typename G>
__global__ void adafactor_full_kernel(const G* g, float* r, long long n, float scale, float eps1, float decay) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = load(g, i) * scale;
  r[i] = decay * r[i] + (1.f - decay) * (x * x + eps1);
}

__global__ void sum_rows_kernel(const float* r, long long rows) {
  device::partial_sums(rows, [&](long long i) { return double(r[i]); });
}
__global__ void rmean_kernel(long long rows) {
  const double t = device::total_of_partials();
  if (threadIdx.x == 0) g_rmean = t / double(rows);
}

// The update before clipping: u = g / sqrt(v), v = r c / mean(r) when factored.
__device__ __forceinline__ float adafactor_u(long long i, float g, const float* r, const float* c, long long cols) {
  return c ? g / sqrtf(float(double(r[i / cols]) * c[i % cols] / g_rmean)) : g / sqrtf(r[i]);
}

template <typename G>
__global__ void u_squares_kernel(const G* g, const float* r, const float* c, long long n, long long cols, float scale) {
  device::partial_sums(n, [&](long long i) {
    const double u = adafactor_u(i, load(g, i) * scale, r, c, cols);
    return u * u;
  });
}
__global__ void clip_kernel(long long n, float threshold) {
  const double t = device::total_of_partials();
  if (threadIdx.x == 0) g_clip = fmaxf(1.f, float(sqrt(t / double(n > 1 ? n : 1))) / threshold);
}

template <typename P, typename G>
__global__ void adafactor_update_kernel(P* p, const G* g, float* master, const float* r, const float* c, long long n,
                                        long long cols, AdafactorHyper h) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float wd = 1.f - h.lr * h.weight_decay, clip = g_clip;
  update_at(i, p, g, master, h.grad_scale,
            [&](float gi, float w) { return w * wd - h.lr * adafactor_u(i, gi, r, c, cols) / clip; });
}

// Calls f(P{}, G{}) for the parameter's and the gradient's element types.
template <typename F>
void dispatch_update(const Tensor& param, const Tensor& grad, const char* op, F&& f) {
  dispatch_float(param.dtype(), op,
                 [&](auto ptag) { dispatch_float(grad.dtype(), op, [&](auto gtag) { f(ptag, gtag); }); });
}

float* master_of(const Tensor& master) {
  return master.defined() ? master.data<float>() : nullptr;
}

}  // namespace

void adamw_update(const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& m, const Tensor& v,
                  const AdamWHyper& h) {
  const int64_t n = param.numel();
  const float bc1 = 1.f - std::pow(h.beta1, float(h.step)), bc2 = 1.f - std::pow(h.beta2, float(h.step));
  const float step_size = h.lr / bc1, bc2_sqrt = std::sqrt(bc2), decay = 1.f - h.lr * h.weight_decay;
  dispatch_update(param, grad, "adamw", [&](auto ptag, auto gtag) {
    using P = decltype(ptag);
    using G = decltype(gtag);
    launch_elements("adamw", n, adamw_kernel<P, G>, param.data<P>(), grad.data<G>(), master_of(master), m.data<float>(),
                    v.data<float>(), n, h, step_size, bc2_sqrt, decay);
  });
}

void adamw8bit_update(const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& m_codes,
                      const Tensor& m_absmax, const Tensor& v_codes, const Tensor& v_absmax, const AdamWHyper& h) {
  const int64_t n = param.numel();
  if (n == 0) return;
  const Adam8bitScalars k = adam8bit_scalars(h);
  dispatch_update(param, grad, "adamw8bit", [&](auto ptag, auto gtag) {
    using P = decltype(ptag);
    using G = decltype(gtag);
    launch_kernel(checked_grid("adamw8bit", adam8bit_blocks(n)), dim3(unsigned(kAdam8bitBlock)), 0,
                  adamw8bit_kernel<P, G>, param.data<P>(), grad.data<G>(), master_of(master), m_codes.data<uint8_t>(),
                  m_absmax.data<float>(), v_codes.data<uint8_t>(), v_absmax.data<float>(), (long long)n, h, k);
  });
}

void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& momentum,
                const SgdHyper& h) {
  const int64_t n = param.numel();
  dispatch_update(param, grad, "sgd", [&](auto ptag, auto gtag) {
    using P = decltype(ptag);
    using G = decltype(gtag);
    launch_elements("sgd", n, sgd_kernel<P, G>, param.data<P>(), grad.data<G>(), master_of(master),
                    momentum.defined() ? momentum.data<float>() : nullptr, n, h);
  });
}

void adafactor_update(const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& row,
                      const Tensor& col, const AdafactorHyper& h, const Tensor& workspace) {
  const int64_t n = param.numel();
  if (n == 0) return;
  const bool factored = col.defined();
  const int64_t cols = factored ? param.size(-1) : n, rows = factored ? n / cols : 1;
  float* r = row.data<float>();
  float* c = factored ? col.data<float>() : nullptr;
  const dim3 partials(device::kPartials), partial_threads(device::kPartialThreads), one(1);
  dispatch_float(grad.dtype(), "adafactor", [&](auto gtag) {
    using G = decltype(gtag);
    const G* g = grad.data<G>();
    if (factored) {
      launch_rows("adafactor", rows, kThreads, adafactor_rows_kernel<G>, g, r, cols, h.grad_scale, h.eps1, h.beta2);
      const ColumnSplit split = column_split(rows, cols);
      HR_CHECK(workspace.nbytes() >= column_sums_workspace_bytes(rows, cols, 1),
               "[adafactor] the workspace is smaller than its sizing rule");
      double* partial = static_cast<double*>(workspace.data_ptr());
      launch_kernel(column_partials_grid("adafactor", split), column_partials_block(), 0,
                    adafactor_col_partials_kernel<G>, g, partial, rows, cols, split, h.grad_scale, h.eps1);
      launch_elements("adafactor", cols, adafactor_cols_kernel, partial, c, split.partials, rows, cols, h.beta2);
      launch_kernel(partials, partial_threads, 0, sum_rows_kernel, r, rows);
      launch_kernel(one, partials, 0, rmean_kernel, rows);
    } else {
      launch_elements("adafactor", n, adafactor_full_kernel<G>, g, r, n, h.grad_scale, h.eps1, h.beta2);
    }
    launch_kernel(partials, partial_threads, 0, u_squares_kernel<G>, g, r, c, n, cols, h.grad_scale);
    launch_kernel(one, partials, 0, clip_kernel, n, h.clip_threshold);
  });
  dispatch_update(param, grad, "adafactor", [&](auto ptag, auto gtag) {
    using P = decltype(ptag);
    using G = decltype(gtag);
    launch_elements("adafactor", n, adafactor_update_kernel<P, G>, param.data<P>(), grad.data<G>(), master_of(master),
                    r, c, n, cols, h);
  });
}

}  // namespace hr::cuda
