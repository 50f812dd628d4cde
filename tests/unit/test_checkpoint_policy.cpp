// Checkpoint policies: none, selective and full give bit-identical gradients on the CPU and strictly
// decreasing activation peaks; frozen groups allocate no gradient buffers; the planner's keep_last keeps the LLM's
// last block whole and changes no bit.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "core/memory/device_memory.h"
#include "models/llava.h"
#include "models/weights.h"
#include "train/devices.h"
#include "train/planner.h"

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
  std::vector<bool> llm_block_whole;  // after the forward: whether each LLM block kept its MLP's activation
};

Result run(CheckpointKind kind, bool stage1 = false, bool keep_last = false) {
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
    opt.llm_policy.keep_last = keep_last;
    alloc->reset_peak_stats();
    const int64_t base = alloc->stats().category(Category::Activations).current;
    LlavaState st;
    r.loss = model.forward(b, st, opt);
    for (const LlamaLayerSaved& s : st.llm.layers) r.llm_block_whole.push_back(s.act.defined() && s.gate.defined());
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

TEST(CheckpointPolicy, KeepLastExemptsOnlyTheLastOfTheBlocks) {
  CheckpointPolicy p{.kind = CheckpointKind::Full, .every = 1};
  EXPECT_TRUE(p.recomputes_last(4));
  p.keep_last = true;
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(p.for_block(i, 4), CheckpointKind::Full) << i;
  EXPECT_EQ(p.for_block(3, 4), CheckpointKind::None);
  EXPECT_EQ(p.for_block(3), CheckpointKind::Full);  // without the count of blocks: the policy as given
  // memory.checkpoint_every: 2 over 4 blocks checkpoints 0 and 2; the last already keeps everything.
  const CheckpointPolicy every2{.kind = CheckpointKind::Selective, .every = 2};
  EXPECT_FALSE(every2.recomputes_last(4));
  EXPECT_TRUE(every2.recomputes_last(5));
  EXPECT_FALSE(CheckpointPolicy{}.recomputes_last(4));
}

// Full checkpointing with the last block kept: that block holds its activations after the forward, the others only
// their inputs; the loss and every gradient are the same bits as without checkpointing; the activation peak is
// plain full checkpointing's or more, and below none's.
TEST(CheckpointPolicy, KeptLastBlockChangesNoBit) {
  Result none = run(CheckpointKind::None), full = run(CheckpointKind::Full),
         kept = run(CheckpointKind::Full, false, true);
  ASSERT_GE(kept.llm_block_whole.size(), 2u);
  for (std::size_t i = 0; i + 1 < kept.llm_block_whole.size(); ++i) {
    EXPECT_FALSE(kept.llm_block_whole[i]) << "block " << i;
    EXPECT_FALSE(full.llm_block_whole[i]) << "block " << i;
  }
  EXPECT_TRUE(kept.llm_block_whole.back());
  EXPECT_FALSE(full.llm_block_whole.back());
  EXPECT_EQ(none.loss, kept.loss);
  ASSERT_EQ(none.grads.size(), kept.grads.size());
  for (std::size_t i = 0; i < none.grads.size(); ++i) {
    ASSERT_EQ(none.grads[i].size(), kept.grads[i].size());
    if (none.grads[i].empty()) continue;
    EXPECT_EQ(0, std::memcmp(none.grads[i].data(), kept.grads[i].data(), none.grads[i].size() * sizeof(float)))
        << "gradient " << i << " differs between none and full with the last block kept";
  }
  EXPECT_GE(kept.activation_peak, full.activation_peak);
  EXPECT_LT(kept.activation_peak, none.activation_peak);
}

// The planner keeps the LLM's last block whole exactly where, dry-run, that adds nothing to the peak allocated and at
// most 0.5% to the reserved one; the small preset has both cases. A LoRA run in bf16 with a 32,000-token vocabulary
// peaks in its loss, where the kept block would add to it, on every CPU; with the preset's vocabulary, where the
// GEMMs' workspaces decide where the peak falls, keeping is free on an AVX2 CPU and not on an AMX one.
TEST(CheckpointPolicy, ThePlannerKeepsTheLastBlockWhereItAddsNoPeak) {
  const std::string base = R"(model: {preset: small}
data: {synthetic: {train: 8, eval: 2, image_size: 32}, system_prompt: "", max_seq_len: 112, pad_to_max_length: true}
train: {stage: full, micro_batch_size: 2, max_steps: 1}
device: {memory_limit: 512MiB}
memory: {gradient_checkpointing: full}
)";
  int kept = 0, recomputed = 0;
  for (const std::vector<std::string>& sets :
       {std::vector<std::string>{"memory.precision=fp32"},
        {"memory.precision=bf16"},
        {"lora.enable=true", "lora.r=8", "memory.precision=bf16"},
        {"lora.enable=true", "lora.r=8", "memory.precision=bf16", "model.llm.vocab_size=32000"}}) {
    const train::RunConfig c = train::load_config_text(base, "test.yaml", sets);
    const train::DevicePreset device = train::run_device(c);
    const train::Plan plan = train::keep_last_block_if_free(train::make_plan(c, device, 1));
    auto predict = [&](bool keep_last) {
      train::RunConfig r = c;
      r.llm_ckpt.keep_last = keep_last;
      train::Predictor pred(r, 1, 0, train::sizing_target(device));
      return pred.step(pred.worst_case());
    };
    const train::Prediction given = predict(false), whole = predict(true);
    const bool free = whole.peak_allocated <= given.peak_allocated &&
                      double(whole.peak_reserved) <= (1 + train::kKeptBlockReservedRoom) * double(given.peak_reserved);
    EXPECT_EQ(plan.config.llm_ckpt.keep_last, free) << sets.back();
    EXPECT_EQ(plan.decisions.llm_keep_last, free) << sets.back();
    EXPECT_EQ(plan.decisions.describe().find("(last block kept)") != std::string::npos, free) << sets.back();
    const train::Prediction& chosen = free ? whole : given;
    EXPECT_EQ(plan.rank.peak_allocated, chosen.peak_allocated) << sets.back();
    EXPECT_EQ(plan.rank.peak_reserved, chosen.peak_reserved) << sets.back();
    (free ? kept : recomputed)++;
  }
  EXPECT_GE(kept, 1);
  EXPECT_GE(recomputed, 1);
}

// The fixes offered for a plan that does not fit, and --max-micro-batch's plan, are the plans `train` makes of their
// configs: the last block kept where that is free, with the same peaks and step time.
TEST(CheckpointPolicy, TheFixesAndTheLargestMicroBatchAreThePlansTrainMakes) {
  const std::string base = R"(model: {preset: small}
data: {synthetic: {train: 8, eval: 2, image_size: 32}, system_prompt: "", max_seq_len: 112, pad_to_max_length: true}
train: {stage: full, micro_batch_size: 2, max_steps: 1}
memory: {precision: fp32, budget: 1.0, allocator: planned}
)";
  auto plan_of = [&](std::vector<std::string> sets) {
    const train::RunConfig c = train::load_config_text(base, "test.yaml", sets);
    return train::make_plan(c, train::run_device(c), 1);
  };
  // Between what full checkpointing reserves and what no checkpointing needs allocated.
  const train::Plan full = plan_of({"memory.gradient_checkpointing=full"});
  const train::Plan none = plan_of({"memory.gradient_checkpointing=none"});
  ASSERT_LT(full.rank.peak_reserved, none.rank.peak_allocated);
  const int64_t cap = (full.rank.peak_reserved + none.rank.peak_allocated) / 2;
  const std::string limit = "device.memory_limit=" + std::to_string(cap);
  auto as_train_plans = [](const train::Plan& p) {
    train::RunConfig r = p.config;
    r.llm_ckpt.keep_last = false;
    const train::Plan t = train::chosen_plan(train::search_plans(r, p.device, p.world), r);
    EXPECT_EQ(p.config.llm_ckpt.keep_last, t.config.llm_ckpt.keep_last) << p.decisions_changed;
    EXPECT_EQ(p.rank.peak_allocated, t.rank.peak_allocated) << p.decisions_changed;
    EXPECT_EQ(p.rank.peak_reserved, t.rank.peak_reserved) << p.decisions_changed;
    EXPECT_DOUBLE_EQ(p.time.total(), t.time.total()) << p.decisions_changed;
    return p.config.llm_ckpt.keep_last;
  };
  const train::RunConfig capped =
      train::load_config_text(base, "test.yaml", {"memory.gradient_checkpointing=none", limit});
  const auto fixes = train::suggest_fixes(capped, train::run_device(capped), 1);
  ASSERT_FALSE(fixes.empty());
  int kept = 0;
  for (const train::Plan& f : fixes) {
    EXPECT_FALSE(f.decisions_changed.empty());
    kept += as_train_plans(f);
  }
  EXPECT_GE(kept, 1) << "a fix with full checkpointing keeps the last block on this preset in fp32";
  const train::RunConfig checkpointed =
      train::load_config_text(base, "test.yaml", {"memory.gradient_checkpointing=full", limit});
  const train::Plan largest = train::max_micro_batch(checkpointed, train::run_device(checkpointed), 1, 16);
  ASSERT_TRUE(largest.fits);
  EXPECT_TRUE(as_train_plans(largest));
}

// Activation offload: a block's copy back from the host runs under the backward of the block after it, and under its
// recompute unless that block is the kept last one. On a slow bus, keeping it exposes that block's forward time.
TEST(CheckpointPolicy, TheCostModelHidesNoFetchUnderTheKeptLastBlocksRecompute) {
  const train::RunConfig c = train::load_config_text(R"(model: {preset: small}
data: {synthetic: {train: 8, eval: 2, image_size: 32}, system_prompt: "", max_seq_len: 112, pad_to_max_length: true}
train: {stage: full, micro_batch_size: 2, max_steps: 1}
memory: {precision: fp32, gradient_checkpointing: full, offload_activations: cpu}
)",
                                                     "test.yaml", {});
  train::DevicePreset device = train::run_device(c);
  device.host_gbps = 1e-6;  // every copy far slower than any block's compute
  train::RunConfig kept_config = c;
  kept_config.llm_ckpt.keep_last = true;
  const train::Plan given = train::make_plan(c, device, 1), kept = train::make_plan(kept_config, device, 1);
  EXPECT_GT(given.time.act_offload_s, 0);
  EXPECT_DOUBLE_EQ(kept.time.act_offload_s, given.time.act_offload_s);
  // What the kept block saves in recompute, its predecessor's fetch no longer hides: the step takes as long.
  EXPECT_GT(kept.time.exposed_act_offload_s, given.time.exposed_act_offload_s);
  EXPECT_NEAR(kept.time.total(), given.time.total(), 1e-9 * given.time.total());
}

// A frozen tower's forward keeps nothing, so its checkpoint policy and activation offload change no byte: the
// decisions say "vision frozen" for it (and plan.json decisions.vision_frozen), the policy for a trained tower.
TEST(CheckpointPolicy, TheDecisionsNameAFrozenTowerFrozen) {
  const std::string base = R"(model: {preset: small}
data: {synthetic: {train: 8, eval: 2, image_size: 32}, system_prompt: "", max_seq_len: 112, pad_to_max_length: true}
train: {micro_batch_size: 2, max_steps: 1}
memory: {precision: fp32, gradient_checkpointing: full, offload_activations: cpu, allocator: planned}
)";
  auto plan_of = [&](std::vector<std::string> sets) {
    const train::RunConfig c = train::load_config_text(base, "test.yaml", sets);
    return train::make_plan(c, train::run_device(c), 1);
  };
  const train::Plan frozen = plan_of({"train.stage=finetune"});
  const train::Plan frozen_none = plan_of(
      {"train.stage=finetune", "memory.gradient_checkpointing.vision=none", "memory.gradient_checkpointing.llm=full",
       "memory.offload_activations.vision=none", "memory.offload_activations.llm=cpu"});
  EXPECT_TRUE(frozen.decisions.vision_frozen);
  EXPECT_EQ(frozen.rank.peak_allocated, frozen_none.rank.peak_allocated);
  EXPECT_EQ(frozen.rank.peak_reserved, frozen_none.rank.peak_reserved);
  EXPECT_EQ(frozen.rank.host_peak, frozen_none.rank.host_peak);
  EXPECT_EQ(frozen.decisions.describe(), frozen_none.decisions.describe());
  EXPECT_NE(frozen.decisions.describe().find("checkpointing vision frozen / llm full"), std::string::npos)
      << frozen.decisions.describe();
  EXPECT_NE(frozen.decisions.describe().find("activations of llm on cpu"), std::string::npos)
      << frozen.decisions.describe();
  EXPECT_TRUE(nlohmann::json::parse(train::plan_json(frozen))["decisions"]["vision_frozen"].get<bool>());

  const train::Plan trained = plan_of({"train.stage=full"});
  EXPECT_FALSE(trained.decisions.vision_frozen);
  EXPECT_NE(trained.decisions.describe().find("checkpointing vision full / llm full"), std::string::npos)
      << trained.decisions.describe();
  EXPECT_NE(trained.decisions.describe().find("activations of vision and llm on cpu"), std::string::npos)
      << trained.decisions.describe();
  EXPECT_FALSE(nlohmann::json::parse(train::plan_json(trained))["decisions"]["vision_frozen"].get<bool>());
}
