// Optimizer states: allocation, naming, views, and the update shared by the Optimizer and ZeRO.
#include "optim/state.h"

#include "core/check.h"
#include "core/memory/category.h"
#include "core/ops/optimizer.h"

namespace hr::optim {

using namespace hr::core;

OptimizerKind parse_optimizer(const std::string& s) {
  if (s == "adamw" || s == "adamw_torch") return OptimizerKind::AdamW;
  if (s == "sgd") return OptimizerKind::SGD;
  if (s == "adafactor") return OptimizerKind::Adafactor;
  if (s == "adamw_8bit" || s == "adamw_bnb_8bit") return OptimizerKind::AdamW8bit;
  throw Error(str("[config] train.optimizer '", s, "' is not one of: adamw, sgd, adafactor, adamw_8bit"));
}

const char* optimizer_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::AdamW:
      return "adamw";
    case OptimizerKind::SGD:
      return "sgd";
    case OptimizerKind::Adafactor:
      return "adafactor";
    case OptimizerKind::AdamW8bit:
      return "adamw_8bit";
  }
  return "?";
}

OptimizerState OptimizerState::slice(int64_t begin, int64_t end) const {
  auto part = [&](const Tensor& t) { return t.defined() ? t.slice(0, begin, end) : Tensor(); };
  OptimizerState s;
  if (state1.defined()) {
    HR_CHECK(begin % kAdam8bitBlock == 0, "[optimizer] 8-bit states cannot be viewed from element ", begin,
             ": their blocks of ", kAdam8bitBlock, " start at the run's first element");
    const int64_t b0 = begin / kAdam8bitBlock, b1 = adam8bit_blocks(end);
    s.state1 = part(state1), s.state2 = part(state2);
    s.absmax1 = absmax1.slice(0, b0, b1), s.absmax2 = absmax2.slice(0, b0, b1);
  }
  s.master = part(master);
  s.exp_avg = part(exp_avg);
  s.exp_avg_sq = part(exp_avg_sq);
  s.momentum_buffer = part(momentum_buffer);
  s.exp_avg_sq_row = part(exp_avg_sq_row);
  s.exp_avg_sq_col = part(exp_avg_sq_col);
  return s;
}

void OptimizerState::for_each(const std::function<void(const char*, const Tensor&)>& f) const {
  const std::pair<const char*, const Tensor*> all[] = {
      {".master", &master},
      {".exp_avg", &exp_avg},
      {".momentum_buffer", &momentum_buffer},
      {".exp_avg_sq_row", &exp_avg_sq_row},
      {".exp_avg_sq", &exp_avg_sq},
      {".exp_avg_sq_col", &exp_avg_sq_col},
      {".state1", &state1},
      {".absmax1", &absmax1},
      {".state2", &state2},
      {".absmax2", &absmax2},
  };
  for (const auto& [suffix, t] : all)
    if (t->defined()) f(suffix, *t);
}

OptimizerState zero_moments(const OptimizerConfig& c, const Shape& shape, Device device) {
  MemoryScope scope(Category::Optimizer);
  OptimizerState s;
  switch (c.kind) {
    case OptimizerKind::AdamW8bit: {
      const int64_t n = shape_numel(shape), blocks = adam8bit_blocks(n);
      s.state1 = Tensor::zeros({n}, DType::U8, device);
      s.absmax1 = Tensor::zeros({blocks}, DType::F32, device);
      s.state2 = Tensor::zeros({n}, DType::U8, device);
      s.absmax2 = Tensor::zeros({blocks}, DType::F32, device);
      break;
    }
    case OptimizerKind::AdamW:
      s.exp_avg = Tensor::zeros(shape, DType::F32, device);
      s.exp_avg_sq = Tensor::zeros(shape, DType::F32, device);
      break;
    case OptimizerKind::SGD:
      if (c.momentum != 0.f) s.momentum_buffer = Tensor::zeros(shape, DType::F32, device);
      break;
    case OptimizerKind::Adafactor:
      if (shape.size() >= 2) {
        const int64_t cols = shape.back();
        s.exp_avg_sq_row = Tensor::zeros({shape_numel(shape) / cols}, DType::F32, device);
        s.exp_avg_sq_col = Tensor::zeros({cols}, DType::F32, device);
      } else {
        s.exp_avg_sq_row = Tensor::zeros(shape, DType::F32, device);
      }
      break;
  }
  return s;
}

void update(const OptimizerConfig& c, const Tensor& param, const Tensor& grad, const OptimizerState& s,
            const StepArgs& a) {
  switch (c.kind) {
    case OptimizerKind::AdamW8bit:
      if (s.state1.defined()) {
        adamw8bit_update(param, grad, s.master, s.state1, s.absmax1, s.state2, s.absmax2,
                         {a.lr, c.beta1, c.beta2, c.eps, a.weight_decay, a.step, a.grad_scale});
        return;
      }
      [[fallthrough]];
    case OptimizerKind::AdamW:
      adamw_update(param, grad, s.master, s.exp_avg, s.exp_avg_sq,
                   {a.lr, c.beta1, c.beta2, c.eps, a.weight_decay, a.step, a.grad_scale});
      return;
    case OptimizerKind::SGD:
      sgd_update(param, grad, s.master, s.momentum_buffer,
                 {a.lr, c.momentum, a.weight_decay, a.grad_scale, c.nesterov});
      return;
    case OptimizerKind::Adafactor: {
      AdafactorHyper h;
      h.lr = a.lr;
      h.beta2 = c.beta2;
      h.weight_decay = a.weight_decay;
      h.grad_scale = a.grad_scale;
      h.step = a.step;
      adafactor_update(param, grad, s.master, s.exp_avg_sq_row, s.exp_avg_sq_col, h);
      return;
    }
  }
}

}  // namespace hr::optim
