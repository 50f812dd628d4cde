// CUDA element-wise kernels with the same contracts as their CPU twins (backend/cpu/elementwise.cpp).
#include "core/backend/cuda/cuda_common.h"
#include "core/backend/cuda/cuda_kernels.h"
#include "core/backend/cuda/device/dtype.cuh"
#include "core/backend/cuda/launch.cuh"
#include "core/ops/dropout_mask.h"

namespace hr::cuda {

namespace {

using device::load;
using device::store;

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

template <typename T>
__global__ void unary_kernel(UnaryOp op, const T* x, T* y, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) store(y, i, unary_f(op, load(x, i)));
}

template <typename T>
__global__ void unary_backward_kernel(UnaryOp op, const T* x, const T* dy, T* dx, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) store(dx, i, load(dy, i) * unary_df(op, load(x, i)));
}

template <typename T>
__global__ void swiglu_kernel(const T* g, const T* u, T* y, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) store(y, i, unary_f(UnaryOp::Silu, load(g, i)) * load(u, i));
}

template <typename T>
__global__ void swiglu_backward_kernel(const T* g, const T* u, const T* dy, T* dg, T* du, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float gv = load(g, i), d = load(dy, i);
  store(du, i, d * unary_f(UnaryOp::Silu, gv));
  store(dg, i, d * load(u, i) * unary_df(UnaryOp::Silu, gv));
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
    launch_elements("axpby", n, axpby_kernel<T>, out.data<T>(), alpha, x.data<T>(), beta, y.data<T>(), n, ny);
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

void unary_forward(UnaryOp op, const Tensor& x, const Tensor& y) {
  const long long n = x.numel();
  dispatch_float(x.dtype(), "unary", [&](auto tag) {
    using T = decltype(tag);
    launch_elements("unary", n, unary_kernel<T>, op, x.data<T>(), y.data<T>(), n);
  });
}

void unary_backward(UnaryOp op, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const long long n = x.numel();
  dispatch_float(x.dtype(), "unary_backward", [&](auto tag) {
    using T = decltype(tag);
    launch_elements("unary_backward", n, unary_backward_kernel<T>, op, x.data<T>(), dy.data<T>(), dx.data<T>(), n);
  });
}

void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& y) {
  const long long n = gate.numel();
  dispatch_float(gate.dtype(), "swiglu", [&](auto tag) {
    using T = decltype(tag);
    launch_elements("swiglu", n, swiglu_kernel<T>, gate.data<T>(), up.data<T>(), y.data<T>(), n);
  });
}

void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy, const Tensor& dgate, const Tensor& dup) {
  const long long n = gate.numel();
  dispatch_float(gate.dtype(), "swiglu_backward", [&](auto tag) {
    using T = decltype(tag);
    launch_elements("swiglu_backward", n, swiglu_backward_kernel<T>, gate.data<T>(), up.data<T>(), dy.data<T>(),
                    dgate.data<T>(), dup.data<T>(), n);
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
