// CPU element-wise kernels: axpby, mul, dropout and activations (f32 math on any float dtype); SwiGLU, and the
// activations where the CPU has AVX2 + FMA (the kernel table picks them there), are in vector_math.cpp.
#include <cmath>

#include "core/backend/cpu/activation_constants.h"
#include "core/backend/cpu/cpu_common.h"
#include "core/backend/cpu/cpu_kernels.h"
#include "core/ops/dropout_mask.h"

namespace hr::cpu {

namespace {

constexpr int64_t kParallelMin = 1 << 14;  // elements below which threads cost more than they give

inline float sigmoid(float x) {
  return 1.f / (1.f + std::exp(-x));
}

inline float unary_f(UnaryOp op, float x) {
  switch (op) {
    case UnaryOp::Gelu:
      return 0.5f * x * (1.f + std::erf(x * kSqrt2Inv));
    case UnaryOp::GeluTanh: {
      float u = kSqrt2OverPi * (x + kGeluTanhCubic * x * x * x);
      return 0.5f * x * (1.f + std::tanh(u));
    }
    case UnaryOp::QuickGelu:
      return x * sigmoid(kQuickGeluAlpha * x);
    case UnaryOp::Silu:
      return x * sigmoid(x);
  }
  return 0.f;
}

inline float unary_df(UnaryOp op, float x) {
  switch (op) {
    case UnaryOp::Gelu:
      return 0.5f * (1.f + std::erf(x * kSqrt2Inv)) + x * kInvSqrt2Pi * std::exp(-0.5f * x * x);
    case UnaryOp::GeluTanh: {
      float u = kSqrt2OverPi * (x + kGeluTanhCubic * x * x * x);
      float t = std::tanh(u);
      float du = kSqrt2OverPi * (1.f + 3.f * kGeluTanhCubic * x * x);
      return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * du;
    }
    case UnaryOp::QuickGelu: {
      float s = sigmoid(kQuickGeluAlpha * x);
      return s + x * kQuickGeluAlpha * s * (1.f - s);
    }
    case UnaryOp::Silu: {
      float s = sigmoid(x);
      return s * (1.f + x * (1.f - s));
    }
  }
  return 0.f;
}

}  // namespace

void axpby(const Tensor& out, float alpha, const Tensor& x, float beta, const Tensor& y) {
  HR_CHECK(out.dtype() == x.dtype() && x.dtype() == y.dtype(), "[axpby] dtypes differ: ", out.describe(), ", ",
           x.describe(), ", ", y.describe());
  dispatch_float(out.dtype(), "axpby", [&](auto tag) {
    using T = decltype(tag);
    T* o = out.data<T>();
    const T* xp = x.data<T>();
    const T* yp = y.data<T>();
    const int64_t n = out.numel(), ny = std::max<int64_t>(y.numel(), 1);
    if (beta == 0.f) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
      for (int64_t i = 0; i < n; ++i) store(o, i, alpha * load(xp, i));
    } else if (ny == n) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
      for (int64_t i = 0; i < n; ++i) store(o, i, alpha * load(xp, i) + beta * load(yp, i));
    } else {
      const int64_t rows = n / ny;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < ny; ++j) store(o, r * ny + j, alpha * load(xp, r * ny + j) + beta * load(yp, j));
    }
  });
}

void mul(const Tensor& out, const Tensor& a, const Tensor& b) {
  HR_CHECK(out.dtype() == a.dtype() && a.dtype() == b.dtype(), "[mul] dtypes differ: ", a.describe(), ", ",
           b.describe());
  dispatch_float(out.dtype(), "mul", [&](auto tag) {
    using T = decltype(tag);
    T* o = out.data<T>();
    const T* ap = a.data<T>();
    const T* bp = b.data<T>();
    const int64_t n = out.numel(), nb = std::max<int64_t>(b.numel(), 1);
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) store(o, i, load(ap, i) * load(bp, i % nb));
  });
}

void dropout(const Tensor& out, const Tensor& x, float p, uint64_t key) {
  const uint32_t threshold = dropout_threshold(p);
  const float keep_scale = 1.f / (1.f - p);
  dispatch_float(out.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    T* o = out.data<T>();
    const T* xp = x.data<T>();
    const int64_t n = out.numel();
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i)
      store(o, i, dropout_keep(key, uint64_t(i), threshold) ? load(xp, i) * keep_scale : 0.f);
  });
}

void unary_forward(UnaryOp op, const Tensor& x, const Tensor& bias, const Tensor& y) {
  dispatch_float(x.dtype(), "unary", [&](auto tag) {
    using T = decltype(tag);
    T* xp = x.data<T>();
    T* yp = y.data<T>();
    const int64_t n = x.numel();
    if (!bias.defined()) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
      for (int64_t i = 0; i < n; ++i) store(yp, i, unary_f(op, load(xp, i)));
      return;
    }
    // The bias add first, rounded to T as add_ leaves it, and the activation of that rounded sum.
    const T* b = bias.data<T>();
    const int64_t cols = bias.numel(), rows = cols ? n / cols : 0;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0, i = r * cols; j < cols; ++j, ++i) {
        store(xp, i, load(xp, i) + load(b, j));
        store(yp, i, unary_f(op, load(xp, i)));
      }
  });
}

void unary_backward(UnaryOp op, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  dispatch_float(x.dtype(), "unary_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = x.data<T>();
    const T* dyp = dy.data<T>();
    T* dxp = dx.data<T>();
    const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) store(dxp, i, load(dyp, i) * unary_df(op, load(xp, i)));
  });
}

void broadcast_scalar(const Tensor& out, const Tensor& scalar, float scale) {
  float v = 0.f;
  dispatch_float(scalar.dtype(), "broadcast_scalar", [&](auto tag) { v = load(scalar.data<decltype(tag)>(), 0); });
  fill(out, v * scale);
}

}  // namespace hr::cpu
