// Linear and norm layers.
#include "models/layers.h"

#include "core/ops/linear.h"

namespace hr::models {

using namespace hr::core;

Linear Linear::make(ParamStore& store, const std::string& prefix, int64_t in, int64_t out, bool bias) {
  Linear l;
  l.weight = &store.add(prefix + ".weight", {out, in});
  if (bias) l.bias = &store.add(prefix + ".bias", {out}, ParamRole::Bias);
  return l;
}

Tensor Linear::forward(const Tensor& x) const { return linear_forward(x, w2d(), bias ? bias->data : Tensor()); }

Tensor Linear::backward(const Tensor& dy, const Tensor& x, bool need_dx) const {
  LinearBackwardOptions o;
  o.need_dx = need_dx;
  o.weight_grads = weight->trainable;
  if (o.weight_grads) {
    o.accumulate = Accumulate::Yes;
    o.dw_into = weight->ensure_grad().view({out(), in()});
    if (bias) o.dbias_into = bias->ensure_grad();
  }
  if (!o.need_dx && !o.weight_grads) return {};
  return linear_backward(dy, x, w2d(), bias != nullptr, o).dx;
}

LayerNorm LayerNorm::make(ParamStore& store, const std::string& prefix, int64_t dim, float eps) {
  LayerNorm n;
  n.weight = &store.add(prefix + ".weight", {dim}, ParamRole::NormWeight);
  n.bias = &store.add(prefix + ".bias", {dim}, ParamRole::Bias);
  n.eps = eps;
  return n;
}

NormOut LayerNorm::forward(const Tensor& x) const { return layernorm_forward(x, weight->data, bias->data, eps); }

Tensor LayerNorm::backward(const Tensor& dy, const Tensor& x, const NormSaved& saved) const {
  NormBackwardOptions o;
  o.weight_grads = weight->trainable;
  if (o.weight_grads) {
    o.accumulate = Accumulate::Yes;
    o.dweight_into = weight->ensure_grad();
    o.dbias_into = bias->ensure_grad();
  }
  return layernorm_backward(dy, x, weight->data, true, saved, o).dx;
}

RMSNorm RMSNorm::make(ParamStore& store, const std::string& prefix, int64_t dim, float eps) {
  RMSNorm n;
  n.weight = &store.add(prefix + ".weight", {dim}, ParamRole::NormWeight);
  n.eps = eps;
  return n;
}

NormOut RMSNorm::forward(const Tensor& x) const { return rmsnorm_forward(x, weight->data, eps); }

Tensor RMSNorm::backward(const Tensor& dy, const Tensor& x, const NormSaved& saved) const {
  NormBackwardOptions o;
  o.weight_grads = weight->trainable;
  if (o.weight_grads) {
    o.accumulate = Accumulate::Yes;
    o.dweight_into = weight->ensure_grad();
  }
  return rmsnorm_backward(dy, x, weight->data, saved, o).dx;
}

}  // namespace hr::models
