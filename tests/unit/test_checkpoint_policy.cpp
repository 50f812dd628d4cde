// Checkpoint policies: none, selective and full give bit-identical gradients on the CPU and strictly
// decreasing activation peaks; frozen groups allocate no gradient buffers.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "core/memory/device_memory.h"
#include "models/llava.h"
#include "models/weights.h"

using namespace hr;
using namespace hr::core;
using namespace hr::models;

namespace {

Batch random_batch(const LlavaConfig& cfg, int64_t batch, int64_t text, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t T = cfg.vision.tokens_per_image(), L = T + text;
  Batch b;
  b.batch = batch;
  b.seq = L;
  for (int64_t r = 0; r < batch; ++r)
    for (int64_t t = 0; t < L; ++t) {
      const bool image = t >= 2 && t < 2 + T;
      const int64_t id = image ? cfg.image_token_id : int64_t(rng() % uint64_t(cfg.image_token_id));
      b.input_ids.push_back(id);
      b.labels.push_back(t >= 2 + T + 2 ? id : cfg.ignore_index);
    }
  std::vector<float> px(std::size_t(batch * 3 * cfg.vision.image_size * cfg.vision.image_size));
  std::normal_distribution<float> n(0.f, 1.f);
  for (float& v : px) v = n(rng);
  b.pixel_values =
      Tensor::from_floats(px, {batch, 3, cfg.vision.image_size, cfg.vision.image_size}, DType::F32, Device::host());
  return b;
}

struct Result {
  std::vector<std::vector<float>> grads;
  int64_t activation_peak = 0;
  float loss = 0;
};

Result run(CheckpointKind kind, bool stage1 = false) {
  configure_device(Device::cpu(), {});
  auto alloc = allocator_for(Device::cpu());
  Result r;
  {
    const LlavaConfig cfg = preset("small");
    Llava model(cfg, Device::cpu(), DType::F32);
    if (stage1) model.set_trainable({.projector = true});
    init_weights(model.params(), 7);
    Batch b = random_batch(cfg, 2, 24, 11);
    ModelOptions opt;
    opt.vision_policy.kind = opt.llm_policy.kind = kind;
    alloc->reset_peak_stats();
    const int64_t base = alloc->stats().category(Category::Activations).current;
    LlavaState st;
    r.loss = model.forward(b, st, opt);
    model.backward(st);
    r.activation_peak = alloc->stats().category(Category::Activations).peak - base;
    for (const auto& p : model.params().all()) {
      if (stage1 && p->name.rfind("multi_modal_projector.", 0) != 0) {
        EXPECT_FALSE(p->grad.defined()) << p->name << " is frozen but has a gradient buffer";
        continue;
      }
      r.grads.push_back(p->grad.defined() ? p->grad.to_floats() : std::vector<float>());
    }
  }
  return r;
}

}  // namespace

TEST(CheckpointPolicy, IdenticalGradientsAndDecreasingActivationPeaks) {
  Result none = run(CheckpointKind::None), sel = run(CheckpointKind::Selective), full = run(CheckpointKind::Full);
  ASSERT_EQ(none.grads.size(), sel.grads.size());
  ASSERT_EQ(none.grads.size(), full.grads.size());
  EXPECT_EQ(none.loss, sel.loss);
  EXPECT_EQ(none.loss, full.loss);
  for (std::size_t i = 0; i < none.grads.size(); ++i) {
    ASSERT_EQ(none.grads[i].size(), sel.grads[i].size());
    ASSERT_EQ(none.grads[i].size(), full.grads[i].size());
    if (none.grads[i].empty()) continue;  // no gradient buffer: data() may be null, which memcmp must not see
    EXPECT_EQ(0, std::memcmp(none.grads[i].data(), sel.grads[i].data(), none.grads[i].size() * sizeof(float)))
        << "gradient " << i << " differs between none and selective";
    EXPECT_EQ(0, std::memcmp(none.grads[i].data(), full.grads[i].data(), none.grads[i].size() * sizeof(float)))
        << "gradient " << i << " differs between none and full";
  }
  std::printf("activation peak (small preset, batch 2, f32): none %s, selective %s, full %s\n",
              format_bytes(double(none.activation_peak)).c_str(), format_bytes(double(sel.activation_peak)).c_str(),
              format_bytes(double(full.activation_peak)).c_str());
  EXPECT_GT(none.activation_peak, sel.activation_peak);
  EXPECT_GT(sel.activation_peak, full.activation_peak);
}

TEST(CheckpointPolicy, Stage1AllocatesOnlyProjectorGradients) {
  configure_device(Device::cpu(), {});
  Result r = run(CheckpointKind::None, true);
  EXPECT_EQ(r.grads.size(), 4u);  // linear_1 and linear_2, weight and bias
  for (const auto& g : r.grads) EXPECT_FALSE(g.empty());
}
