// CPU optimizer updates: one fused pass per parameter, f32 math, vectorisable loops split over threads.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/backend/cpu/cpu_common.h"
#include "core/backend/cpu/cpu_kernels.h"

namespace hr::cpu {

namespace {

// Runs f(P* param, const G* grad) with the parameter's and the gradient's element types.
template <typename F>
void dispatch_update(const Tensor& param, const Tensor& grad, const char* op, F&& f) {
  dispatch_float(param.dtype(), op, [&](auto ptag) {
    using P = decltype(ptag);
    dispatch_float(grad.dtype(), op, [&](auto gtag) {
      using G = decltype(gtag);
      f(param.data<P>(), grad.data<G>());
    });
  });
}

// Elements [begin, end) of for_each_update, as a plain loop: each element is independent (f reads and writes only
// index i of its own buffers), which `ivdep` tells the compiler, so that it runs in vector registers with its
// loads, square roots (-fno-math-errno) and bf16 rounding. Inside an OpenMP region's own loop, reading f's
// captures through the region's shared data, it stayed scalar.
template <typename P, typename G, typename F>
void update_span(P* p, const G* g, float* mp, int64_t begin, int64_t end, float grad_scale, F f) {
  if (mp) {
#pragma GCC ivdep
    for (int64_t i = begin; i < end; ++i) {
      const float updated = f(i, load(g, i) * grad_scale, mp[i]);
      mp[i] = updated;
      store(p, i, updated);
    }
  } else {
#pragma GCC ivdep
    for (int64_t i = begin; i < end; ++i) store(p, i, f(i, load(g, i) * grad_scale, load(p, i)));
  }
}

// Runs f(i, g, w) for every element, with g the scaled f32 gradient and w the f32 weight (the master's, else the
// parameter's), and writes the result into the master (if any) and the parameter; spans of kUpdateSpan
// elements across the threads.
template <typename F>
void for_each_update(const Tensor& param, const Tensor& grad, const Tensor& master, float grad_scale, F&& f) {
  constexpr int64_t kUpdateSpan = 4096;
  const int64_t n = param.numel(), spans = (n + kUpdateSpan - 1) / kUpdateSpan;
  float* mp = master.defined() ? master.data<float>() : nullptr;
  dispatch_update(param, grad, "optimizer", [&](auto* p, const auto* g) {
#pragma omp parallel for schedule(static) if (n > (1 << 14))
    for (int64_t s = 0; s < spans; ++s)
      update_span(p, g, mp, s * kUpdateSpan, std::min(n, (s + 1) * kUpdateSpan), grad_scale, f);
  });
}

}  // namespace

void adamw_update(const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& m, const Tensor& v,
                  const AdamWHyper& h) {
  float* mp = m.data<float>();
  float* vp = v.data<float>();
  const float bc1 = 1.f - std::pow(h.beta1, float(h.step)), bc2 = 1.f - std::pow(h.beta2, float(h.step));
  const float step_size = h.lr / bc1, bc2_sqrt = std::sqrt(bc2), decay = 1.f - h.lr * h.weight_decay;
  // The hyperparameters by value: the loop's stores cannot then be taken to change them.
  const float b1 = h.beta1, b2 = h.beta2, a1 = 1.f - h.beta1, a2 = 1.f - h.beta2, eps = h.eps;
  for_each_update(param, grad, master, h.grad_scale, [=](int64_t i, float g, float w) {
    const float mi = b1 * mp[i] + a1 * g, vi = b2 * vp[i] + a2 * g * g;
    mp[i] = mi, vp[i] = vi;
    return w * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
  });
}

namespace {

// The index of the map's value nearest to x (the lower one on a tie), as bitsandbytes quantizes: by bisection,
// to build the tables below.
uint8_t nearest_by_bisection(const float* map, float x) {
  const int hi = int(std::lower_bound(map, map + 256, x) - map);
  if (hi == 0) return 0;
  if (hi == 256) return 255;
  return uint8_t(x - map[hi - 1] <= map[hi] - x ? hi - 1 : hi);
}

// The same in two loads: floats that share their top 16 bits (sign, exponent, 7 mantissa bits: a bucket 1/128 of
// its magnitude wide) have as nearest value the one nearest to the bucket's lower end or the next, since no two
// midpoints between the map's values are that close (the closest are 1.4% apart, checked as the table is made).
// A bisection per moment, branching or not, made the update 8x slower than AdamW's.
struct CodeTable {
  const float* map;
  std::vector<uint8_t> first;  // by the top 16 bits of x: the nearest value to the bucket's lower end
  explicit CodeTable(const float* m) : map(m), first(65536) {
    for (uint32_t key = 0; key < 65536; ++key) {
      float a, b;
      const uint32_t lo = key << 16, hi = lo | 0xFFFFu;
      std::memcpy(&a, &lo, 4), std::memcpy(&b, &hi, 4);
      if (std::isnan(a) || std::isnan(b)) continue;
      const float low = std::min(a, b), high = std::max(a, b);
      const uint8_t c = nearest_by_bisection(map, low), d = nearest_by_bisection(map, high);
      HR_ASSERT(d == c || d == c + 1, "two midpoints of the 8-bit map in one bucket (", low, ", ", high, ")");
      first[key] = c;
    }
  }
  uint8_t nearest(float x) const {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    const uint8_t c = first[bits >> 16];
    return uint8_t(c + (c < 255 && x - map[c] > map[c + 1] - x));
  }
};

}  // namespace

void adamw8bit_update(const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& m_codes,
                      const Tensor& m_absmax, const Tensor& v_codes, const Tensor& v_absmax, const AdamWHyper& h) {
  const int64_t n = param.numel(), blocks = adam8bit_blocks(n);
  uint8_t* mc = m_codes.data<uint8_t>();
  uint8_t* vc = v_codes.data<uint8_t>();
  float* ma = m_absmax.data<float>();
  float* va = v_absmax.data<float>();
  float* mp = master.defined() ? master.data<float>() : nullptr;
  const float *kSignedMap = adam8bit_map(true), *kUnsignedMap = adam8bit_map(false);
  static const CodeTable signed_codes(kSignedMap), unsigned_codes(kUnsignedMap);
  const Adam8bitScalars k = adam8bit_scalars(h);
  dispatch_update(param, grad, "adamw8bit", [&](auto* p, const auto* g) {
#pragma omp parallel for schedule(static) if (n > (1 << 14))
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t begin = b * kAdam8bitBlock, len = std::min(kAdam8bitBlock, n - begin);
      float m[kAdam8bitBlock], v[kAdam8bitBlock];
      float m_max = 0.f, v_max = 0.f;
      for (int64_t j = 0; j < len; ++j) {
        const int64_t i = begin + j;
        const float gi = load(g, i) * h.grad_scale;
        m[j] = kSignedMap[mc[i]] * ma[b] * h.beta1 + k.a1 * gi;
        v[j] = kUnsignedMap[vc[i]] * va[b] * h.beta2 + k.a2 * gi * gi;
        m_max = std::max(m_max, std::fabs(m[j]));
        v_max = std::max(v_max, v[j]);
        const float w = (mp ? mp[i] : load(p, i)) * k.decay;
        const float updated = w + k.neg_step * m[j] / (std::sqrt(v[j]) / k.bc2_sqrt + h.eps);
        if (mp) mp[i] = updated;
        store(p, i, updated);
      }
      ma[b] = m_max, va[b] = v_max;
      for (int64_t j = 0; j < len; ++j) {
        mc[begin + j] = signed_codes.nearest(m_max > 0.f ? m[j] / m_max : 0.f);
        vc[begin + j] = unsigned_codes.nearest(v_max > 0.f ? v[j] / v_max : 0.f);
      }
    }
  });
}

void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& momentum,
                const SgdHyper& h) {
  float* buf = momentum.defined() ? momentum.data<float>() : nullptr;
  for_each_update(param, grad, master, h.grad_scale, [&](int64_t i, float g, float w) {
    g += h.weight_decay * w;  // coupled weight decay, as torch.optim.SGD
    if (buf) {
      buf[i] = h.momentum * buf[i] + g;
      g = h.nesterov ? g + h.momentum * buf[i] : buf[i];
    }
    return w - h.lr * g;
  });
}

// Adafactor (Shazeer & Stern 2018) with a fixed learning rate, no first moment, update clipping by RMS.
// The gradient is read where it lies (scaled on the fly): the second moments first, then the RMS of the
// update, then the update itself, recomputing u = g / sqrt(v) in each pass instead of storing it.
void adafactor_update(const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& row,
                      const Tensor& col, const AdafactorHyper& h, const Tensor&) {
  const int64_t n = param.numel();
  const bool factored = col.defined();
  const int64_t cols = factored ? param.size(-1) : n, rows = factored ? n / cols : 1;
  const float decay = h.beta2, one_minus = 1.f - h.beta2;
  float* r = row.data<float>();
  float* c = factored ? col.data<float>() : nullptr;
  ChunkSums partial{};
  double rmean = 0.0;
  dispatch_float(grad.dtype(), "adafactor", [&](auto gtag) {
    using G = decltype(gtag);
    const G* gp = grad.data<G>();
    auto g = [&](int64_t i) { return load(gp, i) * h.grad_scale; };
    if (factored) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < rows; ++i) {
        double rs = 0.0;
        for (int64_t j = 0; j < cols; ++j) rs += double(g(i * cols + j)) * g(i * cols + j) + h.eps1;
        r[i] = decay * r[i] + one_minus * float(rs / double(cols));
      }
#pragma omp parallel for schedule(static)
      for (int64_t j = 0; j < cols; ++j) {
        double cs = 0.0;
        for (int64_t i = 0; i < rows; ++i) cs += double(g(i * cols + j)) * g(i * cols + j) + h.eps1;
        c[j] = decay * c[j] + one_minus * float(cs / double(rows));
      }
      double rsum = 0.0;
      for (int64_t i = 0; i < rows; ++i) rsum += r[i];
      rmean = rsum / double(rows);
    } else {
#pragma omp parallel for schedule(static) if (n > kParallelMinWork)
      for (int64_t i = 0; i < n; ++i) r[i] = decay * r[i] + one_minus * (g(i) * g(i) + h.eps1);
    }
  });
  // The update before clipping: u = g / sqrt(v), v = r c / mean(r) when factored.
  auto u = [&](int64_t i, float g) {
    return factored ? g / std::sqrt(float(double(r[i / cols]) * c[i % cols] / rmean)) : g / std::sqrt(r[i]);
  };
  dispatch_float(grad.dtype(), "adafactor", [&](auto gtag) {
    using G = decltype(gtag);
    const G* gp = grad.data<G>();
    sum_fixed_chunks(n, partial, [&](int64_t i) {
      const double x = u(i, load(gp, i) * h.grad_scale);
      return x * x;
    });
  });
  const float rms = float(std::sqrt(total(partial) / double(std::max<int64_t>(n, 1))));
  const float clip = std::max(1.f, rms / h.clip_threshold);
  const float wd = 1.f - h.lr * h.weight_decay;
  for_each_update(param, grad, master, h.grad_scale,
                  [&](int64_t i, float g, float w) { return w * wd - h.lr * u(i, g) / clip; });
}

}  // namespace hr::cpu
