// CPU kernels around Eigen's vectorized exp; this file is compiled for AVX2 + FMA, as the attention is
// (core/CMakeLists.txt), so it runs 8 lanes at a time. SwiGLU, forward and backward (silu(gate) * up): the sigmoid's
// exponentials over stretches of kStretch elements converted to f32 on the stack, one parallel loop over stretches
// each way. The activations (quick GELU and SiLU through the sigmoid's exp, tanh GELU through tanh, GELU through
// Eigen's rational erf, accurate to a couple of ulp), forward (with the linear's bias added in the same pass when
// given) and backward, the same way. exp_floats_avx2: the
// exponentials other kernels take in bulk (the cross-entropy's).
#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>

#include "core/backend/cpu/activation_constants.h"
#include "core/backend/cpu/attention_f32.h"
#include "core/backend/cpu/cpu_common.h"
#include "core/backend/cpu/cpu_kernels.h"

namespace hr::cpu {

namespace {

constexpr int64_t kStretch = 512;          // elements per step of a thread: 2 KiB of f32 per buffer
constexpr int64_t kParallelMin = 1 << 14;  // elements below which threads cost more than they give
using Stretch = Eigen::Map<Eigen::ArrayXf, Eigen::Aligned32>;
using ConstStretch = Eigen::Map<const Eigen::ArrayXf, Eigen::Aligned32>;

// Calls f(i0, m) for each stretch [i0, i0 + m) of n elements, across the threads.
template <typename F>
void for_stretches(int64_t n, F&& f) {
  const int64_t stretches = (n + kStretch - 1) / kStretch;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t b = 0; b < stretches; ++b) f(b * kStretch, std::min(kStretch, n - b * kStretch));
}

// s[0, m) = 1 / (1 + exp(-alpha x)) for a stretch. On AVX-512 (avx512_tiles_present(), capped by ONEDNN_MAX_CPU_ISA
// like the attention tiles) 16 lanes wide in the attention's exponential (f32_tiles::sigmoid_floats); elsewhere in
// Eigen's, 8 lanes. x is only read; it is not a const pointer because a stretch filled only up to m passed as one
// sets off GCC's -Wmaybe-uninitialized.
void sigmoid(float* x, float* s, int64_t m, float alpha) {
  if (avx512_tiles_present()) return f32_tiles::sigmoid_floats(x, s, m, alpha);
  Stretch(s, m) = (1.f + (-alpha * ConstStretch(x, m)).exp()).inverse();
}

// g[0, m) from p + i0 in f32, and s = sigmoid(g) = 1 / (1 + exp(-g)).
template <typename T>
void load_sigmoid(const T* p, int64_t i0, int64_t m, float* g, float* s) {
  for (int64_t k = 0; k < m; ++k) g[k] = load(p, i0 + k);
  sigmoid(g, s, m, 1.f);
}

// xv[0, m) = x[i0, i0 + m) plus the bias over x's rows of `cols`, each sum rounded to T as add_ leaves it and
// written back into x (the pre-activation the backward reads).
// Row by row, so that each inner loop runs over contiguous x and bias and vectorizes.
template <typename T>
void load_biased(T* x, const T* bias, int64_t cols, int64_t i0, int64_t m, float* xv) {
  for (int64_t k = 0, j = i0 % cols; k < m; j = 0) {
    const int64_t len = std::min(m - k, cols - j);
    T* __restrict xs = x + i0 + k;
    const T* __restrict bs = bias + j;
    float* __restrict v = xv + k;
    for (int64_t t = 0; t < len; ++t) {
      T sum;
      store(&sum, 0, load(xs, t) + load(bs, t));
      xs[t] = sum;
      v[t] = load(&sum, 0);
    }
    k += len;
  }
}

// For a stretch of x (xv[0, m)), in t: the sigmoid of (alpha x) for quick GELU (alpha 1.702) and SiLU (1),
// tanh(sqrt(2/pi) (x + 0.044715 x^3)) for tanh GELU, erf(x / sqrt(2)) for GELU; with `e`, also exp(-x^2 / 2) there
// (GELU's derivative).
void activation_core(UnaryOp op, float* xv, int64_t m, float* t, float* e = nullptr) {
  const Stretch x(xv, m);
  switch (op) {
    case UnaryOp::QuickGelu:
      return sigmoid(xv, t, m, kQuickGeluAlpha);
    case UnaryOp::Silu:
      return sigmoid(xv, t, m, 1.f);
    case UnaryOp::GeluTanh:
      Stretch(t, m) = (kSqrt2OverPi * (x + kGeluTanhCubic * x * x * x)).tanh();
      return;
    case UnaryOp::Gelu:
      Stretch(t, m) = (kSqrt2Inv * x).erf();
      if (e) Stretch(e, m) = (-0.5f * x * x).exp();
      return;
  }
}

// The activation from x and its core t (activation_core), and its derivative (e: GELU's exp(-x^2 / 2)).
inline float activation(UnaryOp op, float x, float t) {
  return op == UnaryOp::GeluTanh || op == UnaryOp::Gelu ? 0.5f * x * (1.f + t) : x * t;
}
inline float activation_df(UnaryOp op, float x, float t, float e) {
  switch (op) {
    case UnaryOp::QuickGelu:
      return t + x * kQuickGeluAlpha * t * (1.f - t);
    case UnaryOp::Silu:
      return t * (1.f + x * (1.f - t));
    case UnaryOp::GeluTanh:
      return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * kSqrt2OverPi * (1.f + 3.f * kGeluTanhCubic * x * x);
    case UnaryOp::Gelu:
      return 0.5f * (1.f + t) + x * kInvSqrt2Pi * e;
  }
  return 0.f;
}

}  // namespace

void unary_forward_avx2(UnaryOp op, const Tensor& x, const Tensor& bias, const Tensor& y) {
  dispatch_float(x.dtype(), "unary", [&](auto tag) {
    using T = decltype(tag);
    T* xp = x.data<T>();
    T* yp = y.data<T>();
    const T* b = bias.defined() ? bias.data<T>() : nullptr;
    const int64_t cols = bias.numel();
    for_stretches(x.numel(), [&](int64_t i0, int64_t m) {
      alignas(32) float xv[kStretch], t[kStretch];
      if (b)
        load_biased(xp, b, cols, i0, m, xv);
      else
        for (int64_t k = 0; k < m; ++k) xv[k] = load(xp, i0 + k);
      activation_core(op, xv, m, t);
      for (int64_t k = 0; k < m; ++k) store(yp, i0 + k, activation(op, xv[k], t[k]));
    });
  });
}

void unary_backward_avx2(UnaryOp op, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  dispatch_float(x.dtype(), "unary_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = x.data<T>();
    const T* d = dy.data<T>();
    T* dxp = dx.data<T>();
    for_stretches(x.numel(), [&](int64_t i0, int64_t m) {
      alignas(32) float xv[kStretch], t[kStretch], e[kStretch];
      for (int64_t k = 0; k < m; ++k) xv[k] = load(xp, i0 + k);
      activation_core(op, xv, m, t, e);
      for (int64_t k = 0; k < m; ++k) store(dxp, i0 + k, load(d, i0 + k) * activation_df(op, xv[k], t[k], e[k]));
    });
  });
}

void exp_floats_avx2(const float* in, float* out, int64_t n) {
  if (n > 0) Eigen::Map<Eigen::ArrayXf>(out, n) = Eigen::Map<const Eigen::ArrayXf>(in, n).exp();
}

void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& y) {
  dispatch_float(gate.dtype(), "swiglu", [&](auto tag) {
    using T = decltype(tag);
    const T* g = gate.data<T>();
    const T* u = up.data<T>();
    T* yp = y.data<T>();
    for_stretches(gate.numel(), [&](int64_t i0, int64_t m) {
      alignas(32) float gv[kStretch], s[kStretch];
      load_sigmoid(g, i0, m, gv, s);
      for (int64_t k = 0; k < m; ++k) store(yp, i0 + k, gv[k] * s[k] * load(u, i0 + k));
    });
  });
}

void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy, const Tensor& dgate, const Tensor& dup) {
  dispatch_float(gate.dtype(), "swiglu_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* g = gate.data<T>();
    const T* u = up.data<T>();
    const T* d = dy.data<T>();
    T* dg = dgate.data<T>();
    T* du = dup.data<T>();
    for_stretches(gate.numel(), [&](int64_t i0, int64_t m) {
      alignas(32) float gv[kStretch], s[kStretch];
      load_sigmoid(g, i0, m, gv, s);
      // One sigmoid for both: silu(g) = g s and silu'(g) = s (1 + g (1 - s)).
      for (int64_t k = 0; k < m; ++k) {
        const float dv = load(d, i0 + k);
        store(du, i0 + k, dv * gv[k] * s[k]);
        store(dg, i0 + k, dv * load(u, i0 + k) * s[k] * (1.f + gv[k] * (1.f - s[k])));
      }
    });
  });
}

}  // namespace hr::cpu
