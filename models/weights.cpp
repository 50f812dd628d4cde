// Weight initialisation, loading and naming.
#include "models/weights.h"

#include <map>
#include <random>
#include <set>

#include "core/ops/copy.h"

namespace hr::models {

using namespace hr::core;

namespace {
bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }
}  // namespace

void init_weights(ParamStore& store, uint64_t seed) {
  if (store.device().type == DeviceType::Meta) return;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 0.02f);
  for (const auto& p : store.all()) {
    std::vector<float> v(std::size_t(p->numel()));
    switch (p->role) {
      case ParamRole::NormWeight: std::fill(v.begin(), v.end(), 1.f); break;
      case ParamRole::Bias: std::fill(v.begin(), v.end(), 0.f); break;
      case ParamRole::Weight:
        for (float& e : v) e = normal(rng);
        break;
    }
    MemoryScope scope(Category::IO, "init_weights");
    copy_(p->data, Tensor::from_floats(v, p->data.shape(), DType::F32, Device::host()));
  }
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
      absent.push_back(name);
      continue;
    }
    used.insert(name);
    Tensor t = ckpt.get(name);
    if (t.shape() != p->data.shape()) {
      bad_shape.push_back(str(name, " ", shape_str(t.shape()), " (model wants ", shape_str(p->data.shape()), ")"));
      continue;
    }
    HR_CHECK(is_float(t.dtype()), "[weights] ", name, " has dtype ", dtype_name(t.dtype()), "; expected f32, bf16 or f16");
    copy_(p->data, t);
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
  for (const auto& p : store.all()) out.emplace_back(p->name, p->data);
  return out;
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
           "from safetensors.torch import save_file; save_file(torch.load('", path, "', map_location='cpu'), '",
           path.substr(0, path.rfind('.')), ".safetensors')\" and name the .safetensors file");
  const core::SafetensorsFile f = core::SafetensorsFile::open(path);
  std::map<std::string, std::string> wanted;  // projector parameter name -> tensor name in the file
  std::vector<std::string> unexpected;
  for (const std::string& n : f.names()) {
    std::string k = n.rfind("model.", 0) == 0 ? n.substr(6) : n;
    if (k.rfind("mm_projector.", 0) == 0) {
      k = k.substr(13);
      if (k.rfind("0.", 0) == 0) k = "linear_1." + k.substr(2);
      else if (k.rfind("2.", 0) == 0) k = "linear_2." + k.substr(2);
      else if (k == "weight" || k == "bias") k = "linear_1." + k;
      k = "multi_modal_projector." + k;
    }
    if (k.rfind("multi_modal_projector.", 0) == 0) wanted[k] = n;
    else unexpected.push_back(n);
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
      misshaped.push_back(str(it->second, " ", core::shape_str(t.shape()), " (", p->name, " is ", core::shape_str(p->shape), ")"));
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
  HR_CHECK(missing.empty() && unexpected.empty() && misshaped.empty(), "[weights] ", path, ": not this model's projector;",
           missing.empty() ? "" : " missing: " + list(missing) + ";", unexpected.empty() ? "" : " unexpected: " + list(unexpected) + ";",
           misshaped.empty() ? "" : " mis-shaped: " + list(misshaped) + ";");
  return loaded;
}

}  // namespace hr::models
