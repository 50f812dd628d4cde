// Layer norm and RMS norm: shape rules, allocation, dispatch.
#include "core/ops/norm.h"

#include "core/ops/dispatch.h"

namespace hr::core {

namespace {

const char* norm_name(NormKind k) {
  return k == NormKind::LayerNorm ? "layernorm" : "rmsnorm";
}

NormOut norm_forward(NormKind kind, const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                     const Tensor& residual) {
  const char* op = norm_name(kind);
  check_float(op, "x", x);
  check_same_device(op, x, weight);
  const int64_t cols = x.size(-1), rows = x.numel() / std::max<int64_t>(cols, 1);
  check_shape(op, "weight", weight, {cols});
  if (bias.defined()) check_shape(op, "bias", bias, {cols});
  NormArgs a;
  if (residual.defined()) {
    check_shape(op, "residual", residual, x.shape());
    check_same_device(op, x, residual);
    HR_CHECK(residual.dtype() == x.dtype(), "[", op, "] residual ", residual.describe(), " must have x's dtype ",
             dtype_name(x.dtype()));
    HR_CHECK(x.is_contiguous(), "[", op, "] x must be contiguous to take the residual add in place; got ",
             x.describe());
    a.residual = residual.contiguous().view({rows, cols});
  }
  a.kind = kind;
  a.eps = eps;
  a.x = x.contiguous().view({rows, cols});
  a.weight = weight;
  a.bias = bias;
  NormOut out;
  out.y = Tensor::empty(x.shape(), x.dtype(), x.device());
  a.y = out.y.view({rows, cols});
  if (kind == NormKind::LayerNorm) a.mean = out.saved.mean = Tensor::empty({rows}, DType::F32, x.device());
  a.rstd = out.saved.rstd = Tensor::empty({rows}, DType::F32, x.device());
  launch(op, x.device(), &Kernels::norm_forward, a);
  return out;
}

NormGrads norm_backward(NormKind kind, const Tensor& dy, const Tensor& x, const Tensor& weight, Bias bias,
                        const NormSaved& saved, const NormBackwardOptions& o) {
  const char* op = kind == NormKind::LayerNorm ? "layernorm_backward" : "rmsnorm_backward";
  check_shape(op, "dy", dy, x.shape());
  const int64_t cols = x.size(-1), rows = x.numel() / std::max<int64_t>(cols, 1);
  check_shape(op, "rstd", saved.rstd, {rows});
  NormArgs a;
  a.kind = kind;
  a.x = x.contiguous().view({rows, cols});
  a.weight = weight;
  a.mean = saved.mean;
  a.rstd = saved.rstd;
  a.dy = dy.contiguous().view({rows, cols});
  if (o.add_to_dx.defined()) {
    check_shape(op, "add_to_dx", o.add_to_dx, x.shape());
    check_same_device(op, x, o.add_to_dx);
    HR_CHECK(o.add_to_dx.dtype() == x.dtype(), "[", op, "] add_to_dx ", o.add_to_dx.describe(), " must have x's dtype ",
             dtype_name(x.dtype()));
    a.dresidual = o.add_to_dx.contiguous().view({rows, cols});
  }
  NormGrads g;
  g.dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  a.dx = g.dx.view({rows, cols});
  if (o.weight_grads) {
    g.dweight = o.dweight_into.defined() ? o.dweight_into : Tensor::empty({cols}, weight.dtype(), weight.device());
    check_shape(op, "dweight", g.dweight, {cols});
    if (bias == Bias::Yes) {
      g.dbias = o.dbias_into.defined() ? o.dbias_into : Tensor::empty({cols}, weight.dtype(), weight.device());
      check_shape(op, "dbias", g.dbias, {cols});
    }
    a.dweight = g.dweight;
    a.dbias = g.dbias;
    a.accumulate = o.dweight_into.defined() ? o.accumulate : Accumulate::No;
    a.workspace = allocate_workspace(sizing_kernels(x.device()).norm_workspace_bytes(rows, cols), x.device());
  }
  launch(op, x.device(), &Kernels::norm_backward, a);
  return g;
}

}  // namespace

NormOut layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                          const Tensor& residual) {
  return norm_forward(NormKind::LayerNorm, x, weight, bias, eps, residual);
}
NormOut rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& residual) {
  return norm_forward(NormKind::RMSNorm, x, weight, Tensor(), eps, residual);
}
NormGrads layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, Bias bias, const NormSaved& saved,
                             const NormBackwardOptions& o) {
  return norm_backward(NormKind::LayerNorm, dy, x, weight, bias, saved, o);
}
NormGrads rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const NormSaved& saved,
                           const NormBackwardOptions& o) {
  return norm_backward(NormKind::RMSNorm, dy, x, weight, Bias::No, saved, o);
}

}  // namespace hr::core
