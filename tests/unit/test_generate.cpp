// Generation: the cached attention against full attention, cached decoding against whole-sequence decoding
// (token for token, and every position's logits), sampling rules, stop conditions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/io/safetensors.h"
#include "core/ops/attention.h"
#include "core/ops/copy.h"
#include "data/loader.h"
#include "data/synth.h"
#include "models/weights.h"
#include "train/generate.h"

using namespace hr;
using namespace hr::core;
using namespace hr::models;
using namespace hr::data;
using namespace hr::train;

namespace {

Tensor random(const Shape& shape, uint64_t seed) {
  std::vector<float> v(std::size_t(shape_numel(shape)));
  uint64_t s = seed;
  for (float& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = float(int64_t(s >> 40) % 2001 - 1000) / 1000.f;
  }
  return Tensor::from_floats(v, shape, DType::F32, Device::cpu());
}

LlavaConfig gqa_model() {
  LlavaConfig c = preset("tiny");
  c.llm.vocab = 300;
  c.image_token_id = 299;
  c.llm.kv_heads = c.llm.heads / 2;  // grouped-query heads: the cache holds each KV head once
  c.vision.image_size = 8;
  c.vision.patch = 4;
  return c;
}

// Prompts of different lengths: two with an image (one image's placeholders each), one text-only.
std::vector<Example> prompts(const LlavaConfig& c) {
  const int64_t T = c.vision.tokens_per_image();
  std::vector<Example> out;
  const std::vector<std::vector<int64_t>> text = {{40, 41, 42}, {50, 51, 52, 53, 54, 55, 56, 57, 58}, {60, 61}};
  for (std::size_t i = 0; i < text.size(); ++i) {
    Example e;
    e.id = str("p", i);
    e.prompt = {ByteTokenizer::kBos};
    if (i != 2) {
      e.prompt.insert(e.prompt.end(), std::size_t(T), c.image_token_id);
      e.images.push_back(random({3, c.vision.image_size, c.vision.image_size}, 100 + i));
    }
    e.prompt.insert(e.prompt.end(), text[i].begin(), text[i].end());
    out.push_back(std::move(e));
  }
  return out;
}

// The prompts as a batch to prefill (ids the prompt, no labels), and each one's length.
std::vector<Example> prompt_batch(const std::vector<Example>& ps, int64_t ignore_index, std::vector<int64_t>& lengths) {
  std::vector<Example> batch;
  for (const Example& e : ps) {
    lengths.push_back(int64_t(e.prompt.size()));
    Example p = e;
    p.ids = e.prompt;
    p.labels.assign(p.ids.size(), ignore_index);
    batch.push_back(std::move(p));
  }
  return batch;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::fabs(a[i] - b[i])));
  return d;
}

}  // namespace

TEST(AttentionCached, EachRowAttendsToItsOwnCacheUpToItself) {
  const int64_t B = 2, cap = 11, Hq = 4, Hk = 2, D = 8, Lq = 3;
  const std::vector<int64_t> past = {2, 7};
  Tensor kc = random({B, cap, Hk, D}, 1), vc = random({B, cap, Hk, D}, 2), q = random({B, Lq, Hq, D}, 3);
  const float scale = 1.f / std::sqrt(float(D));
  Tensor out = attention_cached(q, kc, vc, Tensor::from_ints(past, {B}, DType::I64, Device::cpu()), scale).out;
  for (int64_t b = 0; b < B; ++b) {
    // Row b alone, its cache cut at its last query's position: plain causal attention (query i at kv_len - Lq + i).
    const int64_t kv = past[std::size_t(b)] + Lq;
    Tensor want = attention_forward(q.slice(0, b, b + 1), kc.slice(0, b, b + 1).slice(1, 0, kv),
                                    vc.slice(0, b, b + 1).slice(1, 0, kv), Mask::Causal, scale)
                      .out;
    EXPECT_LT(max_diff(out.slice(0, b, b + 1).contiguous().to_floats(), want.to_floats()), 1e-6) << "row " << b;
  }
}

TEST(AttentionCached, RefusesBadPast) {
  Tensor kc = random({2, 5, 1, 4}, 1), q = random({2, 1, 2, 4}, 3);
  EXPECT_THROW(attention_cached(q, kc, kc, Tensor::from_ints({1, 2, 3}, {3}, DType::I64, Device::cpu()), 1.f), Error);
}

class Generate : public testing::Test {
 protected:
  Generate() : model(gqa_model(), Device::cpu(), DType::F32) { init_weights(model.params(), 7); }
  Llava model;
};

// Each row's prompt and generated tokens fed whole through `model`: the logits at the prompt's last position and every
// generated one must be the logits the cache produced them from.
void expect_cached_logits_equal_the_full_forward(const Llava& model) {
  const std::vector<Example> ps = prompts(model.config());
  GenerationOptions g;
  g.max_new_tokens = 6;
  g.eos_token_id = -1;  // never stop early: every row runs all its steps
  const GenerationResult r = generate(model, ps, g);
  // Each row's prompt and generated tokens fed whole: the logits at the prompt's last position and every
  // generated one must be the logits the cache produced them from.
  const int64_t vocab = model.config().llm.vocab;
  const int64_t B = int64_t(ps.size());
  std::vector<Example> full;
  int64_t seq = 0;
  for (std::size_t i = 0; i < ps.size(); ++i) {
    Example e = ps[i];
    e.ids = e.prompt;
    e.ids.insert(e.ids.end(), r.tokens[i].begin(), r.tokens[i].end() - 1);
    e.labels.assign(e.ids.size(), model.config().ignore_index);
    seq = std::max<int64_t>(seq, int64_t(e.ids.size()));
    full.push_back(std::move(e));
  }
  ModelOptions mo;
  mo.inference = true;
  for (int64_t i = 0; i < B; ++i)
    for (int64_t t = int64_t(ps[std::size_t(i)].prompt.size()) - 1; t < int64_t(full[std::size_t(i)].ids.size()); ++t)
      mo.logits_at.push_back(i * seq + t);
  LlavaState st;
  model.forward(collate(full, seq, model.config().ignore_index), st, mo);
  const std::vector<float> want = st.logits.to_floats();

  // The same logits from the cache: prefill, then one decode step per generated token.
  std::vector<int64_t> lengths;
  const std::vector<Example> batch = prompt_batch(ps, model.config().ignore_index, lengths);
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  KvCache cache = model.make_cache(B, longest + g.max_new_tokens - 1);
  EXPECT_EQ(cache.k.size(), std::size_t(model.config().llm.layers));
  EXPECT_EQ(cache.k[0].shape(), (Shape{B, longest + 5, model.config().llm.kv_heads, model.config().llm.head_dim()}));
  std::vector<std::vector<float>> got(static_cast<std::size_t>(B));
  auto keep = [&](const Tensor& logits) {
    EXPECT_EQ(logits.shape(), (Shape{B, vocab}));
    const std::vector<float> l = logits.to_floats();
    for (int64_t i = 0; i < B; ++i)
      got[std::size_t(i)].insert(got[std::size_t(i)].end(), l.begin() + i * vocab, l.begin() + (i + 1) * vocab);
  };
  keep(model.prefill(collate(batch, longest, model.config().ignore_index), lengths, cache));
  for (int64_t s = 0; s + 1 < g.max_new_tokens; ++s) {
    std::vector<int64_t> next;
    for (int64_t i = 0; i < B; ++i) next.push_back(r.tokens[std::size_t(i)][std::size_t(s)]);
    keep(model.decode(next, cache));
  }
  std::vector<float> flat;
  for (const auto& v : got) flat.insert(flat.end(), v.begin(), v.end());
  ASSERT_EQ(flat.size(), want.size());
  EXPECT_LT(max_diff(flat, want), 2e-4);
  EXPECT_EQ(r.cache_bytes, KvCache::bytes(model.config().llm, B, longest + g.max_new_tokens - 1, DType::F32));
  EXPECT_EQ(r.cache_bytes, 2 * model.config().llm.layers * B * (longest + 5) * model.config().llm.kv_heads *
                               model.config().llm.head_dim() * 4);
}

TEST_F(Generate, CachedLogitsEqualTheFullSequenceForwardAtEveryPosition) {
  expect_cached_logits_equal_the_full_forward(model);
}

// Qwen2 with a sliding window of 5 tokens from its second layer on (max_window_layers 1), shorter than the prompts
// with an image (8 and 14 tokens):
// the cache keeps every position, and each query attends to the last 5 of them in those layers, as the full forward
// does. The same prompts without the window give other logits (the window is applied, not ignored).
TEST_F(Generate, ASlidingWindowShorterThanThePromptsHoldsInTheCache) {
  LlavaConfig c = gqa_model();
  c.llm.decoder = Decoder::Qwen2;
  c.llm.sliding_window = 5;
  c.llm.max_window_layers = 1;
  ASSERT_GE(c.llm.layers, 2);
  Llava windowed(c, Device::cpu(), DType::F32);
  init_weights(windowed.params(), 7);
  expect_cached_logits_equal_the_full_forward(windowed);
  c.llm.sliding_window = 0;
  c.llm.max_window_layers = 0;
  Llava whole(c, Device::cpu(), DType::F32);
  init_weights(whole.params(), 7);
  GenerationOptions g;
  g.max_new_tokens = 1;
  const std::vector<Example> ps = prompts(c);
  std::vector<int64_t> lengths;
  const std::vector<Example> batch = prompt_batch(ps, c.ignore_index, lengths);
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  ASSERT_GT(longest, 5);
  auto prefill = [&](const Llava& m) {
    KvCache cache = m.make_cache(int64_t(ps.size()), longest);
    return m.prefill(collate(batch, longest, c.ignore_index), lengths, cache).to_floats();
  };
  EXPECT_GT(max_diff(prefill(windowed), prefill(whole)), 1e-3);
}

// model.fused_kernels with a KV cache: the prefill's and every decode step's logits are the unfused ops' bit for bit
// (RoPE's table made per call for the new positions, the residual add inside post_attention_layernorm).
TEST_F(Generate, FusedKernelsChangeNoBitOfTheCachedLogits) {
  LlavaConfig off = gqa_model();
  off.llm.kernels = off.vision.kernels = FusedKernels::Off;
  Llava unfused(off, Device::cpu(), DType::F32);
  init_weights(unfused.params(), 7);
  const std::vector<Example> ps = prompts(model.config());
  std::vector<int64_t> lengths;
  const std::vector<Example> batch = prompt_batch(ps, model.config().ignore_index, lengths);
  const int64_t B = int64_t(ps.size()), longest = *std::max_element(lengths.begin(), lengths.end());
  auto logits = [&](const Llava& m) {
    KvCache cache = m.make_cache(B, longest + 3);
    std::vector<std::vector<float>> out{
        m.prefill(collate(batch, longest, m.config().ignore_index), lengths, cache).to_floats()};
    for (int64_t s = 0; s < 3; ++s)
      out.push_back(m.decode(std::vector<int64_t>(std::size_t(B), 70 + s), cache).to_floats());
    return out;
  };
  EXPECT_TRUE(logits(model) == logits(unfused));
}

TEST_F(Generate, CachedGreedyEqualsUncachedTokenForToken) {
  const std::vector<Example> ps = prompts(model.config());
  GenerationOptions g;
  g.max_new_tokens = 12;
  const GenerationResult cached = generate(model, ps, g);
  g.use_cache = false;
  const GenerationResult full = generate(model, ps, g);
  EXPECT_EQ(cached.tokens, full.tokens);
  EXPECT_EQ(cached.text, full.text);
  EXPECT_EQ(full.cache_bytes, 0);
  // One prompt alone decodes as it does in the batch (its own positions, nothing of the others).
  g.use_cache = true;
  EXPECT_EQ(generate(model, {ps[1]}, g).tokens[0], cached.tokens[1]);
}

TEST_F(Generate, SamplingFollowsItsSeedAndItsRules) {
  const std::vector<Example> ps = prompts(model.config());
  GenerationOptions g;
  g.max_new_tokens = 10;
  g.eos_token_id = -1;
  const GenerationResult greedy = generate(model, ps, g);
  g.do_sample = true;
  g.temperature = 1.5f;
  g.seed = 1;
  const GenerationResult a = generate(model, ps, g), b = generate(model, ps, g);
  EXPECT_EQ(a.tokens, b.tokens);
  g.seed = 2;
  EXPECT_NE(generate(model, ps, g).tokens, a.tokens);
  g.top_k = 1;  // only the argmax survives
  EXPECT_EQ(generate(model, ps, g).tokens, greedy.tokens);
  g.top_k = 0;
  g.top_p = 1e-6f;  // the nucleus is the argmax alone
  EXPECT_EQ(generate(model, ps, g).tokens, greedy.tokens);
}

TEST(NextToken, TopKAndTopPKeepTheTokensTheyDefine) {
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  GenerationOptions g;
  uint64_t rng = 42;
  EXPECT_EQ(next_token(logits.data(), 4, g, rng), 0);
  g.do_sample = true;
  std::vector<int> seen(4, 0);
  for (int i = 0; i < 4000; ++i) ++seen[std::size_t(next_token(logits.data(), 4, g, rng))];
  EXPECT_NEAR(seen[0] / 4000.0, 0.5, 0.03);
  EXPECT_NEAR(seen[3] / 4000.0, 0.05, 0.015);
  g.top_p = 0.8f;  // 0.5 + 0.3 reaches it: tokens 0 and 1 only, renormalised
  seen.assign(4, 0);
  for (int i = 0; i < 4000; ++i) ++seen[std::size_t(next_token(logits.data(), 4, g, rng))];
  EXPECT_EQ(seen[2] + seen[3], 0);
  EXPECT_NEAR(seen[0] / 4000.0, 0.625, 0.03);
  g.top_p = 1.f;
  g.top_k = 3;
  seen.assign(4, 0);
  for (int i = 0; i < 4000; ++i) ++seen[std::size_t(next_token(logits.data(), 4, g, rng))];
  EXPECT_EQ(seen[3], 0);
  g.temperature = 0.f;
  EXPECT_THROW(next_token(logits.data(), 4, g, rng), Error);
}

TEST_F(Generate, StopsAtAStopStringAndCutsIt) {
  const std::vector<Example> ps = prompts(model.config());
  GenerationOptions g;
  g.max_new_tokens = 8;
  g.eos_token_id = -1;
  const GenerationResult free = generate(model, ps, g);
  ASSERT_GE(free.text[0].size(), 3u);
  // The first row's third generated byte as a stop string: that row ends where its text first holds it, the
  // text cut before it, its tokens a prefix of the free run's.
  g.stop = {free.text[0].substr(2, 1)};
  const GenerationResult stopped = generate(model, ps, g);
  EXPECT_EQ(stopped.finish[0], Finish::Stop);
  EXPECT_EQ(stopped.text[0], free.text[0].substr(0, free.text[0].find(g.stop[0])));
  ASSERT_LT(stopped.tokens[0].size(), free.tokens[0].size());
  EXPECT_TRUE(std::equal(stopped.tokens[0].begin(), stopped.tokens[0].end(), free.tokens[0].begin()));
  EXPECT_EQ(free.finish[0], Finish::Length);
  EXPECT_EQ(int64_t(free.tokens[0].size()), g.max_new_tokens);
}

// Writes the case tests/py/check_generate_hf.py checks against transformers' LlavaForConditionalGeneration:
// the model's dimensions and llava-hf weights, prompts of different lengths with and without images, and
// headroom's greedy output with an end-of-sequence token some prompts reach part-way (into $HR_CASE_DIR, else
// the test's temporary directory).
namespace {

// Writes the case tests/py/check_generate_hf.py checks headroom's greedy generation with into $HR_CASE_DIR (or a
// temporary folder named `name`).
void write_oracle_case(const Llava& model, const std::string& name) {
  const char* env = std::getenv("HR_CASE_DIR");
  const std::string dir = env && *env ? env : testing::TempDir() + "/" + name;
  std::filesystem::create_directories(dir);
  const LlavaConfig& c = model.config();
  const std::vector<Example> ps = prompts(c);
  GenerationOptions g;
  g.max_new_tokens = 10;
  g.eos_token_id = -1;
  const GenerationResult free = generate(model, ps, g);
  g.eos_token_id = free.tokens[0][3];  // the first prompt stops at its fourth token, others maybe elsewhere
  const GenerationResult r = generate(model, ps, g);
  ASSERT_EQ(r.finish[0], Finish::Eos);

  save_safetensors(dir + "/model.safetensors", named_weights(model.params()));
  std::vector<Tensor> images;
  for (const Example& e : ps) images.insert(images.end(), e.images.begin(), e.images.end());
  Tensor pixels =
      Tensor::empty({int64_t(images.size()), 3, c.vision.image_size, c.vision.image_size}, DType::F32, Device::cpu());
  for (std::size_t i = 0; i < images.size(); ++i) copy_(pixels.select(0, int64_t(i)), images[i]);
  save_safetensors(dir + "/pixels.safetensors", {{"pixel_values", pixels}});
  nlohmann::json prompts_json = nlohmann::json::array();
  for (const Example& e : ps) prompts_json.push_back({{"input_ids", e.prompt}, {"images", e.images.size()}});
  const nlohmann::json j = {
      {"model",
       {{"vision",
         {{"hidden", c.vision.hidden},
          {"layers", c.vision.layers},
          {"heads", c.vision.heads},
          {"intermediate", c.vision.intermediate},
          {"image_size", c.vision.image_size},
          {"patch", c.vision.patch},
          {"channels", c.vision.channels},
          {"layer_norm_eps", c.vision.layer_norm_eps},
          {"select_layer", c.vision.select_layer},
          {"select_feature", c.vision.select_feature == FeatureSelect::Patch ? "patch" : "cls_patch"},
          {"tower", tower_name(c.vision.tower)}}},
        {"llm",
         {{"vocab", c.llm.vocab},
          {"hidden", c.llm.hidden},
          {"layers", c.llm.layers},
          {"heads", c.llm.heads},
          {"kv_heads", c.llm.kv_heads},
          {"intermediate", c.llm.intermediate},
          {"rms_norm_eps", c.llm.rms_norm_eps},
          {"rope_theta", c.llm.rope_theta},
          {"decoder", decoder_name(c.llm.decoder)}}},
        {"projector", projector_name(c.projector)},
        {"image_token_id", c.image_token_id}}},
      {"weights", "model.safetensors"},
      {"pixel_values", "pixels.safetensors"},
      {"prompts", prompts_json},
      {"max_new_tokens", g.max_new_tokens},
      {"eos_token_id", g.eos_token_id},
      {"pad_token_id", ByteTokenizer::kPad},
      {"generated", r.tokens}};
  std::ofstream(dir + "/case.json") << j.dump(1) << "\n";
  EXPECT_TRUE(std::filesystem::exists(dir + "/case.json"));
}

}  // namespace

TEST_F(Generate, WritesTheTransformersOracleCase) {
  write_oracle_case(model, "generate_hf_case");
}

// LLaVA-OneVision's pairing: a SigLIP tower (10-px images in 4-px patches: 2 pixels unread; every patch a feature)
// and a Qwen2 decoder (q/k/v biases, rope_theta 1e6).
TEST(GenerateFamily, WritesTheSiglipQwen2OracleCase) {
  LlavaConfig c = gqa_model();
  c.vision.tower = Tower::Siglip;
  c.vision.image_size = 10;
  c.vision.layer_norm_eps = 1e-6f;
  c.vision.select_feature = FeatureSelect::ClsPatch;
  c.llm.decoder = Decoder::Qwen2;
  c.llm.rope_theta = 1e6f;
  Llava model(c, Device::cpu(), DType::F32);
  init_weights(model.params(), 11);
  write_oracle_case(model, "generate_hf_family_case");
}

// transformers' logits_to_keep: the last k positions of each row, the same numbers as the full logits there.
TEST_F(Generate, LogitsToKeepAreTheLastPositionsOfTheFullLogits) {
  std::vector<Example> ps = prompts(model.config());
  int64_t seq = 0;
  for (Example& e : ps) {
    e.ids = e.prompt;
    e.labels.assign(e.ids.size(), model.config().ignore_index);
    seq = std::max<int64_t>(seq, int64_t(e.ids.size()));
  }
  const Batch b = collate(ps, seq, model.config().ignore_index);
  const int64_t V = model.config().llm.vocab, B = b.batch, k = 3;
  ModelOptions all;
  all.inference = true;
  all.logits_to_keep = 0;
  LlavaState full;
  model.forward(b, full, all);
  ASSERT_EQ(full.logits.shape(), (Shape{B, seq, V}));
  ModelOptions last = all;
  last.logits_to_keep = k;
  LlavaState kept;
  model.forward(b, kept, last);
  ASSERT_EQ(kept.logits.shape(), (Shape{B * k, V}));
  const std::vector<float> f = full.logits.to_floats(), g = kept.logits.to_floats();
  std::vector<float> want;  // the full logits' last k rows of each sequence (GEMMs of other shapes: not bit-equal)
  for (int64_t r = 0; r < B; ++r)
    want.insert(want.end(), f.begin() + (r * seq + seq - k) * V, f.begin() + (r * seq + seq) * V);
  EXPECT_LT(max_diff(g, want), 1e-5);
  ModelOptions none = all;
  none.logits_to_keep = -1;
  LlavaState nothing;
  model.forward(b, nothing, none);
  EXPECT_FALSE(nothing.logits.defined());
}
