// CUDA element-wise kernels with the same contracts as their CPU twins (backend/cpu/elementwise.cpp).
#include "core/backend/cuda/cuda_common.h"
#include "core/backend/cuda/cuda_kernels.h"
#include "core/backend/cuda/device/dtype.cuh"
#include "core/backend/cuda/device/pack.cuh"
#include "core/backend/cuda/launch.cuh"
#include "core/ops/dropout_mask.h"

namespace hr::cuda {

namespace {

using device::kPack;
using device::load;
using device::load_pack;
using device::pack_start;
using device::round_as;
using device::store;
using device::store_pack;

__device__ __forceinline__ float sigmoid(float x) {
  return 1.f / (1.f + expf(-x));
}

__device__ float unary_f(UnaryOp op, float x) {
  switch (op) {
    case UnaryOp::Gelu:
      return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
    case UnaryOp::GeluTanh:
      return 0.5f * x * (1.f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    case UnaryOp::QuickGelu:
      return x * sigmoid(1.702f * x);
    case UnaryOp::Silu:
      return x * sigmoid(x);
  }
  return 0.f;
}

__device__ float unary_df(UnaryOp op, float x) {
  switch (op) {
    case UnaryOp::Gelu:
      return 0.5f * (1.f + erff(x * 0.70710678118654752f)) + x * 0.39894228040143268f * expf(-0.5f * x * x);
    case UnaryOp::GeluTanh: {
      float t = tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x));
      return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * 0.79788456080286536f * (1.f + 3.f * 0.044715f * x * x);
    }
    case UnaryOp::QuickGelu: {
      float s = sigmoid(1.702f * x);
      return s + x * 1.702f * s * (1.f - s);
    }
    case UnaryOp::Silu: {
      float s = sigmoid(x);
      return s * (1.f + x * (1.f - s));
    }
  }
  return 0.f;
}

template <typename T>
__global__ void axpby_kernel(T* out, float alpha, const T* x, float beta, const T* y, long long n, long long ny) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = alpha * load(x, i);
  if (beta != 0.f) v += beta * load(y, i % ny);
  store(out, i, v);
}

// axpby over packs where y is not broadcast (or not read): the same expression per element as axpby_kernel.
template <typename T>
__global__ void axpby_packs(T* out, float alpha, const T* x, float beta, const T* y, long long n, bool aligned) {
  constexpr int K = kPack<T>;
  const long long i = pack_start<T>();
  if (i >= n) return;
  const bool whole = aligned && i + K <= n;
  float xv[K], yv[K], o[K];
  load_pack(x, i, n, whole, xv);
  if (beta != 0.f) load_pack(y, i, n, whole, yv);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    float v = alpha * xv[k];
    if (beta != 0.f) v += beta * yv[k];
    o[k] = v;
  }
  store_pack(out, i, n, whole, o);
}

template <typename T>
__global__ void mul_kernel(T* out, const T* a, const T* b, long long n, long long nb) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) store(out, i, load(a, i) * load(b, i % nb));
}

template <typename T>
__global__ void dropout_kernel(T* out, const T* x, uint32_t threshold, float keep_scale, unsigned long long key,
                               long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) store(out, i, dropout_keep(key, (unsigned long long)i, threshold) ? load(x, i) * keep_scale : 0.f);
}

// The activations and SwiGLU, one pack a thread (device/pack.cuh).
// With a bias (cols of it, repeating over x's rows): x = x + bias first, rounded as add_ leaves it and stored
// back into x (the pre-activation the backward reads), and y the activation of that rounded sum.
template <typename T>
__global__ void unary_kernel(UnaryOp op, T* x, const T* bias, long long cols, T* y, long long n, bool aligned) {
  constexpr int K = kPack<T>;
  const long long i = pack_start<T>();
  if (i >= n) return;
  const bool whole = aligned && i + K <= n;
  float v[K];
  load_pack(x, i, n, whole, v);
  if (bias) {
    long long j = i % cols;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      v[k] = round_as<T>(v[k] + load(bias, j));
      j = j + 1 == cols ? 0 : j + 1;
    }
    store_pack(x, i, n, whole, v);
  }
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = unary_f(op, v[k]);
  store_pack(y, i, n, whole, v);
}

template <typename T>
__global__ void unary_backward_kernel(UnaryOp op, const T* x, const T* dy, T* dx, long long n, bool aligned) {
  constexpr int K = kPack<T>;
  const long long i = pack_start<T>();
  if (i >= n) return;
  const bool whole = aligned && i + K <= n;
  float xv[K], d[K];
  load_pack(x, i, n, whole, xv);
  load_pack(dy, i, n, whole, d);
#pragma unroll
  for (int k = 0; k < K; ++k) d[k] = d[k] * unary_df(op, xv[k]);
  store_pack(dx, i, n, whole, d);
}

template <typename T>
__global__ void swiglu_kernel(const T* g, const T* u, T* y, long long n, bool aligned) {
  constexpr int K = kPack<T>;
  const long long i = pack_start<T>();
  if (i >= n) return;
  const bool whole = aligned && i + K <= n;
  float gv[K], uv[K];
  load_pack(g, i, n, whole, gv);
  load_pack(u, i, n, whole, uv);
#pragma unroll
  for (int k = 0; k < K; ++k) uv[k] = unary_f(UnaryOp::Silu, gv[k]) * uv[k];
  store_pack(y, i, n, whole, uv);
}

template <typename T>
__global__ void swiglu_backward_kernel(const T* g, const T* u, const T* dy, T* dg, T* du, long long n, bool aligned) {
  constexpr int K = kPack<T>;
  const long long i = pack_start<T>();
  if (i >= n) return;
  const bool whole = aligned && i + K <= n;
  float gv[K], uv[K], d[K], dgv[K], duv[K];
  load_pack(g, i, n, whole, gv);
  load_pack(u, i, n, whole, uv);
  load_pack(dy, i, n, whole, d);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    duv[k] = d[k] * unary_f(UnaryOp::Silu, gv[k]);
    dgv[k] = d[k] * uv[k] * unary_df(UnaryOp::Silu, gv[k]);
  }
  store_pack(du, i, n, whole, duv);
  store_pack(dg, i, n, whole, dgv);
}

template <typename T>
__global__ void broadcast_kernel(T* out, const float* scalar, float scale, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) store(out, i, scalar[0] * scale);
}

}  // namespace

void axpby(const Tensor& out, float alpha, const Tensor& x, float beta, const Tensor& y) {
  const long long n = out.numel(), ny = y.numel() > 0 ? y.numel() : 1;
  dispatch_float(out.dtype(), "axpby", [&](auto tag) {
    using T = decltype(tag);
    const T* yp = beta != 0.f ? y.data<T>() : nullptr;
    if (beta == 0.f || ny == n)
      launch_packs("axpby", n, kPack<T>, axpby_packs<T>, out.data<T>(), alpha, x.data<T>(), beta, yp, n,
                   aligned16(out.data<T>(), x.data<T>(), yp));
    else
      launch_elements("axpby", n, axpby_kernel<T>, out.data<T>(), alpha, x.data<T>(), beta, yp, n, ny);
  });
}

void dropout(const Tensor& out, const Tensor& x, float p, uint64_t key) {
  const long long n = out.numel();
  const uint32_t threshold = dropout_threshold(p);
  dispatch_float(out.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    launch_elements("dropout", n, dropout_kernel<T>, out.data<T>(), x.data<T>(), threshold, 1.f / (1.f - p),
                    (unsigned long long)key, n);
  });
}

void mul(const Tensor& out, const Tensor& a, const Tensor& b) {
  const long long n = out.numel(), nb = b.numel() > 0 ? b.numel() : 1;
  dispatch_float(out.dtype(), "mul", [&](auto tag) {
    using T = decltype(tag);
    launch_elements("mul", n, mul_kernel<T>, out.data<T>(), a.data<T>(), b.data<T>(), n, nb);
  });
}

void unary_forward(UnaryOp op, const Tensor& x, const Tensor& bias, const Tensor& y) {
  const long long n = x.numel(), cols = bias.numel();
  dispatch_float(x.dtype(), "unary", [&](auto tag) {
    using T = decltype(tag);
    const T* b = bias.defined() ? bias.data<T>() : nullptr;
    launch_packs("unary", n, kPack<T>, unary_kernel<T>, op, x.data<T>(), b, cols, y.data<T>(), n,
                 aligned16(x.data<T>(), y.data<T>()));
  });
}

void unary_backward(UnaryOp op, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const long long n = x.numel();
  dispatch_float(x.dtype(), "unary_backward", [&](auto tag) {
    using T = decltype(tag);
    launch_packs("unary_backward", n, kPack<T>, unary_backward_kernel<T>, op, x.data<T>(), dy.data<T>(), dx.data<T>(),
                 n, aligned16(x.data<T>(), dy.data<T>(), dx.data<T>()));
  });
}

void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& y) {
  const long long n = gate.numel();
  dispatch_float(gate.dtype(), "swiglu", [&](auto tag) {
    using T = decltype(tag);
    launch_packs("swiglu", n, kPack<T>, swiglu_kernel<T>, gate.data<T>(), up.data<T>(), y.data<T>(), n,
                 aligned16(gate.data<T>(), up.data<T>(), y.data<T>()));
  });
}

void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy, const Tensor& dgate, const Tensor& dup) {
  const long long n = gate.numel();
  dispatch_float(gate.dtype(), "swiglu_backward", [&](auto tag) {
    using T = decltype(tag);
    launch_packs("swiglu_backward", n, kPack<T>, swiglu_backward_kernel<T>, gate.data<T>(), up.data<T>(), dy.data<T>(),
                 dgate.data<T>(), dup.data<T>(), n,
                 aligned16(gate.data<T>(), up.data<T>(), dy.data<T>(), dgate.data<T>(), dup.data<T>()));
  });
}

void broadcast_scalar(const Tensor& out, const Tensor& scalar, float scale) {
  HR_CHECK(scalar.dtype() == DType::F32, "[broadcast_scalar] the scalar must be f32 on CUDA; got ", scalar.describe());
  const long long n = out.numel();
  dispatch_float(out.dtype(), "broadcast_scalar", [&](auto tag) {
    using T = decltype(tag);
    launch_elements("broadcast_scalar", n, broadcast_kernel<T>, out.data<T>(), scalar.data<float>(), scale, n);
  });
}

}  // namespace hr::cuda
