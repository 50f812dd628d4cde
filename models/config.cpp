// Presets and validation of model configurations.
#include "models/config.h"

#include <algorithm>

#include "core/check.h"

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

void LlavaConfig::validate() const {
  const VisionConfig& v = vision;
  HR_CHECK(v.hidden > 0 && v.heads > 0 && v.hidden % v.heads == 0, "[config] model.vision.hidden_size ", v.hidden,
           " must be a positive multiple of model.vision.num_attention_heads ", v.heads);
  HR_CHECK(v.patch > 0 && v.image_size % v.patch == 0, "[config] model.vision.image_size ", v.image_size,
           " must be a multiple of model.vision.patch_size ", v.patch);
  HR_CHECK(v.layers_used() >= 0 && v.layers_used() <= v.layers, "[config] model.vision.select_layer ", v.select_layer,
           " is outside [-", v.layers + 1, ", ", v.layers, "]");
  const LlmConfig& l = llm;
  HR_CHECK(l.hidden > 0 && l.heads > 0 && l.hidden % l.heads == 0 && l.head_dim() % 2 == 0,
           "[config] model.llm.hidden_size ", l.hidden, " must split into num_attention_heads ", l.heads,
           " heads of even size");
  HR_CHECK(l.kv_heads > 0 && l.heads % l.kv_heads == 0, "[config] model.llm.num_key_value_heads ", l.kv_heads,
           " must divide num_attention_heads ", l.heads);
  HR_CHECK(image_token_id >= 0 && image_token_id < l.vocab, "[config] model.image_token_id ", image_token_id,
           " is outside the vocabulary of ", l.vocab);
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
  return {"tiny", "small", "llava-1.5-7b", "llava-1.5-13b"};
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
  return {c.llm.vocab, c.vision.image_size, c.vision.tokens_per_image(), c.image_token_id, c.ignore_index};
}

}  // namespace hr::models
