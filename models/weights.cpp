// Weight initialisation, loading and naming.
#include "models/weights.h"

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "core/ops/copy.h"

namespace hr::models {

using namespace hr::core;

namespace {
bool starts_with(const std::string& s, const std::string& p) {
  return s.rfind(p, 0) == 0;
}
}  // namespace

void init_weights(ParamStore& store, uint64_t seed) {
  if (store.device().type == DeviceType::Meta) return;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 0.02f);
  for (const auto& p : store.all()) {
    std::vector<float> v(std::size_t(p->count()));
    switch (p->role) {
      case ParamRole::NormWeight:
        std::fill(v.begin(), v.end(), 1.f);
        break;
      case ParamRole::Bias:
        std::fill(v.begin(), v.end(), 0.f);
        break;
      case ParamRole::Weight:
        for (float& e : v) e = normal(rng);
        break;
      case ParamRole::LoraA:
      case ParamRole::LoraB:
        init_lora(*p, seed);
        continue;
    }
    // A quantized weight gets the draws of the weight it stands for, quantized: the same model, quantized.
    MemoryScope scope(Category::IO, "init_weights");
    const Shape shape = p->quantized() ? Shape{p->quant.rows, p->quant.cols} : p->shape;
    const std::string bad = assign_param(*p, Tensor::from_floats(v, shape, DType::F32, Device::host()));
    HR_ASSERT(bad.empty(), "initialising ", p->name, ": ", bad);
  }
}

std::string wanted(const Param& p) {
  if (!p.quantized()) return shape_str(p.shape);
  return str(shape_str({p.quant.rows, p.quant.cols}), " as ", p.quant.format.describe());
}

std::string assign_param(Param& p, const Tensor& t) {
  auto mismatch = [&](const std::string& what) { return str(what, " (model wants ", wanted(p), ")"); };
  const bool blob = t.dtype() == DType::U8 && t.dim() == 1;
  if (!blob && !is_float(t.dtype()))
    return mismatch(
        str(shape_str(t.shape()), " ", dtype_name(t.dtype()), ": expected f32, bf16, f16 or a quantized weight"));
  const bool meta = p.data.defined() && p.data.device().type == DeviceType::Meta;
  if (blob) {
    const Tensor h = t.to(Device::host()).contiguous();
    QuantLayout l;
    try {
      l = read_layout(h.data<uint8_t>(), h.numel(), p.name);
    } catch (const Error&) {
      return mismatch(str(shape_str(t.shape()), " u8 that is not a quantized weight"));
    }
    if (p.quantized()) {
      const QuantLayout& w = p.quant;
      if (l.rows != w.rows || l.cols != w.cols || l.format.type != w.format.type || l.format.block != w.format.block ||
          l.format.double_quant != w.format.double_quant)
        return mismatch(l.describe());
      if (!meta) copy_(p.data, h);
      return "";
    }
    if (p.shape != Shape{l.rows, l.cols}) return mismatch(l.describe());
    if (!meta) {
      MemoryScope scope(Category::IO, "load_weights");
      copy_(p.data, Tensor::from_floats(dequantize(h.data<uint8_t>(), l), p.shape, DType::F32, Device::host()));
    }
    return "";
  }
  if (p.quantized()) {
    if (t.shape() != Shape{p.quant.rows, p.quant.cols}) return mismatch(shape_str(t.shape()));
    if (!meta) {
      const std::vector<float> v = t.to_floats();
      std::vector<uint8_t> q;
      try {
        q = quantize(v.data(), p.quant.rows, p.quant.cols, p.quant.format);
      } catch (const Error& e) {
        throw Error(str("[weights] ", p.name, ": ", e.what()));
      }
      copy_(p.data, Tensor::wrap(q.data(), {p.quant.bytes}, DType::U8, Device::host(), [] {}));
    }
    return "";
  }
  if (t.shape() != p.shape) return mismatch(shape_str(t.shape()));
  copy_(p.data, t);
  return "";
}

void init_lora(Param& p, uint64_t seed) {
  if (p.data.device().type == DeviceType::Meta) return;
  std::vector<float> v(std::size_t(p.numel()), 0.f);
  if (p.role == ParamRole::LoraA) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a of the name: each adapter draws its own numbers
    for (char c : p.name) h = (h ^ uint8_t(c)) * 1099511628211ull;
    std::mt19937_64 rng(seed ^ h);
    const float bound = 1.f / std::sqrt(float(p.shape.back()));
    std::uniform_real_distribution<float> uniform(-bound, bound);
    for (float& e : v) e = uniform(rng);
  }
  MemoryScope scope(Category::IO, "init_weights");
  copy_(p.data, Tensor::from_floats(v, p.data.shape(), DType::F32, Device::host()));
}

std::string new_layout_name(const std::string& n) {
  if (starts_with(n, "language_model.model.")) return "model.language_model." + n.substr(21);
  if (starts_with(n, "language_model.lm_head.")) return "lm_head." + n.substr(23);
  return "model." + n;
}

int64_t load_weights(ParamStore& store, const Checkpoint& ckpt, MissingWeights missing) {
  bool newer = false;
  for (const std::string& n : ckpt.names())
    if (starts_with(n, "model.language_model.") || starts_with(n, "model.vision_tower.")) newer = true;
  std::vector<std::string> absent, bad_shape;
  std::set<std::string> used;
  int64_t loaded = 0;
  for (const auto& p : store.all()) {
    const std::string name = newer ? new_layout_name(p->name) : p->name;
    if (!ckpt.contains(name)) {
      if (p->role == ParamRole::LoraA || p->role == ParamRole::LoraB)
        init_lora(*p, 0);
      else
        absent.push_back(name);
      continue;
    }
    used.insert(name);
    const std::string bad = assign_param(*p, ckpt.get(name));
    if (!bad.empty()) {
      bad_shape.push_back(str(name, " ", bad));
      continue;
    }
    ++loaded;
  }
  std::vector<std::string> unexpected;
  for (const std::string& n : ckpt.names())
    if (!used.count(n)) unexpected.push_back(n);
  std::string msg;
  auto list = [&](const char* what, const std::vector<std::string>& v) {
    if (v.empty()) return;
    msg += str("\n  ", what, " (", v.size(), "):");
    for (std::size_t i = 0; i < v.size() && i < 20; ++i) msg += "\n    " + v[i];
    if (v.size() > 20) msg += str("\n    ... and ", v.size() - 20, " more");
  };
  if (missing == MissingWeights::Error) list("missing", absent);
  list("unexpected", unexpected);
  list("wrong shape", bad_shape);
  HR_CHECK(msg.empty(), "[weights] checkpoint does not match the model (", newer ? "newer" : "classic",
           " llava-hf layout):", msg);
  return loaded;
}

NamedTensors named_weights(const ParamStore& store) {
  NamedTensors out;
  for (const auto& p : store.all())
    if (!is_lora(*p)) out.emplace_back(p->name, p->data);
  return out;
}

bool is_lora(const Param& p) {
  return p.role == ParamRole::LoraA || p.role == ParamRole::LoraB;
}

namespace {
const std::string kPeftPrefix = "base_model.model.";
}  // namespace

NamedTensors named_adapters(const ParamStore& store) {
  NamedTensors out;
  for (const auto& p : store.all())
    if (is_lora(*p)) out.emplace_back(kPeftPrefix + p->name, p->data);
  return out;
}

int64_t load_adapters(ParamStore& store, const Checkpoint& ckpt) {
  std::vector<std::string> absent, bad_shape, unexpected;
  std::set<std::string> used;
  int64_t loaded = 0;
  for (const auto& p : store.all()) {
    if (!is_lora(*p)) continue;
    const std::string name = kPeftPrefix + p->name;
    if (!ckpt.contains(name)) {
      absent.push_back(name);
      continue;
    }
    used.insert(name);
    Tensor t = ckpt.get(name);
    if (t.shape() != p->data.shape()) {
      bad_shape.push_back(str(name, " ", shape_str(t.shape()), " (model wants ", shape_str(p->data.shape()), ")"));
      continue;
    }
    copy_(p->data, t);
    ++loaded;
  }
  for (const std::string& n : ckpt.names())
    if (!used.count(n)) unexpected.push_back(n);
  std::string msg;
  for (const auto& [what, v] : {std::pair<const char*, const std::vector<std::string>*>{"missing", &absent},
                                {"unexpected", &unexpected},
                                {"wrong shape", &bad_shape}}) {
    if (v->empty()) continue;
    msg += str("\n  ", what, " (", v->size(), "):");
    for (std::size_t i = 0; i < v->size() && i < 20; ++i) msg += "\n    " + (*v)[i];
  }
  HR_CHECK(msg.empty(), "[weights] the LoRA adapters do not match the model's (lora.r, lora.target_modules):", msg);
  return loaded;
}

std::string adapter_config_json(const LoraSpec& lora, const std::string& base_model) {
  // A regular expression PEFT matches against whole module names: the language model's layers only (the names
  // alone, as LLaVA passes them, would also match the vision tower's q_proj, k_proj and v_proj).
  std::string attn, mlp;
  for (const std::string& t : lora.targets) {
    std::string& group = t == "gate_proj" || t == "up_proj" || t == "down_proj" ? mlp : attn;
    group += (group.empty() ? "" : "|") + t;
  }
  std::string alternatives;
  if (!attn.empty()) alternatives += "self_attn\\.(" + attn + ")";
  if (!mlp.empty()) alternatives += (alternatives.empty() ? "" : "|") + std::string("mlp\\.(") + mlp + ")";
  nlohmann::ordered_json j = {{"peft_type", "LORA"},
                              {"task_type", "CAUSAL_LM"},
                              {"base_model_name_or_path", base_model},
                              {"r", lora.r},
                              {"lora_alpha", std::round(double(lora.alpha) * 1e6) / 1e6},
                              {"lora_dropout", std::round(double(lora.dropout) * 1e6) / 1e6},
                              {"bias", "none"},
                              {"target_modules", "language_model\\.model\\.layers\\.[0-9]+\\.(" + alternatives + ")"},
                              {"fan_in_fan_out", false},
                              {"inference_mode", true},
                              {"init_lora_weights", true},
                              {"use_rslora", false},
                              {"use_dora", false},
                              {"modules_to_save", nullptr}};
  return j.dump(2) + "\n";
}

NamedTensors named_grads(ParamStore& store) {
  NamedTensors out;
  for (const auto& p : store.all())
    if (p->trainable) out.emplace_back(p->name, p->ensure_grad());
  return out;
}

int64_t load_projector(ParamStore& store, const std::string& path) {
  const auto ends = [&](const char* suffix) {
    const std::string x = suffix;
    return path.size() >= x.size() && path.compare(path.size() - x.size(), x.size(), x) == 0;
  };
  HR_CHECK(!(ends(".bin") || ends(".pt") || ends(".pth")), "[weights] ", path,
           " is a PyTorch pickle, which headroom does not read; convert it once with python3 -c \"import torch; "
           "from safetensors.torch import save_file; save_file(torch.load('",
           path, "', map_location='cpu'), '", path.substr(0, path.rfind('.')),
           ".safetensors')\" and name the .safetensors file");
  const core::SafetensorsFile f = core::SafetensorsFile::open(path);
  std::map<std::string, std::string> wanted;  // projector parameter name -> tensor name in the file
  std::vector<std::string> unexpected;
  for (const std::string& n : f.names()) {
    std::string k = n.rfind("model.", 0) == 0 ? n.substr(6) : n;
    if (k.rfind("mm_projector.", 0) == 0) {
      k = k.substr(13);
      if (k.rfind("0.", 0) == 0)
        k = "linear_1." + k.substr(2);
      else if (k.rfind("2.", 0) == 0)
        k = "linear_2." + k.substr(2);
      else if (k == "weight" || k == "bias")
        k = "linear_1." + k;
      k = "multi_modal_projector." + k;
    }
    if (k.rfind("multi_modal_projector.", 0) == 0)
      wanted[k] = n;
    else
      unexpected.push_back(n);
  }
  std::vector<std::string> missing, misshaped;
  int64_t loaded = 0;
  for (const auto& p : store.all()) {
    if (p->name.rfind("multi_modal_projector.", 0) != 0) continue;
    const auto it = wanted.find(p->name);
    if (it == wanted.end()) {
      missing.push_back(p->name);
      continue;
    }
    core::Tensor t = f.get(it->second);
    if (t.shape() != p->shape) {
      misshaped.push_back(
          str(it->second, " ", core::shape_str(t.shape()), " (", p->name, " is ", core::shape_str(p->shape), ")"));
    } else {
      core::copy_(p->data, t);
      ++loaded;
    }
    wanted.erase(it);
  }
  for (const auto& [k, n] : wanted) unexpected.push_back(n);
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  };
  HR_CHECK(missing.empty() && unexpected.empty() && misshaped.empty(), "[weights] ", path,
           ": not this model's projector;", missing.empty() ? "" : " missing: " + list(missing) + ";",
           unexpected.empty() ? "" : " unexpected: " + list(unexpected) + ";",
           misshaped.empty() ? "" : " mis-shaped: " + list(misshaped) + ";");
  return loaded;
}

}  // namespace hr::models
