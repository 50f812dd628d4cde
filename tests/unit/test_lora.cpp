// LoRA (models/layers.h): y = W x + b + (alpha / r) B A dropout(x) against a double-precision reference, its
// gradients (dA, dB, dx) against central finite differences of that reference, with and without dropout (the
// backward draws the forward's mask again); PEFT's initialisation; and a LLaVA model whose decoder carries
// adapters: only they and the projector train.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "core/ops/copy.h"
#include "core/ops/dropout_mask.h"
#include "core/ops/elementwise.h"
#include "models/layers.h"
#include "models/llava.h"
#include "models/weights.h"

using namespace hr;
using namespace hr::core;
using namespace hr::models;

namespace {

std::vector<float> randoms(std::size_t n, uint64_t seed, float scale = 1.f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (float& e : v) e = d(rng);
  return v;
}

struct Case {
  int64_t tokens = 3, in = 5, out = 4, r = 2;
  float alpha = 6.f, p = 0.f;
  uint64_t key = 77;
};

// sum(g * y) in double, y = W x + s B A x', x' = x * keep / (1 - p).
double reference(const Case& c, const std::vector<double>& W, const std::vector<double>& A,
                 const std::vector<double>& B, const std::vector<double>& x, const std::vector<double>& g,
                 uint64_t layer_key) {
  const double s = double(c.alpha) / double(c.r);
  const uint32_t threshold = dropout_threshold(c.p);
  double total = 0;
  for (int64_t t = 0; t < c.tokens; ++t) {
    std::vector<double> xd(std::size_t(c.in)), h(std::size_t(c.r), 0.0);
    for (int64_t i = 0; i < c.in; ++i) {
      const double v = x[std::size_t(t * c.in + i)];
      const bool keep = c.p == 0.f || dropout_keep(c.key ^ layer_key, uint64_t(t * c.in + i), threshold);
      xd[std::size_t(i)] = c.p == 0.f ? v : keep ? v / (1.0 - double(c.p)) : 0.0;
    }
    for (int64_t k = 0; k < c.r; ++k)
      for (int64_t i = 0; i < c.in; ++i) h[std::size_t(k)] += A[std::size_t(k * c.in + i)] * xd[std::size_t(i)];
    for (int64_t o = 0; o < c.out; ++o) {
      double y = 0;
      for (int64_t i = 0; i < c.in; ++i) y += W[std::size_t(o * c.in + i)] * x[std::size_t(t * c.in + i)];
      for (int64_t k = 0; k < c.r; ++k) y += s * B[std::size_t(o * c.r + k)] * h[std::size_t(k)];
      total += g[std::size_t(t * c.out + o)] * y;
    }
  }
  return total;
}

std::vector<double> to_double(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

void check_case(const Case& c) {
  ParamStore store(Device::cpu(), DType::F32);
  store.add_group("layer", GroupKind::DecoderLayer);
  ParamStore::GroupScope in(store, 0);
  LoraSpec spec;
  spec.r = c.r;
  spec.alpha = c.alpha;
  spec.dropout = c.p;
  spec.targets = {"q_proj"};
  const Linear l = Linear::make(store, "model.layers.0.self_attn.q_proj", c.in, c.out, Bias::No, &spec);
  ASSERT_NE(l.lora_a, nullptr);
  const std::vector<float> W = randoms(std::size_t(c.out * c.in), 1), A = randoms(std::size_t(c.r * c.in), 2),
                           B = randoms(std::size_t(c.out * c.r), 3), x = randoms(std::size_t(c.tokens * c.in), 4),
                           g = randoms(std::size_t(c.tokens * c.out), 5);
  copy_(l.weight->data, Tensor::from_floats(W, {c.out, c.in}, DType::F32, Device::host()));
  copy_(l.lora_a->data, Tensor::from_floats(A, {c.r, c.in}, DType::F32, Device::host()));
  copy_(l.lora_b->data, Tensor::from_floats(B, {c.out, c.r}, DType::F32, Device::host()));
  l.weight->trainable = false;  // the base is frozen
  const Tensor xt = Tensor::from_floats(x, {1, c.tokens, c.in}, DType::F32, Device::cpu());
  const Tensor gt = Tensor::from_floats(g, {1, c.tokens, c.out}, DType::F32, Device::cpu());
  std::vector<float> y, dx;
  {
    LoraDropoutScope scope(c.key);  // a training pass: forward and backward under one key
    y = l.forward(xt).to_floats();
    dx = l.backward(gt, xt).to_floats();
  }
  EXPECT_FALSE(l.weight->grad.defined());
  const std::vector<float> dA = l.lora_a->grad.to_floats(), dB = l.lora_b->grad.to_floats();
  // The forward against the reference (its value is sum(g * y); each y against the reference's own by probing).
  std::vector<double> Wd = to_double(W), Ad = to_double(A), Bd = to_double(B), xd = to_double(x), gd = to_double(g);
  double dot = 0;
  for (std::size_t i = 0; i < y.size(); ++i) dot += double(y[i]) * gd[i];
  EXPECT_NEAR(dot, reference(c, Wd, Ad, Bd, xd, gd, l.lora_id), 1e-4 * (1 + std::fabs(dot)));
  const auto fd = [&](std::vector<double>& v, std::size_t i) {
    const double e = 1e-5, keep = v[i];
    v[i] = keep + e;
    const double up = reference(c, Wd, Ad, Bd, xd, gd, l.lora_id);
    v[i] = keep - e;
    const double down = reference(c, Wd, Ad, Bd, xd, gd, l.lora_id);
    v[i] = keep;
    return (up - down) / (2 * e);
  };
  for (std::size_t i = 0; i < A.size(); ++i) EXPECT_NEAR(dA[i], fd(Ad, i), 1e-4) << "dA[" << i << "] p " << c.p;
  for (std::size_t i = 0; i < B.size(); ++i) EXPECT_NEAR(dB[i], fd(Bd, i), 1e-4) << "dB[" << i << "] p " << c.p;
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(dx[i], fd(xd, i), 1e-4) << "dx[" << i << "] p " << c.p;
  // Outside a training pass nothing is dropped: the output is the reference without dropout.
  Case eval = c;
  eval.p = 0.f;
  const std::vector<float> ye = l.forward(xt).to_floats();
  double dot_eval = 0;
  for (std::size_t i = 0; i < ye.size(); ++i) dot_eval += double(ye[i]) * gd[i];
  EXPECT_NEAR(dot_eval, reference(eval, Wd, Ad, Bd, xd, gd, l.lora_id), 1e-4 * (1 + std::fabs(dot_eval)));
}

}  // namespace

TEST(Lora, ForwardAndGradientsMatchTheReferenceAndFiniteDifferences) {
  check_case({});
  Case dropped;
  dropped.p = 0.4f;
  dropped.tokens = 6;
  check_case(dropped);
}

TEST(Lora, DropoutKeepsAboutOneMinusPAndScalesTheRest) {
  const int64_t n = 200000;
  const Tensor x = Tensor::full({n}, 1.f, DType::F32, Device::cpu());
  const std::vector<float> y = dropout(x, 0.25f, 12345).to_floats();
  int64_t kept = 0;
  for (float v : y) {
    ASSERT_TRUE(v == 0.f || std::fabs(v - 1.f / 0.75f) < 1e-6f) << v;
    kept += v != 0.f;
  }
  EXPECT_NEAR(double(kept) / double(n), 0.75, 0.005);
  EXPECT_EQ(dropout(x, 0.25f, 12345).to_floats(), y);  // the same key: the same mask
  EXPECT_NE(dropout(x, 0.25f, 12346).to_floats(), y);  // another key: another mask
  EXPECT_THROW(dropout(x, 1.f, 1), Error);
}

TEST(Lora, AdaptersStartAsPeftStartsThem) {
  ParamStore store(Device::cpu(), DType::F32);
  store.add_group("layer", GroupKind::DecoderLayer);
  ParamStore::GroupScope in(store, 0);
  LoraSpec spec;
  spec.r = 8;
  spec.targets = {"v_proj"};
  const Linear q = Linear::make(store, "m.q_proj", 64, 32, Bias::No, &spec);
  const Linear v = Linear::make(store, "m.v_proj", 64, 32, Bias::No, &spec);
  EXPECT_EQ(q.lora_a, nullptr);  // not a target
  ASSERT_NE(v.lora_a, nullptr);
  EXPECT_EQ(v.lora_a->name, "m.v_proj.lora_A.weight");
  EXPECT_EQ(v.lora_b->name, "m.v_proj.lora_B.weight");
  EXPECT_EQ(v.lora_a->shape, (Shape{8, 64}));
  EXPECT_EQ(v.lora_b->shape, (Shape{32, 8}));
  init_weights(store, 3);
  const std::vector<float> a = v.lora_a->data.to_floats(), b = v.lora_b->data.to_floats();
  float most = 0;
  for (float e : a) most = std::max(most, std::fabs(e));
  EXPECT_LE(most, 1.f / 8.f);  // U(-1/sqrt(64), 1/sqrt(64))
  EXPECT_GT(most, 0.1f);
  for (float e : b) EXPECT_EQ(e, 0.f);
}

TEST(Lora, OnlyTheAdaptersAndTheProjectorTrain) {
  LlavaConfig cfg = preset("tiny");
  cfg.llm.lora.r = 4;
  cfg.llm.lora.alpha = 8.f;
  cfg.llm.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  Llava model(cfg, Device::cpu(), DType::F32);
  model.set_trainable({.projector = true, .llm = true});
  int64_t adapters = 0, projector = 0;
  for (const auto& p : model.params().all()) {
    const bool lora = p->role == ParamRole::LoraA || p->role == ParamRole::LoraB;
    const bool proj = model.params().kind_of(*p) == GroupKind::Projector;
    EXPECT_EQ(p->trainable, lora || proj) << p->name;
    if (lora) adapters += p->numel();
    if (proj) projector += p->numel();
  }
  const LlmConfig& l = cfg.llm;
  const int64_t kv = l.kv_heads * l.head_dim();
  // q and o: (h + h) each; k and v: (h + kv) each; gate, up and down: (h + intermediate) each; times r.
  const int64_t per_layer = 4 * (2 * (l.hidden + l.hidden) + 2 * (l.hidden + kv) + 3 * (l.hidden + l.intermediate));
  EXPECT_EQ(adapters, l.layers * per_layer);
  EXPECT_EQ(model.params().count(core::ParamStore::Counting::Trainable), adapters + projector);
}
