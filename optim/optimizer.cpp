// The Optimizer: one OptimizerState per trainable parameter, stepped with the shared update.
#include "optim/optimizer.h"

#include <cstring>

#include "core/memory/category.h"
#include "core/ops/copy.h"

namespace hr::optim {

using namespace hr::core;

bool decays(const Param& p) {
  return p.role == ParamRole::Weight || p.role == ParamRole::LoraA || p.role == ParamRole::LoraB;
}

bool embedding_table(const Param& p) {
  const std::string& n = p.name;
  for (const char* table : {"embed_tokens.weight", "position_embedding.weight", "embed_positions.weight"})
    if (n.size() >= std::strlen(table) && n.compare(n.size() - std::strlen(table), std::string::npos, table) == 0)
      return true;
  return false;
}

bool keeps_f32_moments(const Param& p) {
  return embedding_table(p) || p.numel() < kMin8bitElements;
}

OptimizerConfig moments_for(const OptimizerConfig& config, const Param& p) {
  OptimizerConfig own = config;
  if (own.kind == OptimizerKind::AdamW8bit && keeps_f32_moments(p)) own.kind = OptimizerKind::AdamW;
  return own;
}

Optimizer::Optimizer(ParamStore& params, const OptimizerConfig& cfg) : params_(params), cfg_(cfg) {
  for (const auto& p : params.all()) {
    if (!p->trainable) continue;
    Slot s{p.get(), {}, decays(*p)};
    const std::string owner = owner_of(p->name);
    if (p->data.dtype() != DType::F32) {
      MemoryScope scope(Category::MasterParams, owner);
      s.state.master = cast(p->data, DType::F32);
    }
    MemoryScope scope(Category::Optimizer, owner);
    OptimizerState moments = zero_moments(moments_for(cfg, *p), p->data.shape(), p->data.device());
    moments.master = s.state.master;
    s.state = moments;
    slots_.push_back(s);
  }
}

void Optimizer::set_lr_ratio(GroupKind kind, float ratio) {
  for (Slot& s : slots_)
    if (params_.kind_of(*s.param) == kind) s.lr_ratio = ratio;
}

void Optimizer::step(float base_lr, float grad_scale) {
  ++steps_;
  for (Slot& s : slots_) {
    if (!s.param->grad.defined()) continue;
    update(cfg_, s.param->data, s.param->grad, s.state,
           {base_lr * s.lr_ratio, s.decay ? cfg_.weight_decay : 0.f, steps_, grad_scale});
  }
}

NamedTensors Optimizer::state() const {
  NamedTensors out;
  for (const Slot& s : slots_)
    s.state.for_each([&](const char* suffix, const Tensor& t) { out.emplace_back(s.param->name + suffix, t); });
  return out;
}

void Optimizer::load_state(const Checkpoint& ckpt, int64_t steps) {
  for (auto& [name, t] : state()) {
    HR_CHECK(ckpt.contains(name), "[optimizer] checkpoint has no state '", name,
             "' (was it saved with another "
             "optimizer or another set of trainable parameters?)");
    Tensor src = ckpt.get(name);
    HR_CHECK(src.shape() == t.shape(), "[optimizer] state '", name, "' has shape ", shape_str(src.shape()),
             "; expected ", shape_str(t.shape()));
    copy_(t, src);
  }
  steps_ = steps;
}

}  // namespace hr::optim
