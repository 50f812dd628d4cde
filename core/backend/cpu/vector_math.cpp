// CPU kernels around Eigen's vectorized exp; this file is compiled for AVX2 + FMA, as the attention is
// (core/CMakeLists.txt), so it runs 8 lanes at a time. SwiGLU, forward and backward (silu(gate) * up): the sigmoid's
// exponentials over stretches of kStretch elements converted to f32 on the stack, one parallel loop over stretches
// each way. exp_floats_avx2: the exponentials other kernels take in bulk (the cross-entropy's).
#include <Eigen/Core>

#include "core/backend/cpu/cpu_common.h"
#include "core/backend/cpu/cpu_kernels.h"

namespace hr::cpu {

namespace {

constexpr int64_t kStretch = 512;          // elements per step of a thread: 2 KiB of f32 per buffer
constexpr int64_t kParallelMin = 1 << 14;  // elements below which threads cost more than they give
using Stretch = Eigen::Map<Eigen::ArrayXf, Eigen::Aligned32>;

// Calls f(i0, m) for each stretch [i0, i0 + m) of n elements, across the threads.
template <typename F>
void for_stretches(int64_t n, F&& f) {
  const int64_t stretches = (n + kStretch - 1) / kStretch;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t b = 0; b < stretches; ++b) f(b * kStretch, std::min(kStretch, n - b * kStretch));
}

// g[0, m) from p + i0 in f32, and s = sigmoid(g) = 1 / (1 + exp(-g)).
template <typename T>
void load_sigmoid(const T* p, int64_t i0, int64_t m, float* g, float* s) {
  for (int64_t k = 0; k < m; ++k) g[k] = load(p, i0 + k);
  Stretch(s, m) = (1.f + (-Stretch(g, m)).exp()).inverse();
}

}  // namespace

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
