// Model presets: the real LLaVA-1.5 presets have exactly the parameter counts of the published llava-hf
// checkpoints (built on the meta device: nothing is allocated for real); config keys are checked strictly.
#include <gtest/gtest.h>

#include <fstream>

#include "models/anyres.h"
#include "models/llava.h"
#include "models/model_spec.h"
#include "models/weights.h"

using namespace hr;
using namespace hr::core;
using namespace hr::models;

TEST(ModelPresets, ParameterCountsMatchLlavaHf) {
  // llava-hf/llava-1.5-7b-hf and llava-hf/llava-1.5-13b-hf: CLIP ViT-L/14-336 (303,507,456 with its unused
  // post_layernorm), the mlp2x_gelu projector and Vicuna with the 32064-token vocabulary.
  Llava m7(preset("llava-1.5-7b"), Device::meta(), DType::BF16);
  EXPECT_EQ(m7.params().count(), 7063427072);
  Llava m13(preset("llava-1.5-13b"), Device::meta(), DType::BF16);
  EXPECT_EQ(m13.params().count(), 13351494656);
  int64_t vision = 0;
  for (const auto& p : m7.params().all())
    if (p->name.rfind("vision_tower.", 0) == 0) vision += p->numel();
  EXPECT_EQ(vision, 303507456);
  // LLaVA-NeXT: llava-1.5-7b with image_newline (4,096) is llava-hf/llava-v1.6-vicuna-7b-hf, 7,063,431,168 in
  // transformers' LlavaNextForConditionalGeneration; llava-hf/llava-v1.6-mistral-7b-hf's config.json counts
  // 7,566,747,648 there.
  Llava vicuna(preset("llava-v1.6-vicuna-7b"), Device::meta(), DType::BF16);
  EXPECT_EQ(vicuna.params().count(), 7063431168);
  EXPECT_EQ(preset("llava-v1.6-vicuna-7b").parameter_count(), 7063431168);
  Llava mistral(preset("llava-v1.6-mistral-7b"), Device::meta(), DType::BF16);
  EXPECT_EQ(mistral.params().count(), 7566747648);
  // llava-hf/llava-onevision-qwen2-7b-ov-hf's config.json (SigLIP so400m with 26 layers and no head, Qwen2-7B,
  // anyres_max_9 over 1 x 1 to 6 x 6 tiles): 8,030,804,000 in transformers 4.45.2 as a LlavaForConditionalGeneration,
  // and LlavaOnevisionForConditionalGeneration adds only image_newline (text hidden size: checked on a small config
  // of both classes, tied and not): 8,030,807,584.
  Llava onevision(preset("llava-onevision-qwen2-7b"), Device::meta(), DType::BF16);
  EXPECT_EQ(onevision.params().count(), 8030807584);
  EXPECT_EQ(preset("llava-onevision-qwen2-7b").vision.tokens_per_image(), 729);  // 27 x 27 patches, all kept
  EXPECT_EQ(preset("llava-onevision-qwen2-7b").anyres.pinpoints.size(), 36u);
  EXPECT_EQ(preset("llava-onevision-qwen2-7b").anyres.max_num_patches, 9);
  // The same tower with Qwen/Qwen2-0.5B's dimensions and tied embeddings: 893,617,312 in transformers 4.45.2 (its
  // LlavaForConditionalGeneration after tie_weights), as the published 0.5B OneVision's ~894M, and image_newline's 896.
  Llava small(preset("llava-onevision-qwen2-0.5b"), Device::meta(), DType::BF16);
  EXPECT_EQ(small.params().count(), 893618208);
}

// The closed-form count (validate's overflow check, the planner's capacity arithmetic) is the built model's.
TEST(ModelPresets, ParameterCountInClosedFormIsTheBuiltModels) {
  for (const std::string& name : preset_names()) {
    LlavaConfig c = preset(name);
    EXPECT_EQ(c.parameter_count(), Llava(c, Device::meta(), DType::BF16).params().count()) << name;
    c.projector = ProjectorType::Linear;
    c.llm.kv_heads = c.llm.heads / 2;
    EXPECT_EQ(c.parameter_count(), Llava(c, Device::meta(), DType::BF16).params().count()) << name << " (linear, GQA)";
    c.llm.decoder = Decoder::Qwen2;  // biases on q, k and v
    EXPECT_EQ(c.parameter_count(), Llava(c, Device::meta(), DType::BF16).params().count()) << name << " (qwen2)";
    c.vision.tower = Tower::Siglip;  // no class token or pre-norm, a biased patch embedding
    if (c.anyres.on()) c.vision.select_feature = FeatureSelect::ClsPatch;  // AnyRes: every SigLIP patch, as OneVision
    EXPECT_EQ(c.parameter_count(), Llava(c, Device::meta(), DType::BF16).params().count()) << name << " (siglip)";
    c.llm.tied_embeddings = true;  // one table for embed_tokens and lm_head
    EXPECT_EQ(c.parameter_count(), Llava(c, Device::meta(), DType::BF16).params().count()) << name << " (tied)";
  }
}

TEST(ModelPresets, NamesFollowLlavaHf) {
  Llava m(preset("tiny"), Device::meta(), DType::F32);
  for (const char* name :
       {"vision_tower.vision_model.encoder.layers.1.self_attn.q_proj.weight",
        "vision_tower.vision_model.embeddings.patch_embedding.weight", "multi_modal_projector.linear_1.weight",
        "language_model.model.layers.1.mlp.gate_proj.weight", "language_model.lm_head.weight",
        "language_model.model.embed_tokens.weight"})
    EXPECT_NE(m.params().find(name), nullptr) << name;
  EXPECT_EQ(new_layout_name("language_model.model.layers.0.mlp.up_proj.weight"),
            "model.language_model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(new_layout_name("language_model.lm_head.weight"), "lm_head.weight");
  EXPECT_EQ(new_layout_name("vision_tower.vision_model.pre_layrnorm.weight"),
            "model.vision_tower.vision_model.pre_layrnorm.weight");
}

TEST(ModelSpec, UnknownKeyNamesTheClosestValidOne) {
  const std::string path = testing::TempDir() + "/model.yaml";
  std::ofstream(path) << "model:\n  preset: tiny\n  llm:\n    hidden_sz: 64\n";
  try {
    load_model_spec(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown key 'model.llm.hidden_sz'; did you mean 'model.llm.hidden_size'?"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
  }
  std::ofstream(path) << "model:\n  preset: tiny\n  projector: mlp3x\n";
  EXPECT_THROW(load_model_spec(path), Error);
  std::ofstream(path) << "model:\n  preset: tiny\n  llm:\n    num_key_value_heads: 3\n";
  EXPECT_THROW(load_model_spec(path), Error);
}

TEST(Weights, LoadReportsMissingUnexpectedAndMisshapedByName) {
  Llava m(preset("tiny"), Device::cpu(), DType::F32);
  init_weights(m.params(), 1);
  NamedTensors w = named_weights(m.params());
  w.erase(w.begin());                                                                                  // one missing
  w.emplace_back("language_model.model.extra.weight", Tensor::zeros({2}, DType::F32, Device::cpu()));  // unexpected
  for (auto& [n, t] : w)
    if (n == "language_model.lm_head.weight") t = Tensor::zeros({3, 3}, DType::F32, Device::cpu());  // mis-shaped
  const std::string path = testing::TempDir() + "/w.safetensors";
  save_safetensors(path, w);
  try {
    load_weights(m.params(), Checkpoint::open(path));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("missing (1)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("language_model.model.extra.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("language_model.lm_head.weight (3, 3) (model wants (64, 32))"), std::string::npos) << msg;
  }
}

TEST(Weights, NewerLayoutAndBf16ConvertOnLoad) {
  Llava a(preset("tiny"), Device::cpu(), DType::F32);
  init_weights(a.params(), 3);
  NamedTensors w;
  for (auto& [n, t] : named_weights(a.params())) w.emplace_back(new_layout_name(n), t.to(DType::BF16));
  const std::string path = testing::TempDir() + "/new.safetensors";
  save_safetensors(path, w);
  Llava b(preset("tiny"), Device::cpu(), DType::F32);
  EXPECT_EQ(load_weights(b.params(), Checkpoint::open(path)), int64_t(a.params().all().size()));
  std::vector<float> x = a.params().find("language_model.lm_head.weight")->data.to(DType::BF16).to_floats();
  EXPECT_EQ(b.params().find("language_model.lm_head.weight")->data.to_floats(), x);
}

TEST(ModelPresets, TiedEmbeddingsHaveNoLmHeadOfTheirOwn) {
  LlavaConfig c = preset("tiny");
  c.llm.tied_embeddings = true;
  Llava m(c, Device::meta(), DType::F32);
  EXPECT_EQ(m.params().find("language_model.lm_head.weight"), nullptr);
  EXPECT_NE(m.params().find("language_model.model.embed_tokens.weight"), nullptr);
}

TEST(ModelPresets, Qwen2HasBiasesOnQKVOnly) {
  LlavaConfig c = preset("tiny");
  c.llm.decoder = Decoder::Qwen2;
  Llava m(c, Device::meta(), DType::F32);
  for (const char* name : {"q_proj", "k_proj", "v_proj"})
    EXPECT_NE(m.params().find(str("language_model.model.layers.1.self_attn.", name, ".bias")), nullptr) << name;
  EXPECT_EQ(m.params().find("language_model.model.layers.1.self_attn.o_proj.bias"), nullptr);
  EXPECT_EQ(m.params().find("language_model.model.layers.1.mlp.gate_proj.bias"), nullptr);
}

TEST(ModelPresets, SiglipHasNoClassTokenNoPreNormAndABiasedPatchEmbedding) {
  LlavaConfig c = preset("tiny");
  c.vision.tower = Tower::Siglip;
  c.vision.image_size = 10;  // 2 x 2 patches of 4 px: the last 2 pixel rows and columns are never read
  Llava m(c, Device::meta(), DType::F32);
  const std::string v = "vision_tower.vision_model.";
  EXPECT_NE(m.params().find(v + "embeddings.patch_embedding.bias"), nullptr);
  EXPECT_EQ(m.params().find(v + "embeddings.class_embedding"), nullptr);
  EXPECT_EQ(m.params().find(v + "pre_layrnorm.weight"), nullptr);
  EXPECT_NE(m.params().find(v + "post_layernorm.weight"), nullptr);
  EXPECT_EQ(m.params().find(v + "embeddings.position_embedding.weight")->data.size(0), 4);
  EXPECT_EQ(c.vision.tokens_per_image(), 3);  // `patch` drops the first position, as transformers' "default" does
  c.vision.select_feature = FeatureSelect::ClsPatch;
  EXPECT_EQ(c.vision.tokens_per_image(), 4);
  c.vision.tower = Tower::Clip;
  EXPECT_THROW(c.validate(), Error);  // CLIP's patches must tile the image
}

// An AnyRes image's token count without its mix is the mix's, and the planner's worst layout is the most crops (then
// tokens) a sequence has room for: LLaVA-NeXT's 672 x 672 pinpoint at its own size holds 576 + 48 x 49 = 2,928 tokens,
// and a 2,048-token sequence still meets its five crops in a wider image of fewer tokens.
TEST(Anyres, TokenCountsAreTheMixesAndTheWorstLayoutFitsTheSequence) {
  AnyresConfig next;
  next.pinpoints = {{336, 672}, {672, 336}, {672, 672}, {1008, 336}, {336, 1008}};
  AnyresConfig pooled = next, flat = next;
  pooled.max_num_patches = 2;
  flat.merge = PatchMerge::Flat;
  for (const AnyresConfig* c : {&next, &pooled, &flat})
    for (int64_t h : {1, 7, 100, 336, 337, 500, 672, 1000, 3000})
      for (int64_t w : {1, 9, 240, 336, 640, 671, 1008, 4000}) {
        int64_t mixed = -1;
        try {
          mixed = anyres_mix({h, w}, *c, 336, 24).tokens();
        } catch (const Error&) {  // thinner than every pinpoint keeps: refused by both
          EXPECT_THROW(anyres_tokens({h, w}, *c, 336, 24), Error) << h << " x " << w;
          continue;
        }
        EXPECT_EQ(anyres_tokens({h, w}, *c, 336, 24), mixed) << h << " x " << w;
      }
  EXPECT_EQ(anyres_worst_image(next, 336, 24), (data::Resolution{672, 672}));
  EXPECT_EQ(anyres_tokens({672, 672}, next, 336, 24), 2928);
  const data::Resolution fits = anyres_worst_image(next, 336, 24, 2046);
  EXPECT_EQ(anyres_crops(fits, next, 336), 5) << fits.height << " x " << fits.width;
  const int64_t tokens = anyres_tokens(fits, next, 336, 24);
  EXPECT_LE(tokens, 2046);
  EXPECT_GT(tokens, 1900) << fits.height << " x " << fits.width;  // the most a five-crop image has under the limit
  // Nothing fits: the largest layout, for the planner to name.
  EXPECT_EQ(anyres_worst_image(next, 336, 24, 100), (data::Resolution{672, 672}));
}
