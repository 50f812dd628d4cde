// CPU softmax over the last dim and rotary position embedding.
#include <array>
#include <cmath>

#include "core/backend/cpu/cpu_common.h"
#include "core/backend/cpu/cpu_kernels.h"

namespace hr::cpu {

void softmax_forward(const Tensor& x, const Tensor& y) {
  const int64_t cols = x.dim() ? x.size(-1) : 1, rows = cols ? x.numel() / cols : 0;
  dispatch_float(x.dtype(), "softmax", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = xp + r * cols;
      T* yr = yp + r * cols;
      float mx = -INFINITY;
      for (int64_t c = 0; c < cols; ++c) mx = std::max(mx, load(xr, c));
      double s = 0.0;
      for (int64_t c = 0; c < cols; ++c) s += std::exp(load(xr, c) - mx);
      const float inv = float(1.0 / s);
      for (int64_t c = 0; c < cols; ++c) store(yr, c, std::exp(load(xr, c) - mx) * inv);
    }
  });
}

void softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  const int64_t cols = y.dim() ? y.size(-1) : 1, rows = cols ? y.numel() / cols : 0;
  dispatch_float(y.dtype(), "softmax_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* yp = y.data<T>();
    const T* dyp = dy.data<T>();
    T* dxp = dx.data<T>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t o = r * cols;
      double dot = 0.0;
      for (int64_t c = 0; c < cols; ++c) dot += double(load(yp, o + c)) * load(dyp, o + c);
      const float d = float(dot);
      for (int64_t c = 0; c < cols; ++c) store(dxp, o + c, load(yp, o + c) * (load(dyp, o + c) - d));
    }
  });
}

namespace {

// The frequencies theta^(-2i/d), on the stack for every head size in use (d <= 2 kRopeTable); larger heads compute
// each where it is needed (the same values).
class RopeFreqs {
 public:
  RopeFreqs(float theta, int64_t hd) : theta_(theta), hd_(hd), tabled_(hd / 2 <= kRopeTable) {
    if (tabled_)
      for (int64_t i = 0; i < hd / 2; ++i) table_[std::size_t(i)] = compute(i);
  }
  double operator()(int64_t i) const { return tabled_ ? table_[std::size_t(i)] : compute(i); }

 private:
  static constexpr int64_t kRopeTable = 256;
  double compute(int64_t i) const { return std::pow(double(theta_), -2.0 * double(i) / double(hd_)); }
  float theta_;
  int64_t hd_;
  bool tabled_;
  std::array<double, kRopeTable> table_;
};

}  // namespace

// out[..., i] = x[..., i] * cos - x[..., i + half] * sin, out[..., i + half] = x[..., i + half] * cos + x[..., i] * sin
// with angle = position * theta^(-2i / head_dim), or the angle's cos and sin from the table; inverse uses -angle.
void rope(const RopeArgs& a) {
  const int64_t batch = a.x.size(0), seq = a.x.size(1), heads = a.x.size(2), hd = a.x.size(3), half = hd / 2;
  const float sign = a.inverse ? -1.f : 1.f;
  const RopeFreqs freq(a.theta, hd);  // here, not in the lambdas: clang's OpenMP cannot capture it from there
  dispatch_float(a.x.dtype(), "rope", [&](auto tag) {
    using T = decltype(tag);
    const T* x = a.x.data<T>();
    T* out = a.out.data<T>();
    if (a.table.defined()) {  // token bs's cos row then its sin row: each head's pairs in one vectorized sweep
      const float* t = a.table.data<float>();
#pragma omp parallel for schedule(static)
      for (int64_t bs = 0; bs < batch * seq; ++bs) {
        const float* c = t + bs * hd;
        const float* s = c + half;
        for (int64_t h = 0; h < heads; ++h) {
          const int64_t o = (bs * heads + h) * hd;
          for (int64_t i = 0; i < half; ++i) {
            const float x1 = load(x, o + i), x2 = load(x, o + i + half), si = sign * s[i];
            store(out, o + i, x1 * c[i] - x2 * si);
            store(out, o + i + half, x2 * c[i] + x1 * si);
          }
        }
      }
      return;
    }
    dispatch_index(a.positions.dtype(), "rope", [&](auto itag) {
      const auto* pos = a.positions.data<decltype(itag)>();
#pragma omp parallel for schedule(static)
      for (int64_t bs = 0; bs < batch * seq; ++bs) {
        const double p = double(pos[bs]);
        for (int64_t i = 0; i < half; ++i) {
          const double ang = p * freq(i);
          const float c = float(std::cos(ang)), s = sign * float(std::sin(ang));
          for (int64_t h = 0; h < heads; ++h) {
            const int64_t o = (bs * heads + h) * hd;
            const float x1 = load(x, o + i), x2 = load(x, o + i + half);
            store(out, o + i, x1 * c - x2 * s);
            store(out, o + i + half, x2 * c + x1 * s);
          }
        }
      }
    });
  });
}

// The table rope reads: out (batch, seq, 2, half) f32, each token's cos row and sin row as rope computes them.
void rope_table(const RopeArgs& a) {
  const int64_t tokens = a.positions.numel(), half = a.out.size(-1);
  const RopeFreqs freq(a.theta, 2 * half);
  float* t = a.out.data<float>();
  dispatch_index(a.positions.dtype(), "rope_table", [&](auto itag) {
    const auto* pos = a.positions.data<decltype(itag)>();
#pragma omp parallel for schedule(static)
    for (int64_t bs = 0; bs < tokens; ++bs) {
      const double p = double(pos[bs]);
      for (int64_t i = 0; i < half; ++i) {
        const double ang = p * freq(i);
        t[bs * 2 * half + i] = float(std::cos(ang));
        t[bs * 2 * half + half + i] = float(std::sin(ang));
      }
    }
  });
}

}  // namespace hr::cpu
