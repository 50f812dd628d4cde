// CPU optimizer updates: one fused pass per parameter, f32 math, vectorisable loops split over threads.
#include <cmath>

#include "core/backend/cpu/cpu_common.h"
#include "core/backend/cpu/cpu_kernels.h"

namespace hr::cpu {

namespace {

// Runs f(i, g) for every element with g the scaled f32 gradient, then writes the result through `out`
// into the master (if any) and the parameter.
template <typename F>
void for_each_update(const Tensor& param, const Tensor& grad, const Tensor& master, float grad_scale, F&& f) {
  const int64_t n = param.numel();
  float* mp = master.defined() ? master.data<float>() : nullptr;
  dispatch_float(param.dtype(), "optimizer", [&](auto ptag) {
    using P = decltype(ptag);
    P* p = param.data<P>();
    dispatch_float(grad.dtype(), "optimizer", [&](auto gtag) {
      using G = decltype(gtag);
      const G* g = grad.data<G>();
#pragma omp parallel for schedule(static) if (n > (1 << 14))
      for (int64_t i = 0; i < n; ++i) {
        const float w = mp ? mp[i] : load(p, i);
        const float updated = f(i, load(g, i) * grad_scale, w);
        if (mp) mp[i] = updated;
        store(p, i, updated);
      }
    });
  });
}

}  // namespace

void adamw_update(const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& m, const Tensor& v,
                  const AdamWHyper& h) {
  float* mp = m.data<float>();
  float* vp = v.data<float>();
  const float bc1 = 1.f - std::pow(h.beta1, float(h.step)), bc2 = 1.f - std::pow(h.beta2, float(h.step));
  const float step_size = h.lr / bc1, bc2_sqrt = std::sqrt(bc2), decay = 1.f - h.lr * h.weight_decay;
  for_each_update(param, grad, master, h.grad_scale, [&](int64_t i, float g, float w) {
    mp[i] = h.beta1 * mp[i] + (1.f - h.beta1) * g;
    vp[i] = h.beta2 * vp[i] + (1.f - h.beta2) * g * g;
    return w * decay - step_size * mp[i] / (std::sqrt(vp[i]) / bc2_sqrt + h.eps);
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
void adafactor_update(const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& row,
                      const Tensor& col, const AdafactorHyper& h) {
  const int64_t n = param.numel();
  const bool factored = col.defined();
  const int64_t cols = factored ? param.size(-1) : n, rows = factored ? n / cols : 1;
  const float decay = h.beta2, one_minus = 1.f - h.beta2;
  std::vector<float> g32 = to_float_vector(grad);
  for (float& x : g32) x *= h.grad_scale;
  float* r = row.data<float>();
  std::vector<float> u(static_cast<std::size_t>(n));
  if (factored) {
    float* c = col.data<float>();
    std::vector<double> rs(static_cast<std::size_t>(rows), 0.0), cs(static_cast<std::size_t>(cols), 0.0);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        const double s = double(g32[i * cols + j]) * g32[i * cols + j] + h.eps1;
        rs[i] += s;
        cs[j] += s;
      }
    double rmean = 0;
    for (int64_t i = 0; i < rows; ++i) {
      r[i] = decay * r[i] + one_minus * float(rs[i] / double(cols));
      rmean += r[i];
    }
    rmean /= double(rows);
    for (int64_t j = 0; j < cols; ++j) c[j] = decay * c[j] + one_minus * float(cs[j] / double(rows));
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        u[i * cols + j] = g32[i * cols + j] / std::sqrt(float(double(r[i]) * c[j] / rmean));
  } else {
    for (int64_t i = 0; i < n; ++i) {
      r[i] = decay * r[i] + one_minus * (g32[i] * g32[i] + h.eps1);
      u[i] = g32[i] / std::sqrt(r[i]);
    }
  }
  double ss = 0;
  for (float x : u) ss += double(x) * x;
  const float rms = float(std::sqrt(ss / double(std::max<int64_t>(n, 1))));
  const float clip = std::max(1.f, rms / h.clip_threshold);
  const float wd = 1.f - h.lr * h.weight_decay;
  Tensor ut = Tensor::wrap(u.data(), param.shape(), DType::F32, core::Device::host(), nullptr);
  for_each_update(param, ut, master, 1.f, [&](int64_t i, float g, float w) { return w * wd - h.lr * g / clip; });
}

}  // namespace hr::cpu
