// Presets and validation of model configurations.
#include "models/config.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "models/anyres.h"

namespace hr::models {

bool LoraSpec::adapts(const std::string& layer) const {
  if (r <= 0) return false;
  const std::string last = layer.substr(layer.rfind('.') + 1);
  return std::find(targets.begin(), targets.end(), last) != targets.end();
}

int64_t VisionConfig::layers_used() const {
  const int64_t idx = select_layer < 0 ? layers + 1 + select_layer : select_layer;
  return idx;  // hidden_states[idx] is the output of encoder layer idx - 1
}

namespace {

// A model key as errors name it: the config's name (model.llm.hidden_size) or config.json's.
struct KeyName {
  const char* headroom;
  const char* hf;
};

// The parameters of each part of the model, in closed form, each with the keys its size comes from (what an
// error names when the sizes overflow). __int128: the products themselves must not overflow while checked.
struct Term {
  __int128 params;
  std::vector<std::pair<KeyName, int64_t>> keys;  // each key with its value
};

std::vector<Term> parameter_terms(const LlavaConfig& m) {
  const VisionConfig& v = m.vision;
  const LlmConfig& l = m.llm;
  using I = __int128;
  const I c = v.hidden, vi = v.intermediate, h = l.hidden, li = l.intermediate;
  const I kv = l.heads > 0 ? I(l.hidden / l.heads) * l.kv_heads : 0;
  const I vision_layer = 4 * (c * c + c) + 2 * c * vi + vi + c + 4 * c;  // q k v out (biases), fc1 fc2, 2 norms
  const I llm_layer = 2 * h * h + 2 * h * kv + 3 * h * li + 2 * h        // q o, k v, gate up down, 2 norms
                      + (l.qkv_bias() ? h + 2 * kv : 0);                 // Qwen2's q, k and v biases
  const I projector = c * h + h + (m.projector == ProjectorType::Mlp2xGelu ? h * h + h : 0)  //
                      + (m.image_newline() ? h : 0);
  const I patches = v.patch > 0 ? I(v.image_size / v.patch) * (v.image_size / v.patch) + (v.class_token() ? 1 : 0) : 0;
  // CLIP: class embedding, pre and post norms; SigLIP: the patch embedding's bias, the post norm
  const I stem_extra = v.class_token() ? c + 4 * c : c + 2 * c;
  const KeyName vh{"model.vision.hidden_size", "vision_config.hidden_size"},
      vl{"model.vision.num_hidden_layers", "vision_config.num_hidden_layers"},
      vin{"model.vision.intermediate_size", "vision_config.intermediate_size"},
      vs{"model.vision.image_size", "vision_config.image_size"},
      vp{"model.vision.patch_size", "vision_config.patch_size"},
      vc{"model.vision.num_channels", "vision_config.num_channels"},
      lv{"model.llm.vocab_size", "text_config.vocab_size"}, lh{"model.llm.hidden_size", "text_config.hidden_size"},
      ll{"model.llm.num_hidden_layers", "text_config.num_hidden_layers"},
      lin{"model.llm.intermediate_size", "text_config.intermediate_size"};
  return {
      // embeddings, norms
      {stem_extra + c * v.channels * v.patch * v.patch + patches * c,
       {{vh, v.hidden}, {vc, v.channels}, {vp, v.patch}, {vs, v.image_size}}},
      {vision_layer * v.layers, {{vl, v.layers}, {vh, v.hidden}, {vin, v.intermediate}}},
      {projector, {{vh, v.hidden}, {lh, l.hidden}}},
      {I(l.tied_embeddings ? 1 : 2) * l.vocab * h + h, {{lv, l.vocab}, {lh, l.hidden}}},  // tables, final norm
      {llm_layer * l.layers, {{ll, l.layers}, {lh, l.hidden}, {lin, l.intermediate}}},
  };
}

}  // namespace

int64_t LlavaConfig::parameter_count() const {
  __int128 n = 0;
  for (const Term& t : parameter_terms(*this)) n += t.params;
  HR_ASSERT(n >= 0 && n <= INT64_MAX, "parameter_count of a model validate() refuses");
  return int64_t(n);
}

std::string LlavaConfig::largest_part() const {
  const std::vector<Term> terms = parameter_terms(*this);
  const Term* largest = &terms[0];
  for (const Term& t : terms)
    if (t.params > largest->params) largest = &t;
  std::string keys;
  for (const auto& [k, value] : largest->keys) keys += str(keys.empty() ? "" : ", ", k.headroom, " ", value);
  return keys;
}

namespace {

// AnyRes's keys: pinpoints that tile the tower's size, a tower whose features lay out as its patches, a pooling count.
void check_anyres(const LlavaConfig& c, bool hf) {
  auto key = [&](const char* ours, const char* theirs) { return std::string(hf ? theirs : ours); };
  const VisionConfig& v = c.vision;
  const AnyresConfig& anyres = c.anyres;
  for (std::size_t i = 0; i < anyres.pinpoints.size(); ++i) {
    const data::Resolution p = anyres.pinpoints[i];
    HR_CHECK(p.height > 0 && p.width > 0 && p.height % v.image_size == 0 && p.width % v.image_size == 0, "[config] ",
             key("model.image_grid_pinpoints", "image_grid_pinpoints"), "[", i, "] = [", p.height, ", ", p.width,
             "] is not a positive multiple of the tower's ", v.image_size, " px on both sides");
    HR_CHECK((p.height / v.image_size) * (p.width / v.image_size) <= 64, "[config] ",
             key("model.image_grid_pinpoints", "image_grid_pinpoints"), "[", i, "] = [", p.height, ", ", p.width,
             "] makes ", (p.height / v.image_size) * (p.width / v.image_size), " tiles of ", v.image_size,
             " px; at most 64 are taken");
  }
  HR_CHECK(!anyres.on() || v.tokens_per_image() == v.grid() * v.grid(), "[config] ",
           key("model.image_grid_pinpoints", "image_grid_pinpoints"), ": AnyRes lays each crop's features out as its ",
           v.grid(), " x ", v.grid(), " patches, but the tower hands ", v.tokens_per_image(), " (",
           key("model.vision.select_feature", "vision_feature_select_strategy"),
           ": CLIP's class token must be dropped, SigLIP's patches all kept)");
  HR_CHECK(anyres.max_num_patches >= 0 && anyres.max_num_patches <= 64, "[config] ",
           key("model.vision_aspect_ratio", "vision_aspect_ratio"), ": anyres_max_", anyres.max_num_patches,
           ": N is a count of base images from 1 to 64 (0: no pooling)");
  HR_CHECK(anyres.max_num_patches == 0 || anyres.on(), "[config] ",
           key("model.vision_aspect_ratio", "vision_aspect_ratio"), ": anyres_max_", anyres.max_num_patches,
           " pools AnyRes images; set ", key("model.image_grid_pinpoints", "image_grid_pinpoints"), " too");
}

}  // namespace

void LlavaConfig::validate(KeyNames names) const {
  const bool hf = names == KeyNames::HuggingFace;
  // "[config] model.llm.hidden_size 0" or "text_config.hidden_size 0" (the caller names the file).
  auto key = [&](const char* ours, const char* theirs) { return std::string(hf ? theirs : ours); };
  auto positive = [&](int64_t value, const char* ours, const char* theirs) {
    HR_CHECK(value > 0, "[config] ", key(ours, theirs), " ", value, " must be positive");
  };
  auto positive_finite = [&](float value, const char* ours, const char* theirs) {
    HR_CHECK(std::isfinite(value) && value > 0.f, "[config] ", key(ours, theirs), " ", value,
             " must be a positive finite number");
  };
  const VisionConfig& v = vision;
  positive(v.hidden, "model.vision.hidden_size", "vision_config.hidden_size");
  positive(v.layers, "model.vision.num_hidden_layers", "vision_config.num_hidden_layers");
  positive(v.heads, "model.vision.num_attention_heads", "vision_config.num_attention_heads");
  positive(v.intermediate, "model.vision.intermediate_size", "vision_config.intermediate_size");
  positive(v.image_size, "model.vision.image_size", "vision_config.image_size");
  positive(v.patch, "model.vision.patch_size", "vision_config.patch_size");
  positive(v.channels, "model.vision.num_channels", "vision_config.num_channels");
  positive_finite(v.layer_norm_eps, "model.vision.layer_norm_eps", "vision_config.layer_norm_eps");
  HR_CHECK(v.hidden % v.heads == 0, "[config] ", key("model.vision.hidden_size", "vision_config.hidden_size"), " ",
           v.hidden, " must be a multiple of ",
           key("model.vision.num_attention_heads", "vision_config.num_attention_heads"), " ", v.heads);
  HR_CHECK(v.image_size % v.patch == 0 || v.tower == Tower::Siglip, "[config] ",
           key("model.vision.image_size", "vision_config.image_size"), " ", v.image_size, " must be a multiple of ",
           key("model.vision.patch_size", "vision_config.patch_size"), " ", v.patch,
           " (SigLIP's towers alone use the whole patches and leave the rest)");
  HR_CHECK(v.image_size >= v.patch, "[config] ", key("model.vision.image_size", "vision_config.image_size"), " ",
           v.image_size, " is smaller than one patch of ", v.patch);
  // Patches per side bounded before any count multiplies them (a 1e10-pixel side would overflow the positions).
  constexpr int64_t kMaxGrid = 4096;
  HR_CHECK(v.grid() <= kMaxGrid, "[config] ", key("model.vision.image_size", "vision_config.image_size"), " ",
           v.image_size, " over ", key("model.vision.patch_size", "vision_config.patch_size"), " ", v.patch, " is ",
           v.grid(), " patches a side; at most ", kMaxGrid);
  HR_CHECK(v.tokens_per_image() > 0, "[config] ",
           key("model.vision.select_feature", "vision_config.vision_feature_select_strategy"),
           ": a SigLIP tower with one patch has no features left after `patch` drops the first");
  HR_CHECK(v.layers_used() >= 0 && v.layers_used() <= v.layers, "[config] ",
           key("model.vision.select_layer", "vision_feature_layer"), " ", v.select_layer, " is outside [-",
           v.layers + 1, ", ", v.layers, "]");
  const LlmConfig& l = llm;
  positive(l.vocab, "model.llm.vocab_size", "text_config.vocab_size");
  positive(l.hidden, "model.llm.hidden_size", "text_config.hidden_size");
  positive(l.layers, "model.llm.num_hidden_layers", "text_config.num_hidden_layers");
  positive(l.heads, "model.llm.num_attention_heads", "text_config.num_attention_heads");
  positive(l.kv_heads, "model.llm.num_key_value_heads", "text_config.num_key_value_heads");
  positive(l.intermediate, "model.llm.intermediate_size", "text_config.intermediate_size");
  positive_finite(l.rms_norm_eps, "model.llm.rms_norm_eps", "text_config.rms_norm_eps");
  positive_finite(l.rope_theta, "model.llm.rope_theta", "text_config.rope_theta");
  HR_CHECK(l.hidden % l.heads == 0 && l.head_dim() % 2 == 0, "[config] ",
           key("model.llm.hidden_size", "text_config.hidden_size"), " ", l.hidden, " must split into ",
           key("model.llm.num_attention_heads", "text_config.num_attention_heads"), " ", l.heads,
           " heads of even size");
  HR_CHECK(l.heads % l.kv_heads == 0, "[config] ",
           key("model.llm.num_key_value_heads", "text_config.num_key_value_heads"), " ", l.kv_heads,
           " must divide num_attention_heads ", l.heads);
  HR_CHECK(l.sliding_window >= 0, "[config] ", key("model.llm.sliding_window", "text_config.sliding_window"), " ",
           l.sliding_window, " must be positive (or 0 / null: no window)");
  HR_CHECK(l.sliding_window == 0 || l.decoder != Decoder::Llama, "[config] ",
           key("model.llm.sliding_window", "text_config.sliding_window"), " ", l.sliding_window,
           ": a sliding window belongs to the mistral and qwen2 decoders, not ", decoder_name(l.decoder));
  HR_CHECK(l.max_window_layers >= 0, "[config] ", key("model.llm.max_window_layers", "text_config.max_window_layers"),
           " ", l.max_window_layers, " must not be negative");
  HR_CHECK(l.max_window_layers == 0 || l.decoder == Decoder::Qwen2, "[config] ",
           key("model.llm.max_window_layers", "text_config.max_window_layers"), " ", l.max_window_layers,
           ": the layers without a window are the qwen2 decoder's setting; ", decoder_name(l.decoder),
           "'s window, if any, is every layer's");
  check_anyres(*this, hf);
  HR_CHECK(image_token_id >= 0 && image_token_id < l.vocab, "[config] ",
           key("model.image_token_index", "image_token_index"), " ", image_token_id, " is outside the vocabulary of ",
           l.vocab);
  // Bytes are counted in int64 everywhere (tensors, allocators, the plan): 16 bytes a parameter must fit.
  constexpr __int128 kMaxParams = INT64_MAX / 16;
  const std::vector<Term> terms = parameter_terms(*this);
  __int128 total = 0;
  const Term* largest = &terms[0];
  for (const Term& t : terms) {
    total += t.params;
    if (t.params > largest->params) largest = &t;
  }
  if (total <= kMaxParams) return;
  std::string sizes;
  for (const auto& [k, value] : largest->keys)
    sizes += str(sizes.empty() ? "" : ", ", key(k.headroom, k.hf), " ", value);
  throw Error(str("[config] the model's sizes overflow 64-bit byte counts: ", sizes, " make ", double(largest->params),
                  " parameters in one part alone (at most ", double(kMaxParams), " in all)"));
}

PatchMerge parse_patch_merge(const std::string& s) {
  if (s == "spatial_unpad") return PatchMerge::SpatialUnpad;
  if (s == "flat") return PatchMerge::Flat;
  throw Error(str("[config] mm_patch_merge_type '", s, "' is not one of: spatial_unpad, flat"));
}

FusedKernels parse_fused_kernels(const std::string& s, const std::string& key) {
  if (s == "auto") return FusedKernels::Auto;
  if (s == "off") return FusedKernels::Off;
  throw Error(str("[config] ", key, " '", s, "' is not one of: auto, off"));
}

int64_t parse_vision_aspect_ratio(const std::string& s, const std::string& where) {
  const std::string prefix = "anyres_max_";
  if (s == "anyres") return 0;
  std::size_t used = 0;
  int64_t n = 0;
  try {
    if (s.rfind(prefix, 0) == 0) n = std::stoll(s.substr(prefix.size()), &used);
  } catch (const std::exception&) {
    used = 0;
  }
  HR_CHECK(used > 0 && used == s.size() - prefix.size() && n >= 1 && n <= 64, "[config] ", where,
           ": vision_aspect_ratio '", s,
           "' is not anyres_max_N (OneVision's pooling above N base images' tokens, N from 1 to 64) or anyres");
  return n;
}

LlavaConfig preset(const std::string& name) {
  LlavaConfig c;
  c.name = name;
  if (name == "llava-1.5-7b") return c;
  if (name == "llava-1.5-13b") {
    c.llm.hidden = 5120;
    c.llm.layers = 40;
    c.llm.heads = 40;
    c.llm.kv_heads = 40;
    c.llm.intermediate = 13824;
    return c;
  }
  // LLaVA-NeXT (1.6): AnyRes over LLaVA-NeXT's five pinpoints (up to 2 x 2 tiles of 336 px, or 3 x 1), spatial_unpad
  // with image_newline, as llava-hf/llava-v1.6-*-hf's config.json have it.
  const std::vector<data::Resolution> next = {{336, 672}, {672, 336}, {672, 672}, {1008, 336}, {336, 1008}};
  if (name == "llava-v1.6-vicuna-7b") {  // llava-1.5-7b's dimensions and image_newline
    c.anyres.pinpoints = next;
    return c;
  }
  if (name == "llava-v1.6-mistral-7b") {  // llava-hf/llava-v1.6-mistral-7b-hf's dimensions
    c.anyres.pinpoints = next;
    c.llm.decoder = Decoder::Mistral;
    c.llm.kv_heads = 8;
    c.llm.intermediate = 14336;
    c.llm.rope_theta = 1e6f;
    c.llm.sliding_window = 0;  // Mistral-7B-Instruct-v0.2: null
    return c;
  }
  if (name == "llava-onevision-qwen2-7b") {  // llava-hf/llava-onevision-qwen2-7b-ov-hf: anyres_max_9 over 1x1..6x6
    c.vision = {1152, 26, 16, 4304, 384, 14, 3, 1e-6f, -1, FeatureSelect::ClsPatch, Tower::Siglip};
    for (int64_t r = 1; r <= 6; ++r)
      for (int64_t col = 1; col <= 6; ++col) c.anyres.pinpoints.push_back({384 * r, 384 * col});
    c.anyres.max_num_patches = 9;
    c.llm.decoder = Decoder::Qwen2;
    c.llm.vocab = 152128;
    c.llm.hidden = 3584;
    c.llm.layers = 28;
    c.llm.heads = 28;
    c.llm.kv_heads = 4;
    c.llm.intermediate = 18944;
    c.llm.rms_norm_eps = 1e-6f;
    c.llm.rope_theta = 1e6f;
    c.image_token_id = 151646;
    return c;
  }
  if (name == "llava-onevision-qwen2-0.5b") {  // the 7B's tower with Qwen/Qwen2-0.5B (tied embeddings)
    c = preset("llava-onevision-qwen2-7b");
    c.name = name;
    c.llm.vocab = 151936;
    c.llm.hidden = 896;
    c.llm.layers = 24;
    c.llm.heads = 14;
    c.llm.kv_heads = 2;
    c.llm.intermediate = 4864;
    c.llm.tied_embeddings = true;
    return c;
  }
  if (name == "tiny") {  // the dimensions of the PyTorch golden files (scripts/make_golden.py)
    c.vision = {16, 3, 2, 32, 8, 4, 3, 1e-5f, -2, FeatureSelect::Patch};
    c.llm = {64, 32, 2, 4, 2, 64, 1e-5f, 10000.f, {}};
    c.image_token_id = 63;
    return c;
  }
  if (name == "small") {
    c.vision = {128, 4, 4, 512, 64, 8, 3, 1e-5f, -2, FeatureSelect::Patch};
    c.llm = {512, 256, 4, 8, 4, 688, 1e-5f, 10000.f, {}};
    c.image_token_id = 511;
    return c;
  }
  std::string all;
  for (const std::string& n : preset_names()) all += (all.empty() ? "" : ", ") + n;
  throw Error(str("[model] unknown preset '", name, "'; available: ", all));
}

std::vector<std::string> preset_names() {
  return {"tiny",
          "small",
          "llava-1.5-7b",
          "llava-1.5-13b",
          "llava-v1.6-vicuna-7b",
          "llava-v1.6-mistral-7b",
          "llava-onevision-qwen2-7b",
          "llava-onevision-qwen2-0.5b"};
}

const char* tower_name(Tower t) {
  return t == Tower::Siglip ? "siglip_vision_model" : "clip_vision_model";
}

Tower parse_tower(const std::string& s, const std::string& key) {
  if (s == "clip_vision_model") return Tower::Clip;
  if (s == "siglip_vision_model") return Tower::Siglip;
  throw Error(str("[config] ", key, " '", s, "' is not one of: clip_vision_model, siglip_vision_model"));
}

const char* decoder_name(Decoder d) {
  switch (d) {
    case Decoder::Qwen2:
      return "qwen2";
    case Decoder::Mistral:
      return "mistral";
    default:
      return "llama";
  }
}

Decoder parse_decoder(const std::string& s, const std::string& key) {
  for (Decoder d : {Decoder::Llama, Decoder::Qwen2, Decoder::Mistral})
    if (s == decoder_name(d)) return d;
  throw Error(str("[config] ", key, " '", s, "' is not one of: llama, qwen2, mistral"));
}

const char* projector_name(ProjectorType t) {
  return t == ProjectorType::Linear ? "linear" : "mlp2x_gelu";
}

ProjectorType parse_projector(const std::string& s) {
  if (s == "linear") return ProjectorType::Linear;
  if (s == "mlp2x_gelu") return ProjectorType::Mlp2xGelu;
  throw Error(str("[config] model.projector '", s, "' is not one of: linear, mlp2x_gelu"));
}

FeatureSelect parse_feature_select(const std::string& s) {
  if (s == "patch") return FeatureSelect::Patch;
  if (s == "cls_patch") return FeatureSelect::ClsPatch;
  throw Error(str("[config] model.vision.select_feature '", s, "' is not one of: patch, cls_patch"));
}

data::InputSpec input_spec(const LlavaConfig& c) {
  data::InputSpec s;
  s.vocab = c.llm.vocab;
  s.image_size = c.vision.image_size;
  s.tokens_per_image = c.vision.tokens_per_image();
  s.image_token_id = c.image_token_id;
  s.ignore_index = c.ignore_index;
  if (c.anyres.on()) {
    s.pinpoints = c.anyres.pinpoints;
    s.anyres_tokens = [a = c.anyres, size = c.vision.image_size, grid = c.vision.grid()](data::Resolution image) {
      return anyres_tokens(image, a, size, grid);
    };
  }
  return s;
}

}  // namespace hr::models
