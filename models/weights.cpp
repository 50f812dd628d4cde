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

namespace {

std::string mismatch(const Param& p, const std::string& what) {
  return str(what, " (model wants ", wanted(p), ")");
}

bool on_meta(const Param& p) {  // a parameter the meta device holds: checked, nothing copied
  return p.data.defined() && p.data.device().type == DeviceType::Meta;
}

bool same_layout(const QuantLayout& a, const QuantLayout& b) {
  return a.rows == b.rows && a.cols == b.cols && a.format.type == b.format.type && a.format.block == b.format.block &&
         a.format.double_quant == b.format.double_quant;
}

// A quantized blob: copied into a quantized parameter of its layout, or dequantized into a float one of its shape.
std::string assign_blob(Param& p, const Tensor& t) {
  const Tensor h = t.to(Device::host()).contiguous();
  QuantLayout l;
  try {
    l = read_layout(h.data<uint8_t>(), h.numel(), p.name);
  } catch (const Error&) {
    return mismatch(p, str(shape_str(t.shape()), " u8 that is not a quantized weight"));
  }
  if (p.quantized()) {
    if (!same_layout(l, p.quant)) return mismatch(p, l.describe());
    if (!on_meta(p)) copy_(p.data, h);
    return "";
  }
  if (p.shape != Shape{l.rows, l.cols}) return mismatch(p, l.describe());
  if (!on_meta(p)) {
    MemoryScope scope(Category::IO, "load_weights");
    copy_(p.data, Tensor::from_floats(dequantize(h.data<uint8_t>(), l), p.shape, DType::F32, Device::host()));
  }
  return "";
}

// A float tensor into a quantized parameter: quantized in the parameter's format.
std::string assign_quantizing(Param& p, const Tensor& t) {
  if (t.shape() != Shape{p.quant.rows, p.quant.cols}) return mismatch(p, shape_str(t.shape()));
  if (on_meta(p)) return "";
  const std::vector<float> v = t.to_floats();
  std::vector<uint8_t> q;
  try {
    q = quantize(v.data(), p.quant.rows, p.quant.cols, p.quant.format);
  } catch (const Error& e) {
    throw Error(str("[weights] ", p.name, ": ", e.what()));
  }
  copy_(p.data, Tensor::wrap(q.data(), {p.quant.bytes}, DType::U8, Device::host(), [] {}));
  return "";
}

}  // namespace

std::string assign_param(Param& p, const Tensor& t) {
  const bool blob = t.dtype() == DType::U8 && t.dim() == 1;
  if (!blob && !is_float(t.dtype()))
    return mismatch(
        p, str(shape_str(t.shape()), " ", dtype_name(t.dtype()), ": expected f32, bf16, f16 or a quantized weight"));
  if (blob) return assign_blob(p, t);
  if (p.quantized()) return assign_quantizing(p, t);
  if (t.shape() != p.shape) return mismatch(p, shape_str(t.shape()));
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

namespace {

bool newer_layout(const Checkpoint& ckpt) {
  for (const std::string& n : ckpt.names())
    if (starts_with(n, "model.language_model.") || starts_with(n, "model.vision_tower.")) return true;
  return false;
}

std::vector<std::string> unused(const Checkpoint& ckpt, const std::set<std::string>& used) {
  std::vector<std::string> out;
  for (const std::string& n : ckpt.names())
    if (!used.count(n)) out.push_back(n);
  return out;
}

// "\n  what (n):" and the first 20 names, one a line; "" for none.
std::string name_list(const char* what, const std::vector<std::string>& v) {
  if (v.empty()) return "";
  std::string msg = str("\n  ", what, " (", v.size(), "):");
  for (std::size_t i = 0; i < v.size() && i < 20; ++i) msg += "\n    " + v[i];
  if (v.size() > 20) msg += str("\n    ... and ", v.size() - 20, " more");
  return msg;
}

}  // namespace

int64_t load_weights(ParamStore& store, const Checkpoint& ckpt, MissingWeights missing) {
  const bool newer = newer_layout(ckpt);
  std::vector<std::string> absent, bad_shape;
  std::set<std::string> used;
  int64_t loaded = 0;
  for (const auto& p : store.all()) {
    const std::string name = newer ? new_layout_name(p->name) : p->name;
    if (!ckpt.contains(name)) {
      if (is_lora(*p))
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
  std::string msg;
  if (missing == MissingWeights::Error) msg += name_list("missing", absent);
  msg += name_list("unexpected", unused(ckpt, used));
  msg += name_list("wrong shape", bad_shape);
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
  if (!mlp.empty()) alternatives += (alternatives.empty() ? "mlp\\.(" : "|mlp\\.(") + mlp + ")";
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

namespace {

bool is_pickle(const std::string& path) {
  for (const std::string x : {".bin", ".pt", ".pth"})
    if (path.size() >= x.size() && path.compare(path.size() - x.size(), x.size(), x) == 0) return true;
  return false;
}

// The llava-hf name of a tensor of LLaVA's projector file: (model.)mm_projector.0.* and .2.* are
// multi_modal_projector.linear_1.* and linear_2.*, a linear projector's mm_projector.weight is linear_1.weight.
std::string projector_name(const std::string& n) {
  std::string k = n.rfind("model.", 0) == 0 ? n.substr(6) : n;
  if (k.rfind("mm_projector.", 0) != 0) return k;
  k = k.substr(13);
  if (k.rfind("0.", 0) == 0)
    k = "linear_1." + k.substr(2);
  else if (k.rfind("2.", 0) == 0)
    k = "linear_2." + k.substr(2);
  else if (k == "weight" || k == "bias")
    k = "linear_1." + k;
  return "multi_modal_projector." + k;
}

// " what: a, b;" for the names `v`; "" for none.
std::string comma_list(const char* what, const std::vector<std::string>& v) {
  if (v.empty()) return "";
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return str(" ", what, ": ", s, ";");
}

}  // namespace

int64_t load_projector(ParamStore& store, const std::string& path) {
  HR_CHECK(!is_pickle(path), "[weights] ", path,
           " is a PyTorch pickle, which headroom does not read; convert it once with python3 -c \"import torch; "
           "from safetensors.torch import save_file; save_file(torch.load('",
           path, "', map_location='cpu'), '", path.substr(0, path.rfind('.')),
           ".safetensors')\" and name the .safetensors file");
  const core::SafetensorsFile f = core::SafetensorsFile::open(path);
  std::map<std::string, std::string> wanted;  // projector parameter name -> tensor name in the file
  std::vector<std::string> unexpected;
  for (const std::string& n : f.names()) {
    const std::string k = projector_name(n);
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
  const std::string problems =
      comma_list("missing", missing) + comma_list("unexpected", unexpected) + comma_list("mis-shaped", misshaped);
  HR_CHECK(problems.empty(), "[weights] ", path, ": not this model's projector;", problems);
  return loaded;
}

}  // namespace hr::models
