// CPU layer norm and RMS norm, forward and backward. Weight/bias gradients are summed per fixed row chunk
// and then in chunk order, so results do not depend on the thread count.
#include <cmath>
#include <type_traits>

#include "core/backend/cpu/cpu_common.h"
#include "core/backend/cpu/cpu_kernels.h"

namespace hr::cpu {

namespace {
constexpr int64_t kNormChunks = 32;  // row chunks for deterministic weight-gradient partial sums
int64_t chunks_for(int64_t rows) {
  return std::max<int64_t>(1, std::min(rows, kNormChunks));
}
}  // namespace

std::size_t norm_workspace_bytes(int64_t rows, int64_t cols) {
  return 2 * WorkspaceCarver::bytes(std::size_t(chunks_for(rows) * cols));
}

void norm_forward(const NormArgs& a) {
  const int64_t rows = a.x.size(0), cols = a.x.size(1);
  const bool ln = a.kind == NormKind::LayerNorm;
  float* mean = ln ? a.mean.data<float>() : nullptr;
  float* rstd = a.rstd.data<float>();
  dispatch_float(a.x.dtype(), "norm", [&](auto tag) {
    using T = decltype(tag);
    dispatch_float(a.weight.dtype(), "norm", [&](auto wtag) {
      using W = decltype(wtag);
      const T* x = a.x.data<T>();
      T* y = a.y.data<T>();
      const W* w = a.weight.data<W>();
      const W* b = a.bias.defined() ? a.bias.data<W>() : nullptr;
      T* sum = a.residual.defined() ? a.x.data<T>() : nullptr;
      const T* res = a.residual.defined() ? a.residual.data<T>() : nullptr;
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        const T* xr = x + r * cols;
        T* yr = y + r * cols;
        // The residual add into x as add_ leaves it, in the same pass as the row's first sum (layer norm's mean,
        // RMS norm's sum of squares) over the sums as stored; the row is then normalized from the cache.
        const T* rr = sum ? res + r * cols : nullptr;
        T* sr = sum ? sum + r * cols : nullptr;
        auto first_sum = [&](auto added, auto square) {
          return sum_in_lanes(0, cols, [&](int64_t c) {
            double v;
            if constexpr (decltype(added)::value) {
              store(sr, c, load(xr, c) + load(rr, c));
              v = load(sr, c);
            } else {
              v = load(xr, c);
            }
            if constexpr (decltype(square)::value) v *= v;
            return v;
          });
        };
        double m = 0.0, var = 0.0;
        if (ln) {
          m = (sum ? first_sum(std::true_type{}, std::false_type{}) : first_sum(std::false_type{}, std::false_type{})) /
              double(cols);
          var = sum_in_lanes(0, cols, [&](int64_t c) {
            const double d = load(xr, c) - m;
            return d * d;
          });
        } else {
          var = sum ? first_sum(std::true_type{}, std::true_type{}) : first_sum(std::false_type{}, std::true_type{});
        }
        var /= double(cols);
        const float rs = float(1.0 / std::sqrt(var + a.eps));
        const float mf = float(m);
        for (int64_t c = 0; c < cols; ++c) store(yr, c, (load(xr, c) - mf) * rs * load(w, c) + (b ? load(b, c) : 0.f));
        if (ln) mean[r] = mf;
        rstd[r] = rs;
      }
    });
  });
}

namespace {

// Two sums at once in sum_in_lanes' order (the same bits as two calls): term(i, t1, t2) gives both terms of i.
static_assert(kSumLanes == 8, "sums_in_lanes adds its eight lanes as sum_in_lanes does");
template <typename F>
void sums_in_lanes(int64_t n, double& sum1, double& sum2, F&& term) {
  double a[kSumLanes] = {}, b[kSumLanes] = {};
  int64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes)
    for (int j = 0; j < kSumLanes; ++j) {
      double t1, t2;
      term(i + j, t1, t2);
      a[j] += t1;
      b[j] += t2;
    }
  for (int j = 0; i < n; ++i, ++j) {
    double t1, t2;
    term(i, t1, t2);
    a[j] += t1;
    b[j] += t2;
  }
  sum1 = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
  sum2 = ((b[0] + b[1]) + (b[2] + b[3])) + ((b[4] + b[5]) + (b[6] + b[7]));
}

// Rows [r0, r1) of the backward: dx, and where cw/cb are given the chunk's weight and bias gradient partials.
// xhat = (x - m) rs; dxhat = dy w; dx = rs (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), mean(dxhat) for layer
// norm only.
template <typename T, typename W>
void backward_rows(const NormArgs& a, int64_t r0, int64_t r1, float* cw, float* cb) {
  const int64_t cols = a.x.size(1);
  const bool ln = a.kind == NormKind::LayerNorm;
  const float* mean = ln ? a.mean.data<float>() : nullptr;
  const float* rstd = a.rstd.data<float>();
  const W* w = a.weight.data<W>();
  const T* x = a.x.data<T>();
  const T* dy = a.dy.data<T>();
  T* dx = a.dx.data<T>();
  const T* dres = a.dresidual.defined() ? a.dresidual.data<T>() : nullptr;
  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * cols;
    const T* dyr = dy + r * cols;
    T* dxr = dx + r * cols;
    const float m = ln ? mean[r] : 0.f, rs = rstd[r];
    // The row sums in lanes in one pass, with the chunk's weight and bias gradient partials, then dx in a second
    // (the row in L1 by then).
    double s1 = 0.0, s2 = 0.0;
    auto sums = [&](auto with_partials) {
      sums_in_lanes(cols, s1, s2, [&](int64_t c, double& t1, double& t2) {
        const float g = load(dyr, c), xh = (load(xr, c) - m) * rs, dxh = g * load(w, c);
        if constexpr (decltype(with_partials)::value) {
          cw[c] += g * xh;
          cb[c] += g;
        }
        t1 = dxh;
        t2 = double(dxh) * xh;
      });
    };
    if (cw)
      sums(std::true_type{});
    else
      sums(std::false_type{});
    const float m1 = ln ? float(s1 / double(cols)) : 0.f, m2 = float(s2 / double(cols));
    // The residual stream's gradient added in the same pass, onto dx as stored (as add_ would).
    const T* dr = dres ? dres + r * cols : nullptr;
    for (int64_t c = 0; c < cols; ++c) {
      const float xh = (load(xr, c) - m) * rs;
      store(dxr, c, rs * (load(dyr, c) * load(w, c) - m1 - xh * m2));
      if (dr) store(dxr, c, load(dxr, c) + load(dr, c));
    }
  }
}

// The partials summed in chunk order onto `out` (or what it held, when accumulating).
void sum_partials(const Tensor& out, const float* partial, int64_t nchunks, int64_t cols, bool accumulate) {
  dispatch_float(out.dtype(), "norm_backward", [&](auto otag) {
    using O = decltype(otag);
    O* o = out.data<O>();
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < cols; ++c) {
      float t = accumulate ? load(o, c) : 0.f;
      for (int64_t ch = 0; ch < nchunks; ++ch) t += partial[ch * cols + c];
      store(o, c, t);
    }
  });
}

}  // namespace

void norm_backward(const NormArgs& a) {
  const int64_t rows = a.x.size(0), cols = a.x.size(1);
  const bool wgrad = a.dweight.defined();
  const int64_t nchunks = chunks_for(rows);
  float* pw = nullptr;
  float* pb = nullptr;
  if (wgrad) {
    WorkspaceCarver ws(a.workspace.data_ptr());
    pw = ws.floats(std::size_t(nchunks * cols));
    pb = ws.floats(std::size_t(nchunks * cols));
  }
  dispatch_float(a.x.dtype(), "norm_backward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_float(a.weight.dtype(), "norm_backward", [&](auto wtag) {
      using W = decltype(wtag);
#pragma omp parallel for schedule(static)
      for (int64_t ch = 0; ch < nchunks; ++ch) {
        float* cw = wgrad ? pw + ch * cols : nullptr;
        float* cb = wgrad ? pb + ch * cols : nullptr;
        if (wgrad) std::fill(cw, cw + cols, 0.f), std::fill(cb, cb + cols, 0.f);
        backward_rows<T, W>(a, rows * ch / nchunks, rows * (ch + 1) / nchunks, cw, cb);
      }
    });
  });
  if (!wgrad) return;
  const bool acc = a.accumulate == Accumulate::Yes;
  sum_partials(a.dweight, pw, nchunks, cols, acc);
  if (a.dbias.defined()) sum_partials(a.dbias, pb, nchunks, cols, acc);
}

}  // namespace hr::cpu
