// CPU layer norm and RMS norm, forward and backward. Weight/bias gradients are summed per fixed row chunk
// and then in chunk order, so results do not depend on the thread count.
#include <cmath>

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
        // The residual add first, into x as add_ leaves it: the row is then normalized from the cache.
        if (sum)
          for (int64_t c = 0; c < cols; ++c) store(sum + r * cols, c, load(xr, c) + load(res + r * cols, c));
        const double m =
            ln ? sum_in_lanes(0, cols, [&](int64_t c) { return double(load(xr, c)); }) / double(cols) : 0.0;
        const double var = sum_in_lanes(0, cols,
                                        [&](int64_t c) {
                                          const double d = load(xr, c) - m;
                                          return d * d;
                                        }) /
                           double(cols);
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
    // The two row sums in lanes, one pass each over the row (in L1 after the first), then the chunk's
    // weight and bias gradient partials.
    const double s1 = ln ? sum_in_lanes(0, cols, [&](int64_t c) { return double(load(dyr, c) * load(w, c)); }) : 0.0;
    const double s2 = sum_in_lanes(0, cols, [&](int64_t c) {
      const float xh = (load(xr, c) - m) * rs, dxh = load(dyr, c) * load(w, c);
      return double(dxh) * xh;
    });
    if (cw)
      for (int64_t c = 0; c < cols; ++c) {
        const float xh = (load(xr, c) - m) * rs, g = load(dyr, c);
        cw[c] += g * xh;
        cb[c] += g;
      }
    const float m1 = ln ? float(s1 / double(cols)) : 0.f, m2 = float(s2 / double(cols));
    for (int64_t c = 0; c < cols; ++c) {
      float xh = (load(xr, c) - m) * rs;
      store(dxr, c, rs * (load(dyr, c) * load(w, c) - m1 - xh * m2));
    }
    // The residual stream's gradient added in the same pass, onto dx as stored (as add_ would).
    if (dres)
      for (int64_t c = 0; c < cols; ++c) store(dxr, c, load(dxr, c) + load(dres + r * cols, c));
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
