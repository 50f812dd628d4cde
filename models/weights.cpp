// Weight initialisation, loading and naming.
#include "models/weights.h"

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

}  // namespace hr::models
