// LLaVA's stage-1 start: configs and weights of a CLIP directory and a LLaMA directory joined (hf_start.h).
#include "models/hf_start.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/io/safetensors.h"
#include "core/ops/copy.h"
#include "models/hf_config.h"
#include "models/weights.h"

namespace hr::models {

namespace {

using json = nlohmann::json;

json read_json(const std::string& dir, const char* key) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  HR_CHECK(in, "[hf] ", path, ": cannot open (model.", key, " must be a Hugging Face model directory)");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw Error(str("[hf] ", path, ": not valid JSON: ", e.what()));
  }
}

bool starts_with(const std::string& s, const std::string& p) {
  return s.compare(0, p.size(), p) == 0;
}

}  // namespace

int64_t language_vocab(const std::string& language_dir) {
  const json t = read_json(language_dir, "language_model");
  const std::string type = t.value("model_type", "");
  HR_CHECK(type == "llama" || type == "qwen2" || type == "mistral", "[hf] ", language_dir, "/config.json: model_type '",
           type,
           "' is not 'llama', 'qwen2' or 'mistral' (model.language_model must be a LlamaForCausalLM, "
           "Qwen2ForCausalLM or MistralForCausalLM directory, as lmsys/vicuna-7b-v1.5 or Qwen/Qwen2-7B-Instruct)");
  HR_CHECK(t.contains("vocab_size") && t["vocab_size"].is_number_integer(), "[hf] ", language_dir,
           "/config.json: no integer vocab_size");
  return t["vocab_size"].get<int64_t>();
}

LlavaConfig stage1_config(const std::string& vision_dir, const std::string& language_dir) {
  json v = read_json(vision_dir, "vision_tower");
  const std::string vtype = v.value("model_type", "");
  if (vtype == "clip" || vtype == "siglip") {  // a whole CLIPModel or SiglipModel: its vision_config
    HR_CHECK(v.contains("vision_config") && v["vision_config"].is_object(), "[hf] ", vision_dir, "/config.json: a ",
             vtype, " model without vision_config");
    v = v["vision_config"];
    v["model_type"] = vtype + "_vision_model";
  }
  const std::string tower = v.value("model_type", "");
  HR_CHECK(tower == "clip_vision_model" || tower == "siglip_vision_model", "[hf] ", vision_dir,
           "/config.json: model_type '", vtype,
           "' is none of 'clip', 'clip_vision_model', 'siglip', 'siglip_vision_model' (model.vision_tower must be a "
           "CLIP or SigLIP directory, as openai/clip-vit-large-patch14-336 or google/siglip-so400m-patch14-384)");
  const bool siglip = tower == "siglip_vision_model";
  if (siglip) v["vision_use_head"] = false;  // its pooling head's weights stay in the directory, unread
  json t = read_json(language_dir, "language_model");
  const int64_t vocab = language_vocab(language_dir);
  t["vocab_size"] = (vocab + 2 + 63) / 64 * 64;  // "<image>" and "<pad>", padded as llava-hf's conversion does
  const json llava = {{"model_type", "llava"},
                      {"vision_config", v},
                      {"text_config", t},
                      {"image_token_index", vocab},
                      {"projector_hidden_act", "gelu"},
                      {"vision_feature_layer", -2},
                      // LLaVA-NeXT's SigLIP tower drops its last layer and keeps every patch
                      {"vision_feature_select_strategy", siglip ? "full" : "default"}};
  LlavaConfig c = from_hf_config(llava, vision_dir + " + " + language_dir);
  return c;
}

namespace {

// embed_tokens and lm_head of the joined model have more rows than the language model's ("<image>", "<pad>").
bool grown_rows(const std::string& name, const core::Tensor& t, const core::Shape& want) {
  return (name == "model.embed_tokens.weight" || name == "lm_head.weight") && t.dim() == 2 && want.size() == 2 &&
         t.size(1) == want[1] && t.size(0) < want[0];
}

// `t` with rows added up to want[0], each the mean of the existing ones (transformers' mean_resizing).
core::Tensor mean_resized(const core::Tensor& t, const core::Shape& want) {
  const int64_t rows = t.size(0), cols = t.size(1);
  std::vector<float> w = t.to_floats(), mean(std::size_t(cols), 0.f);
  std::vector<double> sum(std::size_t(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) sum[std::size_t(c)] += w[std::size_t(r * cols + c)];
  for (int64_t c = 0; c < cols; ++c) mean[std::size_t(c)] = float(sum[std::size_t(c)] / double(rows));
  for (int64_t r = rows; r < want[0]; ++r) w.insert(w.end(), mean.begin(), mean.end());
  return core::Tensor::from_floats(w, want, core::DType::F32, core::Device::host());
}

// Copies the directory's tensor `name` into `p`; returns "" when done, or what does not match.
std::string load_tensor(core::Param& p, const std::string& name, core::Tensor t) {
  HR_CHECK(core::is_float(t.dtype()), "[weights] ", name, " has dtype ", core::dtype_name(t.dtype()),
           "; expected f32, bf16 or f16");
  if (p.quantized()) return assign_param(p, t);  // a decoder layer's weight of a quantized base: quantized as it loads
  const core::Shape& want = p.data.shape();
  const bool grown = grown_rows(name, t, want);
  if (t.shape() != want && !grown) return str(core::shape_str(t.shape()), " (model wants ", core::shape_str(want), ")");
  if (grown) t = mean_resized(t, want);
  core::copy_(p.data, t);
  return "";
}

}  // namespace

int64_t load_stage1_weights(core::ParamStore& store, const std::string& vision_dir, const std::string& language_dir) {
  const core::Checkpoint vision = core::Checkpoint::open(vision_dir), language = core::Checkpoint::open(language_dir);
  std::vector<std::string> absent, bad_shape;
  int64_t loaded = 0;
  for (const auto& p : store.all()) {
    const core::Checkpoint* src = nullptr;
    std::string name;
    if (starts_with(p->name, "vision_tower.")) {
      src = &vision, name = p->name.substr(13);
    } else if (starts_with(p->name, "language_model.")) {
      src = &language, name = p->name.substr(15);
    } else {
      continue;  // the projector: freshly initialised
    }
    if (!src->contains(name)) {
      absent.push_back(str(name, " (", src == &vision ? vision_dir : language_dir, ")"));
      continue;
    }
    const std::string bad = load_tensor(*p, name, src->get(name));
    if (bad.empty())
      ++loaded;
    else
      bad_shape.push_back(str(name, " ", bad));
  }
  std::string msg;
  for (const std::string& a : absent) msg += "\n  missing: " + a;
  for (const std::string& b : bad_shape) msg += "\n  wrong shape: " + b;
  HR_CHECK(msg.empty(), "[weights] the vision tower and language model directories do not match the model:", msg);
  return loaded;
}

}  // namespace hr::models
