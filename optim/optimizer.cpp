// Optimizer state management and the per-parameter update calls.
#include "optim/optimizer.h"

#include "core/memory/category.h"
#include "core/ops/copy.h"
#include "core/ops/optimizer.h"

namespace hr::optim {

using namespace hr::core;

const char* optimizer_name(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::AdamW: return "adamw";
    case OptimizerKind::SGD: return "sgd";
    case OptimizerKind::Adafactor: return "adafactor";
  }
  return "?";
}

OptimizerKind parse_optimizer(const std::string& s) {
  if (s == "adamw" || s == "adamw_torch") return OptimizerKind::AdamW;
  if (s == "sgd") return OptimizerKind::SGD;
  if (s == "adafactor") return OptimizerKind::Adafactor;
  throw Error(str("[config] train.optimizer '", s, "' is not one of: adamw, sgd, adafactor"));
}

bool decays(const std::string& name) {
  auto ends = [&](const char* s) {
    const std::string x(s);
    return name.size() >= x.size() && name.compare(name.size() - x.size(), x.size(), x) == 0;
  };
  if (ends(".bias")) return false;
  return name.find("norm") == std::string::npos && name.find("layrnorm") == std::string::npos;
}

Optimizer::Optimizer(ParamStore& params, const OptimizerConfig& cfg) : params_(params), cfg_(cfg) {
  for (const auto& p : params.all()) {
    if (!p->trainable) continue;
    Slot s{p.get(), {}, {}, {}, decays(p->name)};
    const Device dev = p->data.device();
    const std::string owner = models::owner_of(p->name);
    if (p->data.dtype() != DType::F32) {
      MemoryScope scope(Category::MasterParams, owner);
      s.master = cast(p->data, DType::F32);
    }
    MemoryScope scope(Category::Optimizer, owner);
    switch (cfg.kind) {
      case OptimizerKind::AdamW:
        s.a = Tensor::zeros(p->data.shape(), DType::F32, dev);
        s.b = Tensor::zeros(p->data.shape(), DType::F32, dev);
        break;
      case OptimizerKind::SGD:
        if (cfg.momentum != 0.f) s.a = Tensor::zeros(p->data.shape(), DType::F32, dev);
        break;
      case OptimizerKind::Adafactor:
        if (p->data.dim() >= 2) {
          const int64_t cols = p->data.size(-1);
          s.a = Tensor::zeros({p->numel() / cols}, DType::F32, dev);
          s.b = Tensor::zeros({cols}, DType::F32, dev);
        } else {
          s.a = Tensor::zeros(p->data.shape(), DType::F32, dev);
        }
        break;
    }
    slots_.push_back(s);
  }
}

void Optimizer::set_lr_ratio(const std::string& prefix, float ratio) {
  for (Slot& s : slots_)
    if (s.param->name.rfind(prefix, 0) == 0) s.lr_ratio = ratio;
}

void Optimizer::step(float base_lr, float grad_scale) {
  ++steps_;
  for (Slot& s : slots_) {
    if (!s.param->grad.defined()) continue;
    const float lr = base_lr * s.lr_ratio;
    const float wd = s.decay ? cfg_.weight_decay : 0.f;
    switch (cfg_.kind) {
      case OptimizerKind::AdamW:
        adamw_update(s.param->data, s.param->grad, s.master, s.a, s.b,
                     {lr, cfg_.beta1, cfg_.beta2, cfg_.eps, wd, steps_, grad_scale});
        break;
      case OptimizerKind::SGD:
        sgd_update(s.param->data, s.param->grad, s.master, s.a, {lr, cfg_.momentum, wd, grad_scale, cfg_.nesterov});
        break;
      case OptimizerKind::Adafactor: {
        AdafactorHyper h;
        h.lr = lr;
        h.beta2 = cfg_.beta2;
        h.weight_decay = wd;
        h.grad_scale = grad_scale;
        h.step = steps_;
        adafactor_update(s.param->data, s.param->grad, s.master, s.a, s.b, h);
        break;
      }
    }
  }
}

NamedTensors Optimizer::state() const {
  const char* a_name = cfg_.kind == OptimizerKind::AdamW ? ".exp_avg"
                       : cfg_.kind == OptimizerKind::SGD ? ".momentum_buffer"
                                                         : ".exp_avg_sq_row";
  const char* b_name = cfg_.kind == OptimizerKind::AdamW ? ".exp_avg_sq" : ".exp_avg_sq_col";
  NamedTensors out;
  for (const Slot& s : slots_) {
    if (s.master.defined()) out.emplace_back(s.param->name + ".master", s.master);
    if (s.a.defined()) out.emplace_back(s.param->name + a_name, s.a);
    if (s.b.defined()) out.emplace_back(s.param->name + b_name, s.b);
  }
  return out;
}

void Optimizer::load_state(const Checkpoint& ckpt, int64_t steps) {
  for (auto& [name, t] : state()) {
    HR_CHECK(ckpt.contains(name), "[optimizer] checkpoint has no state '", name, "' (was it saved with another "
             "optimizer or another set of trainable parameters?)");
    Tensor src = ckpt.get(name);
    HR_CHECK(src.shape() == t.shape(), "[optimizer] state '", name, "' has shape ", shape_str(src.shape()),
             "; expected ", shape_str(t.shape()));
    copy_(t, src);
  }
  steps_ = steps;
}

}  // namespace hr::optim
