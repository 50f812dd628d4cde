// Op cases: every op of the core library with a naive double-precision reference.
#include "op_cases.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>

#include "core/ops/attention.h"
#include "core/ops/copy.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/elementwise.h"
#include "core/ops/embedding.h"
#include "core/ops/linear.h"
#include "core/ops/norm.h"
#include "core/ops/quant_linear.h"
#include "core/ops/reduce.h"
#include "core/ops/softmax.h"

namespace hr::test {

using namespace hr::core;

namespace {

int64_t numel(const Shape& s) {
  return shape_numel(s);
}

Input rnd(const Shape& shape, double lo = -1.0, double hi = 1.0, bool diff = true) {
  static std::mt19937 rng(1234);
  std::uniform_real_distribution<double> u(lo, hi);
  Input in{shape, false, diff, {}};
  for (int64_t i = 0; i < numel(shape); ++i) in.values.push_back(u(rng));
  return in;
}

Input ints(const Shape& shape, std::vector<double> v) {
  return Input{shape, true, false, std::move(v)};
}

std::vector<double> linear_ref(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>* b,
                               int64_t rows, int64_t in, int64_t out) {
  std::vector<double> y(std::size_t(rows * out));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = b ? (*b)[o] : 0.0;
      for (int64_t i = 0; i < in; ++i) s += x[r * in + i] * w[o * in + i];
      y[r * out + o] = s;
    }
  return y;
}

double gelu_ref(double x) {
  return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
}
double sigmoid_ref(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

std::vector<double> unary_ref(UnaryOp op, const std::vector<double>& x) {
  std::vector<double> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    double v = x[i];
    switch (op) {
      case UnaryOp::Gelu:
        y[i] = gelu_ref(v);
        break;
      case UnaryOp::GeluTanh:
        y[i] = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
        break;
      case UnaryOp::QuickGelu:
        y[i] = v * sigmoid_ref(1.702 * v);
        break;
      case UnaryOp::Silu:
        y[i] = v * sigmoid_ref(v);
        break;
    }
  }
  return y;
}

std::vector<double> norm_ref(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>* b,
                             int64_t cols, bool layer, double eps) {
  std::vector<double> y(x.size());
  for (std::size_t r = 0; r < x.size() / cols; ++r) {
    const double* xr = &x[r * cols];
    double m = 0.0, v = 0.0;
    if (layer) {
      for (int64_t c = 0; c < cols; ++c) m += xr[c];
      m /= double(cols);
    }
    for (int64_t c = 0; c < cols; ++c) v += (xr[c] - m) * (xr[c] - m);
    v /= double(cols);
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = (xr[c] - m) / std::sqrt(v + eps) * w[c] + (b ? (*b)[c] : 0.0);
  }
  return y;
}

// RoPE of x (2, 5, 3, 8) at positions (2, 5), base 10000.
std::vector<double> rope_ref(const Values& v) {
  std::vector<double> y(v[0].size());
  for (int bs = 0; bs < 10; ++bs)
    for (int h = 0; h < 3; ++h)
      for (int i = 0; i < 4; ++i) {
        double ang = v[1][bs] * std::pow(10000.0, -2.0 * i / 8.0);
        int o = (bs * 3 + h) * 8;
        double x1 = v[0][o + i], x2 = v[0][o + i + 4];
        y[o + i] = x1 * std::cos(ang) - x2 * std::sin(ang);
        y[o + i + 4] = x2 * std::cos(ang) + x1 * std::sin(ang);
      }
  return y;
}

// Naive attention with a full score matrix per (batch, head); with a window (causal only) query i, at key position
// p = i + Lk - Lq, sees the keys p - window < j <= p, as transformers' Mistral masks them.
std::vector<double> attention_ref(const Values& in, int64_t B, int64_t Lq, int64_t Lk, int64_t Hq, int64_t Hk,
                                  int64_t D, bool causal, int64_t window = 0) {
  const auto &q = in[0], &k = in[1], &v = in[2];
  const double scale = 1.0 / std::sqrt(double(D));
  std::vector<double> out(std::size_t(B * Lq * Hq * D), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kh = h / (Hq / Hk);
      for (int64_t i = 0; i < Lq; ++i) {
        std::vector<double> s(std::size_t(Lk), -INFINITY);
        double mx = -INFINITY;
        for (int64_t j = 0; j < Lk; ++j) {
          if (causal && j > i + Lk - Lq) continue;
          if (causal && window > 0 && j <= i + Lk - Lq - window) continue;
          double acc = 0.0;
          for (int64_t d = 0; d < D; ++d)
            acc += q[((b * Lq + i) * Hq + h) * D + d] * k[((b * Lk + j) * Hk + kh) * D + d];
          s[j] = acc * scale;
          mx = std::max(mx, s[j]);
        }
        double z = 0.0;
        for (int64_t j = 0; j < Lk; ++j) z += s[j] == -INFINITY ? 0.0 : std::exp(s[j] - mx);
        for (int64_t j = 0; j < Lk; ++j) {
          if (s[j] == -INFINITY) continue;
          const double p = std::exp(s[j] - mx) / z;
          for (int64_t d = 0; d < D; ++d)
            out[((b * Lq + i) * Hq + h) * D + d] += p * v[((b * Lk + j) * Hk + kh) * D + d];
        }
      }
    }
  return out;
}

// The fused cross-entropy of `labels.size()` rows of 8 over a vocabulary of 13, in 3-row chunks, normalized by the
// labelled count; `labelled_rows` as CrossEntropyOptions takes it.
OpCase cross_entropy_case(const std::string& name, const std::vector<double>& labels, int64_t labelled_rows) {
  const int64_t rows = int64_t(labels.size());
  const double valid = double(std::count_if(labels.begin(), labels.end(), [](double l) { return l != -100; }));
  OpCase c;
  c.name = name;
  c.inputs = {rnd({rows, 8}, -2, 2), rnd({13, 8}), ints({rows}, labels)};
  CrossEntropyOptions o;
  o.normalizer = float(valid);
  o.chunk_rows = 3;
  o.labelled_rows = labelled_rows;
  c.forward = [=](const std::vector<Tensor>& t) { return cross_entropy_forward(t[0], t[1], t[2], o).loss; };
  c.backward = [=](const std::vector<Tensor>& t, const Tensor& dy) {
    CrossEntropyOut saved = cross_entropy_forward(t[0], t[1], t[2], o);
    CrossEntropyGrads g = cross_entropy_backward(dy, t[0], t[1], t[2], saved, o);
    return std::vector<Tensor>{g.dhidden, g.dweight};
  };
  c.reference = [rows, valid](const Values& v) {
    std::vector<double> logits = linear_ref(v[0], v[1], nullptr, rows, 8, 13);
    double loss = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      if (v[2][r] == -100) continue;
      double mx = -INFINITY, z = 0.0;
      for (int j = 0; j < 13; ++j) mx = std::max(mx, logits[r * 13 + j]);
      for (int j = 0; j < 13; ++j) z += std::exp(logits[r * 13 + j] - mx);
      loss += mx + std::log(z) - logits[r * 13 + int(v[2][r])];
    }
    return std::vector<double>{loss / valid};
  };
  return c;
}

OpCase attention_case(const std::string& name, int64_t B, int64_t Lq, int64_t Lk, int64_t Hq, int64_t Hk, int64_t D,
                      bool causal, int64_t window = 0) {
  const Mask mask = causal ? Mask::Causal : Mask::None;
  const float scale = 1.f / std::sqrt(float(D));
  OpCase c;
  c.name = name;
  c.inputs = {rnd({B, Lq, Hq, D}, -2, 2), rnd({B, Lk, Hk, D}, -2, 2), rnd({B, Lk, Hk, D})};
  c.forward = [=](const std::vector<Tensor>& t) {
    return attention_forward(t[0], t[1], t[2], mask, scale, window).out;
  };
  c.backward = [=](const std::vector<Tensor>& t, const Tensor& dy) {
    AttentionOut saved = attention_forward(t[0], t[1], t[2], mask, scale, window);
    AttentionGrads g = attention_backward(dy, t[0], t[1], t[2], saved, mask, scale, window);
    return std::vector<Tensor>{g.dq, g.dk, g.dv};
  };
  c.reference = [=](const Values& v) { return attention_ref(v, B, Lq, Lk, Hq, Hk, D, causal, window); };
  c.attention = AttentionDesc{B, Lq, Lk, Hq, Hk, D, DType::F32, mask, window};
  return c;
}

// Queries against a KV cache (generation; forward only): row b's query i at position past[b] + i sees the cache
// entries j <= past[b] + i, nothing beyond (those rows hold values that must not leak in); with a window only the
// last `window` of them.
OpCase attention_cached_case(const std::string& name, int64_t window) {
  const int64_t B = 2, Lq = 2, cap = 9, Hq = 4, Hk = 2, D = 8;
  const std::vector<double> past = {3, 6};
  const float scale = 1.f / std::sqrt(float(D));
  OpCase c;
  c.name = name;
  c.inputs = {rnd({B, Lq, Hq, D}, -2, 2), rnd({B, cap, Hk, D}, -2, 2), rnd({B, cap, Hk, D}), ints({B}, past)};
  c.forward = [=](const std::vector<Tensor>& t) { return attention_cached(t[0], t[1], t[2], t[3], scale, window).out; };
  c.attention = AttentionDesc{B, Lq, cap, Hq, Hk, D, DType::F32, Mask::Causal, window};
  c.kv_cache = true;
  c.reference = [=](const Values& v) {
    std::vector<double> out;
    for (int64_t b = 0; b < B; ++b) {
      // Row b alone, its cache cut after its last query's position: plain causal (or windowed) attention.
      const int64_t kv = int64_t(past[std::size_t(b)]) + Lq;
      Values row(3);
      row[0].assign(v[0].begin() + b * Lq * Hq * D, v[0].begin() + (b + 1) * Lq * Hq * D);
      for (int i : {1, 2})
        row[std::size_t(i)].assign(v[std::size_t(i)].begin() + b * cap * Hk * D,
                                   v[std::size_t(i)].begin() + (b * cap + kv) * Hk * D);
      const std::vector<double> o = attention_ref(row, 1, Lq, kv, Hq, Hk, D, true, window);
      out.insert(out.end(), o.begin(), o.end());
    }
    return out;
  };
  return c;
}

OpCase unary_case(UnaryOp op) {
  OpCase c;
  c.name = unary_name(op);
  c.inputs = {rnd({5, 9}, -4, 4)};
  c.forward = [=](const std::vector<Tensor>& t) { return unary_forward(op, t[0]); };
  c.backward = [=](const std::vector<Tensor>& t, const Tensor& dy) {
    return std::vector<Tensor>{unary_backward(op, t[0], dy)};
  };
  c.reference = [=](const Values& v) { return unary_ref(op, v[0]); };
  return c;
}

// A linear layer's bias add fused into the activation after it (x + bias, then op): out = op(h) + h with h = x + bias,
// so the pre-activation the forward leaves in h carries a gradient of its own; the bias's gradient is dh summed over
// the rows. x is copied first: the forward adds into it in place. 97 columns: the packs and stretches of the
// kernels cross the rows' ends, and a 582-element x takes two of the CPU's 512-element stretches.
OpCase bias_activation_case(UnaryOp op, Shape shape) {
  OpCase c;
  c.name = std::string(unary_name(op)) + "_bias";
  const int64_t cols = shape.back();
  c.inputs = {rnd(shape, -3, 3), rnd({cols})};
  c.forward = [=](const std::vector<Tensor>& t) {
    Tensor h = axpby(1.f, t[0], 0.f, t[0]);
    Tensor y = unary_forward(op, h, t[1]);
    add_(y, h);
    return y;
  };
  c.backward = [=](const std::vector<Tensor>& t, const Tensor& dy) {
    Tensor h = axpby(1.f, t[0], 0.f, t[0]);
    unary_forward(op, h, t[1]);
    Tensor dh = unary_backward(op, h, dy);
    add_(dh, dy);
    Tensor db = Tensor::empty({cols}, t[1].dtype(), t[1].device());
    sum_leading(dh, db, Accumulate::No);
    return std::vector<Tensor>{dh, db};
  };
  c.reference = [=](const Values& v) {
    std::vector<double> h(v[0].size());
    for (std::size_t i = 0; i < h.size(); ++i) h[i] = v[0][i] + v[1][i % std::size_t(cols)];
    std::vector<double> y = unary_ref(op, h);
    for (std::size_t i = 0; i < h.size(); ++i) y[i] += h[i];
    return y;
  };
  return c;
}

// The same op on empty inputs: the reference of an empty output is empty (or a zero loss).
std::vector<OpCase> empty_cases() {
  std::vector<OpCase> v;
  auto none = [](const Values&) { return std::vector<double>{}; };
  {
    OpCase c;
    c.name = "add_empty";
    c.inputs = {rnd({0, 6}), rnd({6})};
    c.forward = [](const std::vector<Tensor>& t) { return add(t[0], t[1]); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      AddGrads g = axpby_backward(dy, 1.f, 1.f, t[1]);
      return std::vector<Tensor>{g.da, g.db};
    };
    c.reference = none;
    v.push_back(c);
  }
  {
    OpCase c;
    c.name = "mul_empty";
    c.inputs = {rnd({0, 6}), rnd({6})};
    c.forward = [](const std::vector<Tensor>& t) { return mul(t[0], t[1]); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      MulGrads g = mul_backward(dy, t[0], t[1]);
      return std::vector<Tensor>{g.da, g.db};
    };
    c.reference = none;
    v.push_back(c);
  }
  {
    OpCase c = unary_case(UnaryOp::Silu);
    c.name = "silu_empty";
    c.inputs = {rnd({0, 9})};
    c.reference = none;
    v.push_back(c);
  }
  {
    OpCase c = bias_activation_case(UnaryOp::QuickGelu, {0, 9});
    c.name = "quick_gelu_bias_empty";
    c.reference = none;
    v.push_back(c);
  }
  {
    OpCase c;
    c.name = "swiglu_empty";
    c.inputs = {rnd({0, 10}), rnd({0, 10})};
    c.forward = [](const std::vector<Tensor>& t) { return swiglu_forward(t[0], t[1]); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      SwigluGrads g = swiglu_backward(t[0], t[1], dy);
      return std::vector<Tensor>{g.dgate, g.dup};
    };
    c.reference = none;
    v.push_back(c);
  }
  {
    OpCase c;
    c.name = "dropout_empty";
    c.inputs = {rnd({0, 5})};
    c.forward = [](const std::vector<Tensor>& t) { return dropout(t[0], 0.25f, 7); };
    c.backward = [](const std::vector<Tensor>&, const Tensor& dy) {
      return std::vector<Tensor>{dropout(dy, 0.25f, 7)};
    };
    c.reference = none;
    v.push_back(c);
  }
  {
    OpCase c;
    c.name = "layernorm_empty";
    c.inputs = {rnd({0, 16}), rnd({16}, 0.5, 1.5), rnd({16})};
    c.forward = [](const std::vector<Tensor>& t) { return layernorm_forward(t[0], t[1], t[2], 1e-5f).y; };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      NormOut o = layernorm_forward(t[0], t[1], t[2], 1e-5f);
      NormGrads g = layernorm_backward(dy, t[0], t[1], Bias::Yes, o.saved);
      return std::vector<Tensor>{g.dx, g.dweight, g.dbias};
    };
    c.reference = none;
    v.push_back(c);
  }
  {
    OpCase c;
    c.name = "softmax_empty";
    c.inputs = {rnd({0, 12})};
    c.forward = [](const std::vector<Tensor>& t) { return softmax_forward(t[0]); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      return std::vector<Tensor>{softmax_backward(softmax_forward(t[0]), dy)};
    };
    c.reference = none;
    v.push_back(c);
  }
  {
    OpCase c;
    c.name = "rope_empty";
    c.inputs = {rnd({0, 5, 3, 8}), ints({0, 5}, {})};
    c.forward = [](const std::vector<Tensor>& t) { return rope_forward(t[0], t[1], 10000.f); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      return std::vector<Tensor>{rope_backward(dy, t[1], 10000.f)};
    };
    c.reference = none;
    v.push_back(c);
  }
  {
    OpCase c;
    c.name = "embedding_empty";
    c.inputs = {ints({0}, {}), rnd({7, 6})};
    c.forward = [](const std::vector<Tensor>& t) { return embedding_forward(t[0], t[1]); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      return std::vector<Tensor>{embedding_backward(t[0], dy, t[1].shape(), t[1].dtype())};
    };
    c.reference = none;
    v.push_back(c);
  }
  {
    OpCase c;
    c.name = "linear_empty";
    c.inputs = {rnd({0, 8}), rnd({5, 8}), rnd({5})};
    c.forward = [](const std::vector<Tensor>& t) { return linear_forward(t[0], t[1], t[2]); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      LinearGrads g = linear_backward(dy, t[0], t[1], Bias::Yes);
      return std::vector<Tensor>{g.dx, g.dw, g.dbias};
    };
    c.reference = none;
    v.push_back(c);
  }
  {
    OpCase c;
    c.name = "sum_empty";
    c.inputs = {rnd({0, 7})};
    c.forward = [](const std::vector<Tensor>& t) { return sum(t[0]); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      return std::vector<Tensor>{sum_backward(dy, t[0])};
    };
    c.reference = [](const Values&) { return std::vector<double>{0.0}; };
    v.push_back(c);
  }
  {
    OpCase c;
    c.name = "cross_entropy_empty";
    c.inputs = {rnd({0, 8}), rnd({13, 8}), ints({0}, {})};
    c.forward = [](const std::vector<Tensor>& t) { return cross_entropy_forward(t[0], t[1], t[2], {}).loss; };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      CrossEntropyOut saved = cross_entropy_forward(t[0], t[1], t[2], {});
      CrossEntropyGrads g = cross_entropy_backward(dy, t[0], t[1], t[2], saved, {});
      return std::vector<Tensor>{g.dhidden, g.dweight};
    };
    c.reference = [](const Values&) { return std::vector<double>{0.0}; };
    v.push_back(c);
  }
  {
    OpCase c = attention_case("attention_empty", 0, 4, 4, 2, 2, 8, true);
    c.reference = none;
    v.push_back(c);
  }
  {  // keys without queries: no output, zero key and value gradients
    OpCase c = attention_case("attention_no_queries", 1, 0, 16, 2, 2, 8, false);
    c.reference = none;
    v.push_back(c);
  }
  {
    OpCase c;
    c.name = "patchify_empty";
    c.inputs = {rnd({0, 3, 8, 12})};
    c.forward = [](const std::vector<Tensor>& t) { return patchify(t[0], 4); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      return std::vector<Tensor>{patchify_backward(dy, t[0].shape(), 4)};
    };
    c.reference = none;
    v.push_back(c);
  }
  {
    OpCase c;
    c.name = "transpose_copy_empty";
    c.inputs = {rnd({2, 0, 7})};
    c.forward = [](const std::vector<Tensor>& t) { return t[0].transpose(1, 2).contiguous(); };
    c.backward = [](const std::vector<Tensor>&, const Tensor& dy) {
      return std::vector<Tensor>{dy.transpose(1, 2).contiguous()};
    };
    c.reference = none;
    v.push_back(c);
  }
  for (OpCase& c : v) c.empty = true;
  return v;
}

// Shapes the GPU kernels split across blocks (sizing_rules.h, bitonic.h); small enough for the double reference.
std::vector<OpCase> large_cases() {
  std::vector<OpCase> v;
  {  // a bias gradient over many rows: several stretches of rows, added in order
    OpCase c;
    c.name = "add_broadcast_rows";
    c.inputs = {rnd({1500, 40}), rnd({40})};
    c.forward = [](const std::vector<Tensor>& t) { return add(t[0], t[1]); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      AddGrads g = axpby_backward(dy, 1.f, 1.f, t[1]);
      return std::vector<Tensor>{g.da, g.db};
    };
    c.reference = [](const Values& x) {
      std::vector<double> y(x[0].size());
      for (std::size_t i = 0; i < y.size(); ++i) y[i] = x[0][i] + x[1][i % 40];
      return y;
    };
    v.push_back(c);
  }
  {  // a norm's weight and bias gradients over many rows
    OpCase c;
    c.name = "layernorm_rows";
    c.inputs = {rnd({1300, 24}, -2, 2), rnd({24}, 0.5, 1.5), rnd({24})};
    c.forward = [](const std::vector<Tensor>& t) { return layernorm_forward(t[0], t[1], t[2], 1e-5f).y; };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      NormOut o = layernorm_forward(t[0], t[1], t[2], 1e-5f);
      NormGrads g = layernorm_backward(dy, t[0], t[1], Bias::Yes, o.saved);
      return std::vector<Tensor>{g.dx, g.dweight, g.dbias};
    };
    c.reference = [](const Values& x) { return norm_ref(x[0], x[1], &x[2], 24, true, 1e-5); };
    c.tol_bf16_bwd = 8e-2;  // 1,300 rows of bf16 terms in each weight-gradient sum
    v.push_back(c);
  }
  {  // 2,600 tokens (beyond one 2,048-key chunk of the sort), one id taking every third position
    OpCase c;
    c.name = "embedding_hot_id";
    std::vector<double> ids;
    std::mt19937 rng(5);
    for (int i = 0; i < 2600; ++i) ids.push_back(i % 3 == 0 ? 4.0 : double(rng() % 37));
    c.inputs = {ints({2600}, ids), rnd({37, 12})};
    c.forward = [](const std::vector<Tensor>& t) { return embedding_forward(t[0], t[1]); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      return std::vector<Tensor>{embedding_backward(t[0], dy, t[1].shape(), t[1].dtype())};
    };
    c.reference = [](const Values& x) {
      std::vector<double> y;
      for (double id : x[0])
        for (int d = 0; d < 12; ++d) y.push_back(x[1][int(id) * 12 + d]);
      return y;
    };
    c.tol_bf16_bwd = 0.25;  // a bf16 table gradient rounds at each of its ~870 adds, as the twin's does
    v.push_back(c);
  }
  return v;
}

// Linear layers and matrix products (dense and over a quantized weight).
std::vector<OpCase> linear_cases() {
  std::vector<OpCase> cases;
  {  // linear with bias, 3-D input
    OpCase c;
    c.name = "linear";
    c.inputs = {rnd({2, 3, 8}), rnd({5, 8}), rnd({5})};
    c.forward = [](const std::vector<Tensor>& t) { return linear_forward(t[0], t[1], t[2]); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      LinearGrads g = linear_backward(dy, t[0], t[1], Bias::Yes);
      return std::vector<Tensor>{g.dx, g.dw, g.dbias};
    };
    c.reference = [](const Values& v) { return linear_ref(v[0], v[1], &v[2], 6, 8, 5); };
    cases.push_back(c);
  }
  {  // linear without bias, gradient accumulated into an existing buffer
    OpCase c;
    c.name = "linear_accumulate";
    c.inputs = {rnd({4, 8}), rnd({6, 8})};
    c.forward = [](const std::vector<Tensor>& t) { return linear_forward(t[0], t[1], Tensor()); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      // Half the gradient twice into one buffer equals the gradient.
      Tensor half = scale(dy, 0.5f);
      Tensor dw = Tensor::zeros(t[1].shape(), t[1].dtype(), t[1].device());
      LinearBackwardOptions o;
      o.accumulate = Accumulate::Yes;
      o.dw_into = dw;
      LinearGrads g1 = linear_backward(half, t[0], t[1], Bias::No, o);
      LinearGrads g2 = linear_backward(half, t[0], t[1], Bias::No, o);
      return std::vector<Tensor>{add(g1.dx, g2.dx), dw};
    };
    c.reference = [](const Values& v) { return linear_ref(v[0], v[1], nullptr, 4, 8, 6); };
    cases.push_back(c);
  }
  {
    OpCase c;
    c.name = "matmul";
    c.inputs = {rnd({2, 3, 4, 5}), rnd({2, 3, 5, 6})};
    c.forward = [](const std::vector<Tensor>& t) { return matmul_forward(t[0], t[1]); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      MatmulGrads g = matmul_backward(dy, t[0], t[1]);
      return std::vector<Tensor>{g.da, g.db};
    };
    c.reference = [](const Values& v) {
      std::vector<double> y(6 * 4 * 6, 0.0);
      for (int b = 0; b < 6; ++b)
        for (int i = 0; i < 4; ++i)
          for (int j = 0; j < 6; ++j)
            for (int k = 0; k < 5; ++k) y[(b * 4 + i) * 6 + j] += v[0][(b * 4 + i) * 5 + k] * v[1][(b * 5 + k) * 6 + j];
      return y;
    };
    cases.push_back(c);
  }
  {  // a linear layer over an NF4 weight with double quantization: forward and input gradient in uneven tiles
    OpCase c;
    c.name = "qlinear_nf4";
    c.inputs = {rnd({2, 3, 70})};
    auto w = std::make_shared<std::vector<float>>();
    std::mt19937 rng(99);
    std::normal_distribution<float> d(0.f, 0.1f);
    for (int i = 0; i < 5 * 70; ++i) w->push_back(d(rng));
    QuantFormat f;
    f.double_quant = true;
    auto blob = std::make_shared<std::vector<uint8_t>>(quantize(w->data(), 5, 70, f));
    const QuantLayout l = QuantLayout::of(f, 5, 70);
    auto on = [blob](Device dev) {
      return Tensor::wrap(blob->data(), {int64_t(blob->size())}, DType::U8, Device::host(), [] {}).to(dev);
    };
    c.forward = [on, l](const std::vector<Tensor>& t) {
      return qlinear_forward(t[0], on(t[0].device()), l, Tensor(), 2 * 70 * int64_t(dtype_size(t[0].dtype())));
    };
    c.backward = [on, l](const std::vector<Tensor>& t, const Tensor& dy) {
      return std::vector<Tensor>{
          qlinear_backward_dx(dy, on(t[0].device()), l, 3 * 5 * int64_t(dtype_size(t[0].dtype())))};
    };
    c.reference = [blob, l](const Values& v) {
      const std::vector<float> wq = dequantize(blob->data(), l);
      return linear_ref(v[0], std::vector<double>(wq.begin(), wq.end()), nullptr, 6, 70, 5);
    };
    cases.push_back(c);
  }
  return cases;
}

// Element-wise ops: broadcasting adds and products, scaling, the activations, SwiGLU.
std::vector<OpCase> elementwise_cases() {
  std::vector<OpCase> cases;
  {  // add with a broadcast bias row, via axpby
    OpCase c;
    c.name = "add_broadcast";
    c.inputs = {rnd({4, 6}), rnd({6})};
    c.forward = [](const std::vector<Tensor>& t) { return add(t[0], t[1]); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      AddGrads g = axpby_backward(dy, 1.f, 1.f, t[1]);
      return std::vector<Tensor>{g.da, g.db};
    };
    c.reference = [](const Values& v) {
      std::vector<double> y(24);
      for (int i = 0; i < 24; ++i) y[i] = v[0][i] + v[1][i % 6];
      return y;
    };
    cases.push_back(c);
  }
  {
    OpCase c;
    c.name = "sub";
    c.inputs = {rnd({3, 5}), rnd({3, 5})};
    c.forward = [](const std::vector<Tensor>& t) { return sub(t[0], t[1]); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      AddGrads g = axpby_backward(dy, 1.f, -1.f, t[1]);
      return std::vector<Tensor>{g.da, g.db};
    };
    c.reference = [](const Values& v) {
      std::vector<double> y(15);
      for (int i = 0; i < 15; ++i) y[i] = v[0][i] - v[1][i];
      return y;
    };
    cases.push_back(c);
  }
  {
    OpCase c;
    c.name = "mul_broadcast";
    c.inputs = {rnd({4, 6}), rnd({6})};
    c.forward = [](const std::vector<Tensor>& t) { return mul(t[0], t[1]); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      MulGrads g = mul_backward(dy, t[0], t[1]);
      return std::vector<Tensor>{g.da, g.db};
    };
    c.reference = [](const Values& v) {
      std::vector<double> y(24);
      for (int i = 0; i < 24; ++i) y[i] = v[0][i] * v[1][i % 6];
      return y;
    };
    cases.push_back(c);
  }
  {
    OpCase c;
    c.name = "scale";
    c.inputs = {rnd({5, 7})};
    c.forward = [](const std::vector<Tensor>& t) { return scale(t[0], 0.37f); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      return std::vector<Tensor>{scale_backward(dy, 0.37f)};
    };
    c.reference = [](const Values& v) {
      std::vector<double> y = v[0];
      for (double& e : y) e *= double(0.37f);
      return y;
    };
    cases.push_back(c);
  }
  for (UnaryOp op : {UnaryOp::Gelu, UnaryOp::GeluTanh, UnaryOp::QuickGelu, UnaryOp::Silu})
    cases.push_back(unary_case(op)), cases.push_back(bias_activation_case(op, {6, 97}));
  {
    OpCase c;
    c.name = "swiglu";
    c.inputs = {rnd({4, 10}, -3, 3), rnd({4, 10})};
    c.forward = [](const std::vector<Tensor>& t) { return swiglu_forward(t[0], t[1]); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      SwigluGrads g = swiglu_backward(t[0], t[1], dy);
      return std::vector<Tensor>{g.dgate, g.dup};
    };
    c.reference = [](const Values& v) {
      std::vector<double> y(40);
      for (int i = 0; i < 40; ++i) y[i] = v[0][i] * sigmoid_ref(v[0][i]) * v[1][i];
      return y;
    };
    cases.push_back(c);
  }
  return cases;
}

// A layer norm (weight and bias) or an RMS norm (weight) over `rows` x `cols`, forward and backward.
OpCase norm_case(const std::string& name, bool layer, int64_t rows, int64_t cols) {
  OpCase c;
  c.name = name;
  if (layer) {
    c.inputs = {rnd({rows, cols}, -2, 2), rnd({cols}, 0.5, 1.5), rnd({cols})};
    c.forward = [](const std::vector<Tensor>& t) { return layernorm_forward(t[0], t[1], t[2], 1e-5f).y; };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      NormOut o = layernorm_forward(t[0], t[1], t[2], 1e-5f);
      NormGrads g = layernorm_backward(dy, t[0], t[1], Bias::Yes, o.saved);
      return std::vector<Tensor>{g.dx, g.dweight, g.dbias};
    };
    c.reference = [cols](const Values& v) { return norm_ref(v[0], v[1], &v[2], cols, true, 1e-5); };
  } else {
    c.inputs = {rnd({rows, cols}, -2, 2), rnd({cols}, 0.5, 1.5)};
    c.forward = [](const std::vector<Tensor>& t) { return rmsnorm_forward(t[0], t[1], 1e-6f).y; };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      NormOut o = rmsnorm_forward(t[0], t[1], 1e-6f);
      NormGrads g = rmsnorm_backward(dy, t[0], t[1], o.saved);
      return std::vector<Tensor>{g.dx, g.dweight};
    };
    c.reference = [cols](const Values& v) { return norm_ref(v[0], v[1], nullptr, cols, false, 1e-6); };
  }
  return c;
}

// The sum of one tensor's elements, forward and backward.
OpCase sum_case(const std::string& name, const Input& x) {
  OpCase c;
  c.name = name;
  c.inputs = {x};
  c.forward = [](const std::vector<Tensor>& t) { return sum(t[0]); };
  c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
    return std::vector<Tensor>{sum_backward(dy, t[0])};
  };
  c.reference = [](const Values& v) {
    double s = 0;
    for (double e : v[0]) s += e;
    return std::vector<double>{s};
  };
  return c;
}

// The global norm of two tensors, forward and backward.
OpCase global_norm_case(const std::string& name, const Input& a, const Input& b) {
  OpCase c;
  c.name = name;
  c.inputs = {a, b};
  c.forward = [](const std::vector<Tensor>& t) { return global_norm({t[0], t[1]}); };
  c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
    return global_norm_backward(dy, {t[0], t[1]}, global_norm({t[0], t[1]}));
  };
  c.reference = [](const Values& v) {
    double s = 0;
    for (const auto& x : v)
      for (double e : x) s += e * e;
    return std::vector<double>{std::sqrt(s)};
  };
  return c;
}

// Ops over rows: the norms, softmax, the fused cross-entropy, whole-tensor sums.
std::vector<OpCase> row_cases() {
  std::vector<OpCase> cases;
  cases.push_back(norm_case("layernorm", true, 6, 16));
  cases.push_back(norm_case("rmsnorm", false, 6, 16));
  // Rows of 21 (two blocks of the row sums' 8 lanes and a tail of 5), over more rows than threads.
  cases.push_back(norm_case("layernorm_cols21", true, 9, 21));
  cases.push_back(norm_case("rmsnorm_cols21", false, 9, 21));
  // Rows wide enough for several warps of 16-byte packs, one or more packs a thread (the CUDA kernels hold such rows
  // in registers): 3,072 columns are 384 bf16 packs (256 threads, two packs each, the second for half of them) and
  // 768 f32 ones (three a thread); 1,032 are 129 bf16 packs, one thread past four whole warps.
  cases.push_back(norm_case("layernorm_wide", true, 3, 1032));
  cases.push_back(norm_case("rmsnorm_wide", false, 3, 3072));
  // The fused residual add (a pre-norm block's h = x + r feeding the norm): out = h + norm(h), so the backward's
  // add_to_dx carries the residual stream's gradient. x is copied first: the forward adds into it in place.
  // Rows of 16 and "_wide" ones of 2,048, a Llama-sized row (256 bf16 packs, one a thread; 512 f32 ones, two a
  // thread), take the CUDA kernels' packed path; "_cols21" (not whole packs) their general one, and "_8192" both:
  // 1,024 bf16 or f16 packs (four a thread) and 2,048 f32 ones (eight a thread: the general kernels).
  struct Width {
    int64_t rows, cols;
    const char* suffix;
  };
  for (const Width wd : {Width{6, 16, ""}, Width{9, 21, "_cols21"}, Width{3, 2048, "_wide"}, Width{2, 8192, "_8192"}})
    for (const bool layer : {false, true}) {
      OpCase c;
      c.name = std::string(layer ? "layernorm_residual" : "rmsnorm_residual") + wd.suffix;
      const int64_t rows = wd.rows, cols = wd.cols;
      c.inputs = {rnd({rows, cols}, -2, 2), rnd({rows, cols}, -1, 1), rnd({cols}, 0.5, 1.5)};
      if (layer) c.inputs.push_back(rnd({cols}));
      auto norm = [layer](const std::vector<Tensor>& t, const Tensor& h) {
        return layer ? layernorm_forward(h, t[2], t[3], 1e-5f, t[1]) : rmsnorm_forward(h, t[2], 1e-6f, t[1]);
      };
      c.forward = [norm](const std::vector<Tensor>& t) {
        Tensor h = axpby(1.f, t[0], 0.f, t[0]);
        Tensor y = norm(t, h).y;
        add_(y, h);
        return y;
      };
      c.backward = [norm, layer](const std::vector<Tensor>& t, const Tensor& dy) {
        Tensor h = axpby(1.f, t[0], 0.f, t[0]);
        NormOut o = norm(t, h);
        NormBackwardOptions opt;
        opt.add_to_dx = dy;
        NormGrads g = layer ? layernorm_backward(dy, h, t[2], Bias::Yes, o.saved, opt)
                            : rmsnorm_backward(dy, h, t[2], o.saved, opt);
        std::vector<Tensor> grads{g.dx, g.dx, g.dweight};
        if (layer) grads.push_back(g.dbias);
        return grads;
      };
      c.reference = [layer, cols](const Values& v) {
        std::vector<double> h(v[0].size());
        for (std::size_t i = 0; i < h.size(); ++i) h[i] = v[0][i] + v[1][i];
        std::vector<double> y =
            layer ? norm_ref(h, v[2], &v[3], cols, true, 1e-5) : norm_ref(h, v[2], nullptr, cols, false, 1e-6);
        for (std::size_t i = 0; i < h.size(); ++i) y[i] += h[i];
        return y;
      };
      cases.push_back(c);
    }
  {
    OpCase c;
    c.name = "softmax";
    c.inputs = {rnd({4, 12}, -3, 3)};
    c.forward = [](const std::vector<Tensor>& t) { return softmax_forward(t[0]); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      return std::vector<Tensor>{softmax_backward(softmax_forward(t[0]), dy)};
    };
    c.reference = [](const Values& v) {
      std::vector<double> y(48);
      for (int r = 0; r < 4; ++r) {
        double mx = -INFINITY, z = 0;
        for (int i = 0; i < 12; ++i) mx = std::max(mx, v[0][r * 12 + i]);
        for (int i = 0; i < 12; ++i) z += std::exp(v[0][r * 12 + i] - mx);
        for (int i = 0; i < 12; ++i) y[r * 12 + i] = std::exp(v[0][r * 12 + i] - mx) / z;
      }
      return y;
    };
    cases.push_back(c);
  }
  // fused cross-entropy in 3-row chunks with ignored labels
  cases.push_back(cross_entropy_case("cross_entropy", {3, -100, 0, 12, 5, -100, 7, 7, 1, 11}, -1));
  // the same loss with its labelled rows first and the chunks past them skipped (CrossEntropyOptions::labelled_rows)
  cases.push_back(
      cross_entropy_case("cross_entropy_labelled_first", {3, 0, 12, 5, -100, -100, -100, -100, -100, -100, -100}, 4));
  cases.push_back(sum_case("sum", rnd({5, 7})));
  // 21,007 elements: 64 chunks of ~328 over both threads, each in the sum's 8 lanes with a tail
  cases.push_back(sum_case("sum_long", rnd({3001, 7})));
  {
    OpCase c;
    c.name = "mean";
    c.inputs = {rnd({5, 7})};
    c.forward = [](const std::vector<Tensor>& t) { return mean(t[0]); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      return std::vector<Tensor>{mean_backward(dy, t[0])};
    };
    c.reference = [](const Values& v) {
      double s = 0;
      for (double e : v[0]) s += e;
      return std::vector<double>{s / 35.0};
    };
    cases.push_back(c);
  }
  {  // the inputs drawn in order (a call's arguments are evaluated in no set order)
    const Input a = rnd({3, 4}), b = rnd({5});
    cases.push_back(global_norm_case("global_norm", a, b));
  }
  {  // the same over tensors of 14,995 and 1,001 elements (the sums of squares in lanes, with tails)
    const Input a = rnd({2999, 5}), b = rnd({1001});
    cases.push_back(global_norm_case("global_norm_long", a, b));
  }
  return cases;
}

// Positions, lookups and layouts: RoPE, the embedding, patchify, concatenation, slices, strided copies, casts.
std::vector<OpCase> layout_cases() {
  std::vector<OpCase> cases;
  {  // rotary embedding, positions differ per sample
    OpCase c;
    c.name = "rope";
    c.inputs = {rnd({2, 5, 3, 8}), ints({2, 5}, {0, 1, 2, 3, 4, 7, 8, 9, 10, 11})};
    c.forward = [](const std::vector<Tensor>& t) { return rope_forward(t[0], t[1], 10000.f); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      return std::vector<Tensor>{rope_backward(dy, t[1], 10000.f)};
    };
    c.reference = rope_ref;
    cases.push_back(c);
  }
  {  // the same rotation from the table computed once a step (rope_table), positions differing per sample
    OpCase c;
    c.name = "rope_table";
    c.inputs = {rnd({2, 5, 3, 8}), ints({2, 5}, {0, 1, 2, 3, 4, 7, 8, 9, 10, 11})};
    c.forward = [](const std::vector<Tensor>& t) { return rope_forward(t[0], rope_table(t[1], 8, 10000.f)); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      return std::vector<Tensor>{rope_backward(dy, rope_table(t[1], 8, 10000.f))};
    };
    c.reference = rope_ref;
    cases.push_back(c);
  }
  {  // repeated ids accumulate in the table gradient
    OpCase c;
    c.name = "embedding";
    c.inputs = {ints({2, 5}, {1, 3, 3, 0, 6, 2, 1, 1, 5, 4}), rnd({7, 6})};
    c.forward = [](const std::vector<Tensor>& t) { return embedding_forward(t[0], t[1]); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      return std::vector<Tensor>{embedding_backward(t[0], dy, t[1].shape(), t[1].dtype())};
    };
    c.reference = [](const Values& v) {
      std::vector<double> y;
      for (double id : v[0])
        for (int d = 0; d < 6; ++d) y.push_back(v[1][int(id) * 6 + d]);
      return y;
    };
    cases.push_back(c);
  }
  {  // an AnyRes image's tokens: rows mixed with weights (bilinear taps), the newline row (-1), an empty token and
     // a source row no token reads; the backward is the transposed mix over dy
    OpCase c;
    c.name = "mix_rows";
    const std::vector<double> begin = {0, 1, 5, 6, 6, 8, 9};
    const std::vector<double> row = {2, 0, 1, 3, 4, -1, 4, 0, -1};
    c.inputs = {rnd({5, 6}), rnd({6}), ints({7}, begin), ints({9}, row), rnd({9}, 0.0, 1.0, false)};
    c.forward = [](const std::vector<Tensor>& t) { return mix_rows(t[0], t[1], t[2], t[3], t[4].to(DType::F32)); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      const Device d = dy.device();
      HostMix m;  // the meta device holds no values: a map of the same sizes (the model builds it on the host)
      if (d.type == DeviceType::Meta)
        m = {std::vector<int64_t>(7, 0), std::vector<int64_t>(9, 0), std::vector<float>(9, 0.f)};
      else
        m = transpose_mix(t[2].to_ints(), t[3].to_ints(), t[4].to_floats(), t[0].size(0));
      const Tensor g = mix_rows(dy, {}, Tensor::from_ints(m.begin, {int64_t(m.begin.size())}, DType::I64, d),
                                Tensor::from_ints(m.row, {int64_t(m.row.size())}, DType::I64, d),
                                Tensor::from_floats(m.weight, {int64_t(m.weight.size())}, DType::F32, d));
      return std::vector<Tensor>{g.slice(0, 0, 5).contiguous(), g.slice(0, 5, 6).reshape({6})};
    };
    c.reference = [](const Values& v) {
      std::vector<double> y;
      for (std::size_t t = 0; t + 1 < v[2].size(); ++t)
        for (int d = 0; d < 6; ++d) {
          double s = 0;
          for (auto k = std::size_t(v[2][t]); k < std::size_t(v[2][t + 1]); ++k)
            s += v[4][k] * (v[3][k] < 0 ? v[1][std::size_t(d)] : v[0][std::size_t(v[3][k]) * 6 + std::size_t(d)]);
          y.push_back(s);
        }
      return y;
    };
    cases.push_back(c);
  }
  {
    OpCase c;
    c.name = "patchify";
    c.inputs = {rnd({2, 3, 8, 12})};
    c.forward = [](const std::vector<Tensor>& t) { return patchify(t[0], 4); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      return std::vector<Tensor>{patchify_backward(dy, t[0].shape(), 4)};
    };
    c.reference = [](const Values& v) {
      std::vector<double> y;
      for (int n = 0; n < 2; ++n)
        for (int gy = 0; gy < 2; ++gy)
          for (int gx = 0; gx < 3; ++gx)
            for (int ch = 0; ch < 3; ++ch)
              for (int py = 0; py < 4; ++py)
                for (int px = 0; px < 4; ++px) y.push_back(v[0][((n * 3 + ch) * 8 + gy * 4 + py) * 12 + gx * 4 + px]);
      return y;
    };
    cases.push_back(c);
  }
  {
    OpCase c;
    c.name = "concat";
    c.inputs = {rnd({2, 3, 4}), rnd({2, 5, 4})};
    c.forward = [](const std::vector<Tensor>& t) { return concat({t[0], t[1]}, 1); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) { return concat_backward(dy, {3, 5}, 1); };
    c.reference = [](const Values& v) {
      std::vector<double> y;
      for (int b = 0; b < 2; ++b) {
        y.insert(y.end(), v[0].begin() + b * 12, v[0].begin() + (b + 1) * 12);
        y.insert(y.end(), v[1].begin() + b * 20, v[1].begin() + (b + 1) * 20);
      }
      return y;
    };
    cases.push_back(c);
  }
  {
    OpCase c;
    c.name = "slice";
    c.inputs = {rnd({4, 6, 5})};
    c.forward = [](const std::vector<Tensor>& t) { return slice_copy(t[0], 1, 2, 5); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      return std::vector<Tensor>{slice_backward(dy, t[0].shape(), 1, 2)};
    };
    c.reference = [](const Values& v) {
      std::vector<double> y;
      for (int a = 0; a < 4; ++a)
        for (int b = 2; b < 5; ++b)
          for (int e = 0; e < 5; ++e) y.push_back(v[0][(a * 6 + b) * 5 + e]);
      return y;
    };
    cases.push_back(c);
  }
  {  // a strided copy: a transposed view made contiguous; its backward is the transposed copy back
    OpCase c;
    c.name = "transpose_copy";
    c.inputs = {rnd({2, 6, 7})};
    c.forward = [](const std::vector<Tensor>& t) { return t[0].transpose(1, 2).contiguous(); };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      return std::vector<Tensor>{dy.transpose(1, 2).contiguous()};
    };
    c.reference = [](const Values& v) {
      std::vector<double> y;
      for (int a = 0; a < 2; ++a)
        for (int e = 0; e < 7; ++e)
          for (int b = 0; b < 6; ++b) y.push_back(v[0][(a * 6 + b) * 7 + e]);
      return y;
    };
    cases.push_back(c);
  }
  {  // the middle piece of a split; its backward concatenates zero gradients for the other pieces
    OpCase c;
    c.name = "split";
    c.inputs = {rnd({3, 9})};
    c.forward = [](const std::vector<Tensor>& t) { return split(t[0], {2, 3, 4}, 1)[1]; };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      Tensor z0 = Tensor::zeros({3, 2}, dy.dtype(), dy.device()), z2 = Tensor::zeros({3, 4}, dy.dtype(), dy.device());
      return std::vector<Tensor>{split_backward({z0, dy, z2}, 1)};
    };
    c.reference = [](const Values& v) {
      std::vector<double> y;
      for (int r = 0; r < 3; ++r)
        for (int j = 2; j < 5; ++j) y.push_back(v[0][r * 9 + j]);
      return y;
    };
    cases.push_back(c);
  }
  {  // cast to the other float width and back in the backward
    OpCase c;
    c.name = "cast";
    c.inputs = {rnd({4, 5})};
    c.forward = [](const std::vector<Tensor>& t) {
      return cast(t[0], t[0].dtype() == DType::F32 ? DType::F16 : DType::F32);
    };
    c.backward = [](const std::vector<Tensor>& t, const Tensor& dy) {
      return std::vector<Tensor>{cast_backward(dy, t[0].dtype())};
    };
    c.reference = [](const Values& v) { return v[0]; };
    c.tol_f32 = 1e-3;  // the f32 run produces f16: its rounding is the error
    cases.push_back(c);
  }
  return cases;
}

// Attention: heads grouped or not, causal or not, sliding windows, KV caches, key lengths past the queries, every
// head width.
std::vector<OpCase> attention_cases() {
  std::vector<OpCase> cases;
  // Longer than one 64-row tile, so the online softmax crosses tiles.
  cases.push_back(attention_case("attention_mha", 2, 70, 70, 2, 2, 8, false));
  cases.push_back(attention_case("attention_causal_gqa", 1, 70, 70, 4, 2, 8, true));
  cases.push_back(attention_cached_case("attention_cached", 0));
  cases.push_back(attention_case("attention_causal_kv_longer", 1, 5, 70, 2, 1, 8, true));
  // Sliding windows (Mistral's, Qwen2's): one that starts and ends inside tiles of both the CPU's 64 rows and the
  // GPU's 32, two keys (a query and the one before it; with one, the output is v and the q and k gradients are
  // rounding noise that finite differences cannot check), queries at the end of longer keys, and a KV cache's rows.
  cases.push_back(attention_case("attention_window_gqa", 2, 150, 150, 4, 2, 8, true, 45));
  cases.push_back(attention_case("attention_window_two", 1, 70, 70, 2, 2, 8, true, 2));
  cases.push_back(attention_case("attention_window_kv_longer", 1, 5, 70, 2, 1, 16, true, 7));
  cases.push_back(attention_cached_case("attention_cached_window", 3));
  // Head dims of every width the GPU's tiled kernels take (8 dims a lane at most), with edges inside their tiles:
  // 40 and 96 cuDNN also takes in bf16, 200 (over its 128) only the own kernels.
  cases.push_back(attention_case("attention_d40_gqa", 1, 37, 37, 4, 2, 40, true));
  cases.push_back(attention_case("attention_d96", 2, 33, 33, 2, 2, 96, false));
  cases.push_back(attention_case("attention_d200_kv_longer", 1, 20, 45, 2, 1, 200, true));
  // A head width off the CPU's 8-float vectors (its tiles' transposes and products have column edges).
  cases.push_back(attention_case("attention_d12_gqa", 1, 70, 70, 4, 2, 12, true));
  return cases;
}

}  // namespace

std::vector<OpCase> op_cases() {
  std::vector<OpCase> cases;
  for (auto family : {linear_cases, elementwise_cases, row_cases, layout_cases, attention_cases})
    for (OpCase& c : family()) cases.push_back(std::move(c));
  // Empty tensors: every op takes them (a batch without text rows, a group without images). A GPU launch over no
  // elements is an invalid configuration, so each back-end is held to them here.
  for (const OpCase& e : empty_cases()) cases.push_back(e);
  // Shapes the GPU kernels split across blocks: rows beyond one stretch of the column sums, tokens beyond one
  // chunk of the embedding backward's sort, a hot id repeated across the whole batch.
  for (const OpCase& l : large_cases()) cases.push_back(l);
  return cases;
}

double round_to(double v, DType t) {
  if (t == DType::BF16) return to_f32(to_bf16(float(v)));
  if (t == DType::F16) return to_f32(to_f16(float(v)));
  return double(float(v));
}

Values rounded_inputs(const OpCase& c, DType dt) {
  Values v;
  for (const auto& in : c.inputs) {
    std::vector<double> x = in.values;
    if (!in.index)
      for (double& e : x) e = round_to(e, dt);
    v.push_back(x);
  }
  return v;
}

std::vector<Tensor> make_tensors(const OpCase& c, const Values& v, DType dt, Device dev) {
  std::vector<Tensor> t;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    const auto& in = c.inputs[i];
    if (in.index) {
      std::vector<int64_t> ids(v[i].begin(), v[i].end());
      t.push_back(Tensor::from_ints(ids, in.shape, DType::I64, dev));
    } else {
      t.push_back(Tensor::from_floats(std::vector<float>(v[i].begin(), v[i].end()), in.shape, dt, dev));
    }
  }
  return t;
}

}  // namespace hr::test
