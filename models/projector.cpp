// Multimodal projector forward and backward.
#include "models/projector.h"

#include "core/memory/category.h"
#include "core/ops/elementwise.h"

namespace hr::models {

using namespace hr::core;

Projector::Projector(ParamStore& store, const std::string& prefix, ProjectorType type, int64_t in, int64_t out,
                     FusedKernels kernels)
    : prefix_(prefix), type_(type), fused_(kernels == FusedKernels::Auto) {
  l1_ = Linear::make(store, prefix + ".linear_1", in, out, Bias::Yes);
  if (type == ProjectorType::Mlp2xGelu) l2_ = Linear::make(store, prefix + ".linear_2", out, out, Bias::Yes);
}

Tensor Projector::forward(const Tensor& x, ProjectorSaved& s, Saving saving) const {
  MemoryScope scope(Category::Activations, prefix_);
  s = ProjectorSaved{};
  if (type_ == ProjectorType::Linear) {
    if (saving == Saving::ForBackward) s.x = x;
    return l1_.forward(x);
  }
  Linear::Activated h = l1_.forward_activated(x, UnaryOp::Gelu, fused_);
  Tensor y = l2_.forward(h.act);
  if (saving == Saving::ForBackward) s = {x, h.pre, h.act};
  return y;
}

Tensor Projector::backward(const Tensor& dy, ProjectorSaved& s, InputGrad input) const {
  MemoryScope scope(Category::Activations, prefix_);
  Tensor d1 = dy;
  if (type_ == ProjectorType::Mlp2xGelu) {
    Tensor d_act = l2_.backward(dy, s.act);
    s.act = Tensor();
    d1 = unary_backward(UnaryOp::Gelu, s.h1, d_act);
    s.h1 = Tensor();
  }
  Tensor dx = l1_.backward(d1, s.x, input);
  s = ProjectorSaved{};
  return dx;
}

}  // namespace hr::models
