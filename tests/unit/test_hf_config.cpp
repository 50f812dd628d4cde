// Hugging Face config.json to and from headroom's LlavaConfig: a round trip, llava-hf's 7B values, and a named
// error for every part of transformers' LlavaConfig headroom does not implement.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>

#include "models/hf_config.h"
#include "models/model_spec.h"

using namespace hr;
using namespace hr::models;
using json = nlohmann::json;

namespace {

void expect_error(const json& j, const std::string& fragment) {
  try {
    from_hf_config(j, "config.json");
    ADD_FAILURE() << "no error for " << fragment;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(HfConfig, RoundTripsEveryDimension) {
  LlavaConfig c = preset("small");
  c.vision.select_layer = -1;
  c.vision.select_feature = FeatureSelect::ClsPatch;
  c.llm.rope_theta = 500000.f;
  const json j = to_hf_config(c, core::DType::BF16);
  EXPECT_EQ(j["model_type"], "llava");
  EXPECT_EQ(j["torch_dtype"], "bfloat16");
  EXPECT_EQ(j["vision_feature_select_strategy"], "full");
  EXPECT_EQ(j["image_seq_length"], c.vision.tokens_per_image());
  const LlavaConfig back = from_hf_config(j, "config.json");
  EXPECT_EQ(back.vision.hidden, c.vision.hidden);
  EXPECT_EQ(back.vision.layers, c.vision.layers);
  EXPECT_EQ(back.vision.image_size, c.vision.image_size);
  EXPECT_EQ(back.vision.select_layer, -1);
  EXPECT_EQ(back.vision.select_feature, FeatureSelect::ClsPatch);
  EXPECT_EQ(back.llm.vocab, c.llm.vocab);
  EXPECT_EQ(back.llm.kv_heads, c.llm.kv_heads);
  EXPECT_EQ(back.llm.intermediate, c.llm.intermediate);
  EXPECT_EQ(back.llm.rope_theta, 500000.f);
  EXPECT_EQ(back.image_token_id, c.image_token_id);
  EXPECT_EQ(back.projector, ProjectorType::Mlp2xGelu);
}

TEST(HfConfig, ReadsLlavaHfSevenBAsThePreset) {
  // llava-hf/llava-1.5-7b-hf's config.json, abridged to the keys that matter (values as published).
  const json j = json::parse(R"({
    "architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "ignore_index": -100,
    "image_token_index": 32000, "projector_hidden_act": "gelu", "vision_feature_layer": -2,
    "vision_feature_select_strategy": "default", "tie_word_embeddings": false,
    "text_config": {"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 4096, "model_type": "llama",
                    "rms_norm_eps": 1e-05, "torch_dtype": "float16", "vocab_size": 32064},
    "vision_config": {"hidden_size": 1024, "image_size": 336, "intermediate_size": 4096, "model_type": "clip_vision_model",
                      "num_attention_heads": 16, "num_hidden_layers": 24, "patch_size": 14, "projection_dim": 768}})");
  // The text config's other dimensions are LlamaConfig's defaults (Llama-2-7B's), filled as transformers does.
  const LlavaConfig c = from_hf_config(j, "config.json"), want = preset("llava-1.5-7b");
  EXPECT_EQ(c.llm.hidden, want.llm.hidden);
  EXPECT_EQ(c.llm.layers, want.llm.layers);
  EXPECT_EQ(c.llm.intermediate, want.llm.intermediate);
  EXPECT_EQ(c.vision.hidden, want.vision.hidden);
  EXPECT_EQ(c.vision.layers, want.vision.layers);
  EXPECT_EQ(c.llm.kv_heads, want.llm.kv_heads);  // absent: as many as the attention heads
  EXPECT_EQ(c.llm.vocab, want.llm.vocab);
  EXPECT_EQ(c.vision.tokens_per_image(), 576);
  EXPECT_EQ(c.image_token_id, 32000);
}

TEST(HfConfig, RefusesWhatHeadroomDoesNotImplementNamingTheKey) {
  const json good = to_hf_config(preset("tiny"), core::DType::F32);
  auto with = [&](const std::string& section, const std::string& key, const json& value) {
    json j = good;
    (section.empty() ? j : j[section])[key] = value;
    return j;
  };
  expect_error(with("", "model_type", "llava_next_video"), "model_type 'llava_next_video'");
  // LLaVA-OneVision: LlavaOnevisionConfig's default pinpoints (tiles of 384 px) do not fit the tiny tower either;
  // vision_aspect_ratio is anyres_max_N (anyres_max_9 where absent)
  expect_error(with("", "model_type", "llava_onevision"),
               "image_grid_pinpoints[0] = [384, 384] makes 2304 tiles of 8 px");
  json onevision = with("", "model_type", "llava_onevision");
  onevision["image_grid_pinpoints"] = {{8, 16}, {16, 8}};
  EXPECT_EQ(from_hf_config(onevision, "config.json").anyres.max_num_patches, 9);
  onevision["vision_aspect_ratio"] = "anyres_max_4";
  EXPECT_EQ(from_hf_config(onevision, "config.json").anyres.max_num_patches, 4);
  onevision["vision_aspect_ratio"] = "anyres_max_x";
  expect_error(onevision, "vision_aspect_ratio 'anyres_max_x' is not anyres_max_N");
  onevision["vision_aspect_ratio"] = 9;
  expect_error(onevision, "vision_aspect_ratio has value 9 of the wrong type");
  onevision["vision_aspect_ratio"] = "anyres";
  expect_error(onevision, "LlavaOnevisionForConditionalGeneration pools by anyres_max_N");
  // LLaVA-NeXT: transformers' default pinpoints (336 px tiles) do not fit the tiny 8-px tower; its own are checked
  expect_error(with("", "model_type", "llava_next"), "image_grid_pinpoints[0] = [336, 672] makes 3528 tiles of 8 px");
  json next = with("", "model_type", "llava_next");
  next["image_grid_pinpoints"] = {{8, 24}, {8, 12}};
  expect_error(next, "image_grid_pinpoints[1] = [8, 12] is not a positive multiple of the tower's 8 px");
  next["image_grid_pinpoints"] = {{8, 24}, {24, 8}};
  EXPECT_EQ(from_hf_config(next, "config.json").anyres.pinpoints, (std::vector<data::Resolution>{{8, 24}, {24, 8}}));
  expect_error(with("text_config", "hidden_size", "big"),
               "text_config.hidden_size has value \"big\" of the wrong type");
  expect_error(with("text_config", "model_type", "gemma"), "text_config.model_type 'gemma'");
  expect_error(with("text_config", "rope_scaling", json{{"type", "linear"}, {"factor", 2.0}}),
               "text_config.rope_scaling");
  expect_error(with("text_config", "attention_bias", true), "text_config.attention_bias");
  expect_error(with("text_config", "hidden_act", "gelu"), "text_config.hidden_act");
  expect_error(with("", "tie_word_embeddings", true), "tie_word_embeddings true disagrees");
  expect_error(with("vision_config", "hidden_act", "gelu"), "vision_config.hidden_act");
  expect_error(with("", "projector_hidden_act", "relu"), "projector_hidden_act");
  expect_error(with("", "vision_feature_layer", json::array({-2, -5})), "vision_feature_layer");
  expect_error(with("", "vision_feature_select_strategy", "cls"), "vision_feature_select_strategy 'cls'");
  LlavaConfig linear = preset("tiny");
  linear.projector = ProjectorType::Linear;
  std::string why;
  EXPECT_FALSE(hf_expressible(linear, &why));
  EXPECT_NE(why.find("mlp2x_gelu"), std::string::npos);
  LlavaConfig flat = preset("tiny");
  flat.anyres.pinpoints = {{8, 16}};
  flat.anyres.merge = PatchMerge::Flat;
  EXPECT_FALSE(hf_expressible(flat, &why));
  EXPECT_NE(why.find("spatial_unpad only"), std::string::npos);
  EXPECT_THROW(to_hf_config(linear, core::DType::F32), Error);
}

// A config.json's sizes are checked as the config's are, under config.json's own key names: an intermediate_size of 0
// made the kernels divide by zero (SIGFPE), 0 heads divided by zero while head_dim was checked, and counts no
// int64 holds (1e30) converted to garbage.
TEST(HfConfig, ZeroAndOverflowingSizesAreRefusedNamingTheKey) {
  const json good = to_hf_config(preset("tiny"), core::DType::F32);
  auto with = [&](const std::string& section, const std::string& key, const json& value) {
    json j = good;
    j[section][key] = value;
    return j;
  };
  expect_error(with("text_config", "intermediate_size", 0),
               "[hf] config.json: text_config.intermediate_size 0 must be positive");
  expect_error(with("vision_config", "intermediate_size", 0), "vision_config.intermediate_size 0 must be positive");
  json heads = with("text_config", "num_attention_heads", 0);
  heads["text_config"]["head_dim"] = 8;
  expect_error(heads, "text_config.num_attention_heads 0 must be positive");
  expect_error(with("text_config", "hidden_size", 1e30), "text_config.hidden_size 1e+30 is out of range");
  expect_error(with("text_config", "rope_theta", -1.0), "text_config.rope_theta -1 must be a positive finite number");
  json big = with("text_config", "hidden_size", 6e9);
  big["text_config"]["num_attention_heads"] = 2;
  big["text_config"]["num_key_value_heads"] = 2;
  expect_error(big, "overflow 64-bit byte counts");
  expect_error(big, "text_config.hidden_size 6000000000");
}

TEST(HfConfig, ModelNameOrPathReadsTheDirectory) {
  const std::string dir = testing::TempDir() + "/hf_config_dir";
  std::filesystem::create_directories(dir);
  write_hf_config(dir, preset("tiny"), core::DType::F32);
  EXPECT_TRUE(std::filesystem::exists(dir + "/generation_config.json"));
  const std::string yaml = dir + "/model.yaml";
  std::ofstream(yaml) << "model:\n  name_or_path: " << dir << "\n  llm: {rope_theta: 20000.0}\n";
  const ModelSpec s = load_model_spec(yaml);
  EXPECT_EQ(s.name_or_path, dir);
  EXPECT_EQ(s.config.llm.hidden, preset("tiny").llm.hidden);
  EXPECT_EQ(s.config.llm.rope_theta, 20000.f);  // explicit keys still override
  std::ofstream(yaml) << "model:\n  preset: tiny\n  name_or_path: " << dir << "\n";
  EXPECT_THROW(load_model_spec(yaml), Error);
  std::ofstream(yaml) << "model:\n  name_or_path: " << dir << "/missing\n";
  try {
    load_model_spec(yaml);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing/config.json: cannot open"), std::string::npos) << e.what();
  }
}

// Qwen2's tokenizer has no BOS (-1 here): config.json and generation_config.json say null, as transformers writes
// a token the tokenizer lacks, and the ids read back as they were written.
TEST(HfConfig, ATokenTheTokenizerLacksIsNullAndReadsBack) {
  const TokenIds qwen{-1, 151643, 151643};
  const json j = to_hf_config(preset("tiny"), core::DType::BF16, qwen);
  EXPECT_TRUE(j["text_config"]["bos_token_id"].is_null()) << j["text_config"].dump();
  EXPECT_EQ(j["text_config"]["eos_token_id"], 151643);
  const TokenIds back = token_ids_from_hf(j["text_config"], "config.json", "text_config.");
  EXPECT_EQ(back.bos, -1);
  EXPECT_EQ(back.eos, 151643);
  EXPECT_EQ(back.pad, 151643);

  const std::string dir = testing::TempDir() + "/hf_config_tokens";
  std::filesystem::create_directories(dir);
  write_hf_config(dir, preset("tiny"), core::DType::F32, qwen);
  const json gen = json::parse(std::ifstream(dir + "/generation_config.json"));
  EXPECT_TRUE(gen["bos_token_id"].is_null()) << gen.dump();
  EXPECT_EQ(gen["pad_token_id"], 151643);

  // Absent keys keep the byte tokenizer's ids; a value that is no id is refused by its key.
  const TokenIds none = token_ids_from_hf(json::object(), "config.json", "text_config.");
  EXPECT_EQ(none.bos, 1);
  EXPECT_EQ(none.eos, 2);
  EXPECT_EQ(none.pad, 0);
  try {
    token_ids_from_hf(json{{"eos_token_id", "</s>"}}, "ckpt/config.json", "text_config.");
    ADD_FAILURE() << "a string eos_token_id was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ckpt/config.json: text_config.eos_token_id"), std::string::npos) << e.what();
  }
  try {
    token_ids_from_hf(json::array(), "ckpt/config.json", "text_config.");
    ADD_FAILURE() << "a text_config that is no object was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ckpt/config.json: text_config is not a JSON object"), std::string::npos)
        << e.what();
  }
}

// LLaVA's stage-1 start: model.vision_tower (a CLIP or CLIPVisionModel directory) + model.language_model.
TEST(HfConfig, VisionTowerAndLanguageModelJoinAsLlavaHfDoes) {
  namespace fs = std::filesystem;
  const fs::path d = fs::temp_directory_path() / "hr_stage1_config";
  fs::remove_all(d);
  fs::create_directories(d / "clip");
  fs::create_directories(d / "tower");
  fs::create_directories(d / "llama");
  std::ofstream(d / "clip" / "config.json") << R"({"model_type": "clip", "vision_config": {"hidden_size": 16,
      "intermediate_size": 32, "num_hidden_layers": 3, "num_attention_heads": 2, "image_size": 16, "patch_size": 4}})";
  std::ofstream(d / "tower" / "config.json") << R"({"model_type": "clip_vision_model", "hidden_size": 16,
      "intermediate_size": 32, "num_hidden_layers": 3, "num_attention_heads": 2, "image_size": 16, "patch_size": 4})";
  std::ofstream(d / "llama" / "config.json") << R"({"model_type": "llama", "vocab_size": 32000, "hidden_size": 32,
      "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2})";
  for (const char* tower : {"clip", "tower"}) {
    const ModelSpec s = parse_model_spec(
        YAML::Load(str("{vision_tower: ", (d / tower).string(), ", language_model: ", (d / "llama").string(), "}")),
        "t");
    EXPECT_EQ(s.config.image_token_id, 32000);
    EXPECT_EQ(s.config.llm.vocab, 32064);  // "<image>" and "<pad>", padded to 64 as llava-hf's conversion
    EXPECT_EQ(s.config.vision.hidden, 16);
    EXPECT_EQ(s.config.vision.select_layer, -2);
    EXPECT_EQ(s.vision_tower, (d / tower).string());
  }
  auto err = [&](const std::string& yaml) {
    try {
      parse_model_spec(YAML::Load(yaml), "t.yaml");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(err(str("{vision_tower: ", (d / "clip").string(), "}")).find("go together"), std::string::npos);
  EXPECT_NE(err(str("{vision_tower: ", (d / "clip").string(), ", language_model: ", (d / "llama").string(),
                    ", preset: tiny}"))
                .find("drop model.preset"),
            std::string::npos);
  EXPECT_NE(err(str("{vision_tower: ", (d / "llama").string(), ", language_model: ", (d / "llama").string(), "}"))
                .find("is none of 'clip', 'clip_vision_model'"),
            std::string::npos);
  EXPECT_NE(err(str("{vision_tower: ", (d / "clip").string(), ", language_model: ", (d / "clip").string(), "}"))
                .find("is not 'llama', 'qwen2' or 'mistral'"),
            std::string::npos);
  // A Qwen2ForCausalLM joins the same way, its decoder (and Qwen2Config's defaults) kept.
  fs::create_directories(d / "qwen2");
  std::ofstream(d / "qwen2" / "config.json") << R"({"model_type": "qwen2", "vocab_size": 151646, "hidden_size": 32,
      "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "rope_theta": 1000000.0, "use_sliding_window": false, "tie_word_embeddings": false})";
  const ModelSpec q = parse_model_spec(
      YAML::Load(str("{vision_tower: ", (d / "tower").string(), ", language_model: ", (d / "qwen2").string(), "}")),
      "t");
  EXPECT_EQ(q.config.llm.decoder, Decoder::Qwen2);
  EXPECT_EQ(q.config.image_token_id, 151646);
  EXPECT_EQ(q.config.llm.vocab, 151680);
  EXPECT_EQ(q.config.llm.rms_norm_eps, 1e-6f);
}

// Qwen2 and Mistral decoders: their model_type round-trips, transformers' defaults of each class fill what the JSON
// leaves out, and what headroom does not run (Qwen2's window, LLaMA's biases) is refused by name.
TEST(HfConfig, Qwen2AndMistralDecodersRoundTripWithTheirDefaults) {
  for (Decoder d : {Decoder::Qwen2, Decoder::Mistral}) {
    LlavaConfig c = preset("small");
    c.llm.decoder = d;
    c.llm.rope_theta = 1e6f;
    if (d == Decoder::Mistral) c.llm.sliding_window = 4096;
    c.llm.tied_embeddings = d == Decoder::Qwen2;
    const json j = to_hf_config(c, core::DType::BF16);
    EXPECT_EQ(j["tie_word_embeddings"], c.llm.tied_embeddings);
    EXPECT_EQ(j["text_config"]["tie_word_embeddings"], c.llm.tied_embeddings);
    EXPECT_EQ(j["text_config"]["model_type"], decoder_name(d));
    EXPECT_EQ(j["text_config"]["architectures"][0], d == Decoder::Qwen2 ? "Qwen2ForCausalLM" : "MistralForCausalLM");
    EXPECT_FALSE(j["text_config"].contains("attention_bias"));  // a LLaMA key
    const LlavaConfig back = from_hf_config(j, "config.json");
    EXPECT_EQ(back.llm.decoder, d);
    EXPECT_EQ(back.llm.qkv_bias(), d == Decoder::Qwen2);
    EXPECT_EQ(back.llm.sliding_window, c.llm.sliding_window);
    EXPECT_EQ(back.llm.tied_embeddings, c.llm.tied_embeddings);
    EXPECT_EQ(back.llm.rope_theta, 1e6f);
    EXPECT_EQ(back.parameter_count(), c.parameter_count());
  }
  // Absent keys: Qwen2Config's and MistralConfig's defaults, not LlamaConfig's.
  json qwen = {{"model_type", "qwen2"}};
  const LlmConfig q = llm_from_hf(qwen, "config.json", "text_config.");
  EXPECT_EQ(q.vocab, 151936);
  EXPECT_EQ(q.intermediate, 22016);
  EXPECT_EQ(q.sliding_window, 0);
  const LlmConfig m = llm_from_hf(json{{"model_type", "mistral"}}, "config.json", "text_config.");
  EXPECT_EQ(m.intermediate, 14336);
  EXPECT_EQ(m.kv_heads, 8);
  EXPECT_EQ(m.sliding_window, 4096);
  EXPECT_EQ(llm_from_hf(json{{"model_type", "mistral"}, {"sliding_window", nullptr}}, "c", "").sliding_window, 0);

  json j = to_hf_config(preset("tiny"), core::DType::F32);
  j["text_config"]["model_type"] = "qwen2";
  j["text_config"].erase("attention_bias");
  j["text_config"].erase("mlp_bias");
  j["text_config"]["use_sliding_window"] = "yes";
  expect_error(j, "text_config.use_sliding_window has value \"yes\" of the wrong type");
  j["text_config"]["use_sliding_window"] = true;  // Qwen2Config's window (4096) in its layers from 28 on
  EXPECT_EQ(from_hf_config(j, "config.json").llm.sliding_window, 4096);
  EXPECT_EQ(from_hf_config(j, "config.json").llm.max_window_layers, 28);
  j["text_config"]["use_sliding_window"] = false;
  j["text_config"]["tie_word_embeddings"] = true;  // Qwen2-0.5B's, with the top level saying otherwise
  expect_error(j, "tie_word_embeddings false disagrees with text_config.tie_word_embeddings true");
  j["tie_word_embeddings"] = true;
  EXPECT_TRUE(from_hf_config(j, "config.json").llm.tied_embeddings);
  j["text_config"]["tie_word_embeddings"] = "yes";
  expect_error(j, "text_config.tie_word_embeddings has value \"yes\" of the wrong type");
  j["text_config"]["tie_word_embeddings"] = false;
  j["tie_word_embeddings"] = false;
  j["text_config"]["sliding_window"] = 64;  // Qwen2Config: no window unless use_sliding_window says so
  EXPECT_EQ(from_hf_config(j, "config.json").llm.sliding_window, 0);
}

// Qwen2's window: use_sliding_window turns it on, max_window_layers says from which layer; read as transformers'
// Qwen2Config reads it and written back so that it reads the same.
TEST(HfConfig, Qwen2SlidingWindowAppliesFromMaxWindowLayers) {
  const json t = {{"model_type", "qwen2"},
                  {"num_hidden_layers", 4},
                  {"use_sliding_window", true},
                  {"sliding_window", 64},
                  {"max_window_layers", 2}};
  LlmConfig l = llm_from_hf(t, "c", "text_config.");
  EXPECT_EQ(l.sliding_window, 64);
  EXPECT_EQ(l.max_window_layers, 2);
  EXPECT_TRUE(l.windowed());
  EXPECT_EQ(l.window_of(1), 0);
  EXPECT_EQ(l.window_of(2), 64);
  EXPECT_EQ(l.window_of(3), 64);
  l.max_window_layers = 4;  // no layer from 4 on: every layer attends over everything
  EXPECT_FALSE(l.windowed());
  EXPECT_EQ(l.window_of(3), 0);

  json off = t;  // null window: none, whatever max_window_layers says
  off["sliding_window"] = nullptr;
  EXPECT_EQ(llm_from_hf(off, "c", "").sliding_window, 0);
  EXPECT_EQ(llm_from_hf(off, "c", "").max_window_layers, 0);
  off["use_sliding_window"] = nullptr;  // null: Qwen2Config's false
  EXPECT_EQ(llm_from_hf(off, "c", "").sliding_window, 0);

  LlavaConfig c = preset("tiny");
  c.llm.decoder = Decoder::Qwen2;
  c.llm.sliding_window = 64;
  c.llm.max_window_layers = 1;
  const json j = to_hf_config(c, core::DType::F32);
  EXPECT_EQ(j.at("text_config").at("use_sliding_window"), json(true));
  EXPECT_EQ(j.at("text_config").at("max_window_layers"), json(1));
  const LlmConfig back = from_hf_config(j, "config.json").llm;
  EXPECT_EQ(back.sliding_window, 64);
  EXPECT_EQ(back.max_window_layers, 1);
  c.llm.sliding_window = 0;
  c.llm.max_window_layers = 0;
  EXPECT_EQ(to_hf_config(c, core::DType::F32).at("text_config").at("use_sliding_window"), json(false));
}

TEST(HfConfig, LlavaNextMistralPresetIsThePublishedShape) {
  // llava-hf/llava-v1.6-mistral-7b-hf's text_config (values as published; Mistral-7B-Instruct-v0.2).
  const json t = json::parse(R"({"architectures": ["MistralForCausalLM"], "intermediate_size": 14336,
      "max_position_embeddings": 32768, "model_type": "mistral", "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
      "rope_theta": 1000000.0, "sliding_window": null, "torch_dtype": "bfloat16", "vocab_size": 32064})");
  const LlmConfig l = llm_from_hf(t, "config.json", "text_config."), want = preset("llava-v1.6-mistral-7b").llm;
  EXPECT_EQ(l.decoder, want.decoder);
  EXPECT_EQ(l.vocab, want.vocab);
  EXPECT_EQ(l.hidden, want.hidden);
  EXPECT_EQ(l.layers, want.layers);
  EXPECT_EQ(l.heads, want.heads);
  EXPECT_EQ(l.kv_heads, want.kv_heads);
  EXPECT_EQ(l.intermediate, want.intermediate);
  EXPECT_EQ(l.rope_theta, want.rope_theta);
  EXPECT_EQ(l.sliding_window, want.sliding_window);
  EXPECT_EQ(l.rms_norm_eps, want.rms_norm_eps);
}

TEST(HfConfig, SiglipTowerRoundTripsAndItsPoolingHeadIsRefusedByName) {
  LlavaConfig c = preset("small");
  c.vision.tower = Tower::Siglip;
  c.vision.image_size = 70;
  c.vision.select_feature = FeatureSelect::ClsPatch;
  const json j = to_hf_config(c, core::DType::F32);
  EXPECT_EQ(j["vision_config"]["model_type"], "siglip_vision_model");
  EXPECT_EQ(j["vision_config"]["hidden_act"], "gelu_pytorch_tanh");
  EXPECT_EQ(j["vision_config"]["vision_use_head"], false);
  EXPECT_EQ(j["vision_feature_select_strategy"], "full");
  const LlavaConfig back = from_hf_config(j, "config.json");
  EXPECT_EQ(back.vision.tower, Tower::Siglip);
  EXPECT_EQ(back.vision.image_size, 70);
  EXPECT_EQ(back.parameter_count(), c.parameter_count());
  // SiglipVisionConfig's defaults for what is absent.
  const VisionConfig d =
      vision_from_hf(json{{"model_type", "siglip_vision_model"}, {"vision_use_head", false}}, "c", "vision_config.");
  EXPECT_EQ(d.patch, 16);
  EXPECT_EQ(d.layer_norm_eps, 1e-6f);
  json head = j;
  head["vision_config"].erase("vision_use_head");  // transformers' default builds the head
  expect_error(head, "vision_config.vision_use_head must be false");
  json act = j;
  act["vision_config"]["hidden_act"] = "quick_gelu";
  expect_error(act, "vision_config.hidden_act");
}
