// transformers' LlavaConfig (model_type "llava", a "llama" text_config and a "clip_vision_model"
// vision_config) to and from headroom's LlavaConfig.
#include "models/hf_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <type_traits>

#include "core/check.h"
#include "core/io/atomic_file.h"
#include "data/anyres.h"

namespace hr::models {

namespace {

using json = nlohmann::json;

// The positions RoPE is computed for have no limit in headroom; transformers wants a number.
constexpr int64_t kMaxPositions = 4096;

const char* torch_dtype(core::DType t) {
  switch (t) {
    case core::DType::BF16:
      return "bfloat16";
    case core::DType::F16:
      return "float16";
    default:
      return "float32";
  }
}

template <typename T>
T get(const json& j, const char* key, const std::string& where, const std::string& path) {
  HR_CHECK(j.contains(key), "[hf] ", where, ": ", path, key, " is missing");
  if constexpr (std::is_integral_v<T>) {  // 6e9 or 1e30 as a count: whole and within range, or refused by name
    const json& v = j.at(key);
    const bool whole = v.is_number_integer() || (v.is_number_float() && std::trunc(v.get<double>()) == v.get<double>());
    HR_CHECK(v.is_number() && whole, "[hf] ", where, ": ", path, key, " has value ", v.dump(), " of the wrong type");
    const double d = v.is_number_unsigned() ? double(v.get<uint64_t>()) : v.get<double>();
    HR_CHECK(d >= double(std::numeric_limits<T>::min()) && d < double(std::numeric_limits<T>::max()), "[hf] ", where,
             ": ", path, key, " ", v.dump(), " is out of range");
  }
  try {
    return j.at(key).get<T>();
  } catch (const json::exception&) {
    throw Error(str("[hf] ", where, ": ", path, key, " has value ", j.at(key).dump(), " of the wrong type"));
  }
}

// A key's value, or transformers' default when the key is absent or null.
template <typename T>
T get_or(const json& j, const char* key, T fallback, const std::string& where, const std::string& path) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  return get<T>(j, key, where, path);
}

// A key headroom implements one way only: absent, or the value given.
template <typename T>
void require(const json& j, const char* key, const T& want, const std::string& where, const std::string& path,
             const std::string& why) {
  if (!j.contains(key) || j.at(key).is_null()) return;
  HR_CHECK(j.at(key) == json(want), "[hf] ", where, ": ", path, key, " is ", j.at(key).dump(), "; headroom supports ",
           json(want).dump(), " only (", why, ")");
}

// bos_token_id, eos_token_id and pad_token_id, null for a token the tokenizer lacks.
json token_keys(const TokenIds& t) {
  const auto id = [](int64_t v) { return v < 0 ? json(nullptr) : json(v); };
  return {{"bos_token_id", id(t.bos)}, {"eos_token_id", id(t.eos)}, {"pad_token_id", id(t.pad)}};
}

const char* causal_lm_class(Decoder d) {
  switch (d) {
    case Decoder::Qwen2:
      return "Qwen2ForCausalLM";
    case Decoder::Mistral:
      return "MistralForCausalLM";
    default:
      return "LlamaForCausalLM";
  }
}

}  // namespace

VisionConfig vision_from_hf(const json& vj, const std::string& where, const std::string& vp) {
  const std::string type = vj.value("model_type", "clip_vision_model");
  HR_CHECK(type == "clip_vision_model" || type == "siglip_vision_model", "[hf] ", where, ": ", vp, "model_type '", type,
           "': headroom's vision towers are clip_vision_model and siglip_vision_model");
  VisionConfig v;
  v.tower = parse_tower(type, vp + "model_type");
  const bool siglip = v.tower == Tower::Siglip;
  v.hidden = get_or<int64_t>(vj, "hidden_size", 768, where, vp);
  v.intermediate = get_or<int64_t>(vj, "intermediate_size", 3072, where, vp);
  v.layers = get_or<int64_t>(vj, "num_hidden_layers", 12, where, vp);
  v.heads = get_or<int64_t>(vj, "num_attention_heads", 12, where, vp);
  v.image_size = get_or<int64_t>(vj, "image_size", 224, where, vp);
  v.patch = get_or<int64_t>(vj, "patch_size", siglip ? 16 : 32, where, vp);
  v.channels = get_or<int64_t>(vj, "num_channels", 3, where, vp);
  v.layer_norm_eps = get_or<float>(vj, "layer_norm_eps", siglip ? 1e-6f : 1e-5f, where, vp);
  if (!siglip) {
    require(vj, "hidden_act", std::string("quick_gelu"), where, vp, "CLIP's MLP activation");
    return v;
  }
  require(vj, "hidden_act", std::string("gelu_pytorch_tanh"), where, vp, "SigLIP's MLP activation");
  // transformers builds SigLIP's attention-pooling head unless told not to; LLaVA reads hidden states, never it.
  HR_CHECK(vj.contains("vision_use_head") && vj.at("vision_use_head") == json(false), "[hf] ", where, ": ", vp,
           "vision_use_head must be false (as LLaVA-OneVision's configs have it): headroom's SigLIP tower has no "
           "attention-pooling head, which LLaVA never uses");
  return v;
}

namespace {

// text_config.sliding_window as MistralConfig and Qwen2Config read it: absent, their 4096; null, no window (0).
int64_t window_tokens(const json& t, const std::string& where, const std::string& tp) {
  if (t.contains("sliding_window") && t.at("sliding_window").is_null()) return 0;
  return get_or<int64_t>(t, "sliding_window", 4096, where, tp);
}

// Qwen2Config's window holds only with use_sliding_window (absent or null: false), and only in the layers from
// max_window_layers (absent: 28) on.
void read_qwen2_window(const json& t, const std::string& where, const std::string& tp, LlmConfig& l) {
  const json use = t.contains("use_sliding_window") ? t.at("use_sliding_window") : json(false);
  HR_CHECK(use.is_boolean() || use.is_null(), "[hf] ", where, ": ", tp, "use_sliding_window has value ", use.dump(),
           " of the wrong type");
  if (use != json(true)) return;
  l.sliding_window = window_tokens(t, where, tp);
  l.max_window_layers = l.sliding_window > 0 ? get_or<int64_t>(t, "max_window_layers", 28, where, tp) : 0;
}

// The keys only one decoder's config class has.
void write_decoder_keys(const LlmConfig& l, json& text) {
  switch (l.decoder) {
    case Decoder::Llama:
      text["attention_bias"] = false;
      text["mlp_bias"] = false;
      break;
    case Decoder::Qwen2:
      text["use_sliding_window"] = l.sliding_window > 0;
      if (l.sliding_window > 0) {
        text["sliding_window"] = l.sliding_window;
        text["max_window_layers"] = l.max_window_layers;
      }
      break;
    case Decoder::Mistral:
      text["sliding_window"] = l.sliding_window > 0 ? json(l.sliding_window) : json(nullptr);
      break;
  }
}

}  // namespace

LlmConfig llm_from_hf(const json& t, const std::string& where, const std::string& tp) {
  const std::string type = t.value("model_type", "llama");
  HR_CHECK(type == "llama" || type == "qwen2" || type == "mistral", "[hf] ", where, ": ", tp, "model_type '", type,
           "': headroom's decoders are llama, qwen2 and mistral");
  // What the JSON leaves out takes the default of transformers' LlamaConfig, Qwen2Config or MistralConfig, as
  // from_pretrained does (a saved config.json writes only what differs from them).
  LlmConfig l;
  l.decoder = parse_decoder(type, tp + "model_type");
  const bool qwen2 = l.decoder == Decoder::Qwen2, mistral = l.decoder == Decoder::Mistral;
  l.vocab = get_or<int64_t>(t, "vocab_size", qwen2 ? 151936 : 32000, where, tp);
  l.hidden = get_or<int64_t>(t, "hidden_size", 4096, where, tp);
  l.intermediate = get_or<int64_t>(t, "intermediate_size", qwen2 ? 22016 : mistral ? 14336 : 11008, where, tp);
  l.layers = get_or<int64_t>(t, "num_hidden_layers", 32, where, tp);
  l.heads = get_or<int64_t>(t, "num_attention_heads", 32, where, tp);
  l.kv_heads = get_or<int64_t>(t, "num_key_value_heads", mistral ? 8 : l.heads, where, tp);
  l.rms_norm_eps = get_or<float>(t, "rms_norm_eps", 1e-6f, where, tp);
  l.rope_theta = get_or<float>(t, "rope_theta", 10000.f, where, tp);
  require(t, "hidden_act", std::string("silu"), where, tp, "SwiGLU with SiLU");
  require(t, "rope_scaling", json(nullptr), where, tp, "plain RoPE");
  const json tie = t.value("tie_word_embeddings", json(false));  // every text class's default: untied
  HR_CHECK(tie.is_boolean() || tie.is_null(), "[hf] ", where, ": ", tp, "tie_word_embeddings has value ", tie.dump(),
           " of the wrong type");
  l.tied_embeddings = tie == json(true);
  if (l.decoder == Decoder::Llama) {
    require(t, "attention_bias", false, where, tp, "LLaMA's projections have no bias");
    require(t, "mlp_bias", false, where, tp, "LLaMA's projections have no bias");
  }
  if (qwen2) read_qwen2_window(t, where, tp, l);
  if (mistral) l.sliding_window = window_tokens(t, where, tp);  // Mistral-7B-Instruct-v0.2's null: no window
  if (t.contains("head_dim") && !t.at("head_dim").is_null() && l.heads > 0)  // 0 heads: validate() names them
    HR_CHECK(t.at("head_dim") == json(l.hidden / l.heads), "[hf] ", where, ": ", tp, "head_dim ",
             t.at("head_dim").dump(), " is not hidden_size / num_attention_heads");
  return l;
}

bool hf_expressible(const LlavaConfig& c, std::string* why) {
  const char* no = nullptr;
  if (c.projector != ProjectorType::Mlp2xGelu)
    no = "transformers' LLaVA has only the mlp2x_gelu projector (linear_1, gelu, linear_2), not 'linear'";
  else if (c.anyres.on() && c.anyres.merge != PatchMerge::SpatialUnpad)
    no = "transformers' LlavaNext and LlavaOnevision merge AnyRes crops as spatial_unpad only, not 'flat'";
  if (no && why) *why = no;
  return !no;
}

json to_hf_config(const LlavaConfig& c, core::DType dtype, const TokenIds& tokens) {
  std::string why;
  HR_CHECK(hf_expressible(c, &why), "[hf] cannot write config.json: ", why);
  const VisionConfig& v = c.vision;
  const LlmConfig& l = c.llm;
  json text = {{"model_type", decoder_name(l.decoder)},
               {"architectures", {causal_lm_class(l.decoder)}},
               {"vocab_size", l.vocab},
               {"hidden_size", l.hidden},
               {"intermediate_size", l.intermediate},
               {"num_hidden_layers", l.layers},
               {"num_attention_heads", l.heads},
               {"num_key_value_heads", l.kv_heads},
               {"hidden_act", "silu"},
               {"rms_norm_eps", l.rms_norm_eps},
               {"rope_theta", l.rope_theta},
               {"rope_scaling", nullptr},
               {"max_position_embeddings", kMaxPositions},
               {"tie_word_embeddings", l.tied_embeddings},
               {"torch_dtype", torch_dtype(dtype)}};
  text.update(token_keys(tokens));
  write_decoder_keys(l, text);
  json vision = {{"model_type", tower_name(v.tower)},
                 {"hidden_size", v.hidden},
                 {"intermediate_size", v.intermediate},
                 {"num_hidden_layers", v.layers},
                 {"num_attention_heads", v.heads},
                 {"image_size", v.image_size},
                 {"patch_size", v.patch},
                 {"num_channels", v.channels},
                 {"layer_norm_eps", v.layer_norm_eps}};
  if (v.tower == Tower::Clip) {
    vision["hidden_act"] = "quick_gelu";
    vision["projection_dim"] = v.hidden;
  } else {  // LLaVA-OneVision's: no attention-pooling head (LLaVA never reads it)
    vision["hidden_act"] = "gelu_pytorch_tanh";
    vision["vision_use_head"] = false;
  }
  const bool next = c.anyres.on(), onevision = next && c.anyres.max_num_patches > 0;
  json out = {{"architectures",
               {onevision ? "LlavaOnevisionForConditionalGeneration"
                : next    ? "LlavaNextForConditionalGeneration"
                          : "LlavaForConditionalGeneration"}},
              {"model_type", onevision ? "llava_onevision"
                             : next    ? "llava_next"
                                       : "llava"},
              {"image_token_index", c.image_token_id},
              {"image_seq_length", v.tokens_per_image()},
              {"projector_hidden_act", "gelu"},
              {"vision_feature_layer", v.select_layer},
              {"vision_feature_select_strategy", v.select_feature == FeatureSelect::Patch ? "default" : "full"},
              {"ignore_index", c.ignore_index},
              {"tie_word_embeddings", c.llm.tied_embeddings},
              {"torch_dtype", torch_dtype(dtype)},
              {"text_config", text},
              {"vision_config", vision}};
  if (next) {
    json pinpoints = json::array();
    for (const data::Resolution& p : c.anyres.pinpoints) pinpoints.push_back({p.height, p.width});
    out["image_grid_pinpoints"] = pinpoints;
  }
  if (onevision) out["vision_aspect_ratio"] = str("anyres_max_", c.anyres.max_num_patches);
  return out;
}

namespace {

// vision_feature_layer and vision_feature_select_strategy, LlavaOnevisionConfig's defaults for OneVision (the last
// layer, every patch: SigLIP's, as the published checkpoints), LlavaConfig's otherwise.
void read_feature_selection(const json& j, bool onevision, VisionConfig& v, const std::string& where) {
  const json layer = j.value("vision_feature_layer", json(onevision ? -1 : -2));
  HR_CHECK(layer.is_number_integer(), "[hf] ", where, ": vision_feature_layer ", layer.dump(),
           " must be one layer (a list of layers is not supported)");
  v.select_layer = layer.get<int>();
  const std::string strategy = j.value("vision_feature_select_strategy", onevision ? "full" : "default");
  HR_CHECK(strategy == "default" || strategy == "full", "[hf] ", where, ": vision_feature_select_strategy '", strategy,
           "' is not 'default' or 'full'");
  v.select_feature = strategy == "default" ? FeatureSelect::Patch : FeatureSelect::ClsPatch;
}

// AnyRes with spatial_unpad and image_newline: the pinpoints (LlavaNextConfig's five of 336 px where absent, or
// LlavaOnevisionConfig's 1 x 1 to 6 x 6 tiles of 384 px) and OneVision's vision_aspect_ratio (anyres_max_9).
void read_anyres(const json& j, bool onevision, LlavaConfig& c, const std::string& where) {
  std::vector<std::vector<int64_t>> raw = {{336, 672}, {672, 336}, {672, 672}, {1008, 336}, {336, 1008}};
  if (onevision) {
    raw.clear();
    for (int64_t r = 1; r <= 6; ++r)
      for (int64_t col = 1; col <= 6; ++col) raw.push_back({384 * r, 384 * col});
  }
  if (j.contains("image_grid_pinpoints") && !j.at("image_grid_pinpoints").is_null())
    raw = get<std::vector<std::vector<int64_t>>>(j, "image_grid_pinpoints", where, "");
  c.anyres.pinpoints = data::parse_pinpoints(raw, c.vision.image_size, where);
  if (!onevision) return;
  const std::string ratio =
      j.contains("vision_aspect_ratio") ? get<std::string>(j, "vision_aspect_ratio", where, "") : "anyres_max_9";
  c.anyres.max_num_patches = parse_vision_aspect_ratio(ratio, where);
  HR_CHECK(c.anyres.max_num_patches > 0, "[hf] ", where, ": vision_aspect_ratio '", ratio,
           "': LlavaOnevisionForConditionalGeneration pools by anyres_max_N (LLaVA-NeXT's plain anyres is llava_next)");
}

}  // namespace

LlavaConfig from_hf_config(const json& j, const std::string& where) {
  HR_CHECK(j.is_object(), "[hf] ", where, ": not a JSON object");
  const std::string type = j.value("model_type", "");
  HR_CHECK(type == "llava" || type == "llava_next" || type == "llava_onevision", "[hf] ", where, ": model_type '", type,
           "' is not 'llava', 'llava_next' or 'llava_onevision' (a LLaVA, LLaVA-NeXT or LLaVA-OneVision model "
           "directory, as llava-hf's, is needed)");
  const bool onevision = type == "llava_onevision";
  HR_CHECK(j.contains("text_config") && j.contains("vision_config"), "[hf] ", where,
           ": needs text_config and vision_config");
  const json& t = j.at("text_config");
  const json& vj = j.at("vision_config");
  LlavaConfig c;
  c.name = where;
  // What the JSON leaves out takes the default of transformers' text and vision configs, as from_pretrained does
  // (llava-hf's config.json writes only what differs from them).
  c.llm = llm_from_hf(t, where, "text_config.");
  // transformers 4.x ties as text_config says (LlavaForConditionalGeneration delegates to its language model), later
  // versions read the top level too: a file whose two values disagree means different models to them, refused.
  HR_CHECK(!j.contains("tie_word_embeddings") || j.at("tie_word_embeddings").is_null() ||
               j.at("tie_word_embeddings") == json(c.llm.tied_embeddings),
           "[hf] ", where, ": tie_word_embeddings ", j.value("tie_word_embeddings", json()).dump(),
           " disagrees with text_config.tie_word_embeddings ", c.llm.tied_embeddings ? "true" : "false (or absent)");
  c.vision = vision_from_hf(vj, where, "vision_config.");
  VisionConfig& v = c.vision;
  require(j, "projector_hidden_act", std::string("gelu"), where, "", "the mlp2x_gelu projector");
  HR_CHECK(!j.contains("multimodal_projector_bias") || j.at("multimodal_projector_bias") == json(true), "[hf] ", where,
           ": multimodal_projector_bias false is not supported (the projector's linears have biases)");
  c.projector = ProjectorType::Mlp2xGelu;
  read_feature_selection(j, onevision, v, where);
  c.image_token_id = j.contains("image_token_index") ? get<int64_t>(j, "image_token_index", where, "")
                                                     : get<int64_t>(j, "image_token_id", where, "");
  c.ignore_index = j.value("ignore_index", int64_t(-100));
  if (type == "llava_next" || onevision) read_anyres(j, onevision, c, where);
  try {
    c.validate(KeyNames::HuggingFace);
  } catch (const Error& e) {  // "[config] text_config.intermediate_size 0 ..." said of this file
    const std::string m = e.what();
    throw Error(str("[hf] ", where, ": ", m.rfind("[config] ", 0) == 0 ? m.substr(9) : m));
  }
  return c;
}

TokenIds token_ids_from_hf(const json& text, const std::string& where, const std::string& path) {
  HR_CHECK(text.is_object(), "[hf] ", where, ": ", path.empty() ? "the file" : path.substr(0, path.size() - 1),
           " is not a JSON object");
  TokenIds t;
  for (auto [key, id] : {std::pair{"bos_token_id", &t.bos}, {"eos_token_id", &t.eos}, {"pad_token_id", &t.pad}})
    if (text.contains(key)) *id = text.at(key).is_null() ? -1 : get<int64_t>(text, key, where, path);
  return t;
}

LlavaConfig read_hf_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  HR_CHECK(in, "[hf] ", path, ": cannot open (model.name_or_path must be a Hugging Face model directory)");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw Error(str("[hf] ", path, ": not valid JSON: ", e.what()));
  }
  return from_hf_config(j, path);
}

void write_hf_config(const std::string& dir, const LlavaConfig& c, core::DType dtype, const TokenIds& tokens) {
  const json gen = token_keys(tokens);
  for (const auto& [name, j] : {std::pair<const char*, json>{"config.json", to_hf_config(c, dtype, tokens)},
                                std::pair<const char*, json>{"generation_config.json", gen}}) {
    const std::string text = j.dump(2) + "\n";
    core::AtomicFile f(dir + "/" + name);
    f.write(text.data(), text.size());
    f.commit();
  }
}

}  // namespace hr::models
