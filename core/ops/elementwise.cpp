// Element-wise ops: shape rules, allocation, dispatch.
#include "core/ops/elementwise.h"

#include "core/ops/copy.h"
#include "core/ops/dispatch.h"
#include "core/ops/reduce.h"

namespace hr::core {

namespace {

// Every kernel reads all of an op's tensors as the first one's dtype.
void check_same_dtype(const char* op, const Tensor& x, const Tensor& y) {
  HR_CHECK(x.dtype() == y.dtype(), "[", op, "] dtypes differ: ", x.describe(), " and ", y.describe());
}

void check_repeat(const char* op, const Tensor& x, const Tensor& y) {
  check_same_device(op, x, y);
  check_same_dtype(op, x, y);
  HR_CHECK(x.is_contiguous() && y.is_contiguous(), "[", op, "] expects contiguous inputs; got ", x.describe(), " and ",
           y.describe());
  bool suffix = y.dim() <= x.dim();
  for (int i = 1; suffix && i <= y.dim(); ++i) suffix = y.size(-i) == x.size(-i);
  HR_CHECK(suffix, "[", op, "] shape ", shape_str(y.shape()), " must equal or repeat into ", shape_str(x.shape()));
}

}  // namespace

const char* unary_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::Gelu:
      return "gelu";
    case UnaryOp::GeluTanh:
      return "gelu_tanh";
    case UnaryOp::QuickGelu:
      return "quick_gelu";
    case UnaryOp::Silu:
      return "silu";
  }
  return "?";
}

Tensor axpby(float alpha, const Tensor& x, float beta, const Tensor& y) {
  check_repeat("axpby", x, y);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  launch("axpby", x.device(), &Kernels::axpby, out, alpha, x, beta, y);
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) {
  return axpby(1.f, a, 1.f, b);
}
Tensor sub(const Tensor& a, const Tensor& b) {
  return axpby(1.f, a, -1.f, b);
}

Tensor scale(const Tensor& x, float s) {
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor xc = x.contiguous();
  launch("scale", x.device(), &Kernels::axpby, out, s, xc, 0.f, xc);
  return out;
}

void add_(const Tensor& x, const Tensor& y, float alpha) {
  check_repeat("add_", x, y);
  launch("add_", x.device(), &Kernels::axpby, x, 1.f, x, alpha, y);
}

AddGrads axpby_backward(const Tensor& dy, float alpha, float beta, const Tensor& b) {
  AddGrads g;
  g.da = scale(dy, alpha);
  if (b.numel() == dy.numel()) {
    g.db = scale(dy, beta);
  } else {
    Tensor db32 = Tensor::empty({b.numel()}, DType::F32, b.device());
    sum_leading(dy.contiguous().view({-1, b.numel()}), db32, Accumulate::No);
    g.db = Tensor::empty(b.shape(), b.dtype(), b.device());
    Tensor s = scale(db32, beta);
    copy_(g.db, s.view(b.shape()));
  }
  return g;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  check_repeat("mul", a, b);
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  launch("mul", a.device(), &Kernels::mul, out, a, b);
  return out;
}

Tensor dropout(const Tensor& x, float p, uint64_t key) {
  HR_CHECK(p >= 0.f && p < 1.f, "[dropout] probability ", p, " is not in [0, 1)");
  HR_CHECK(x.is_contiguous(), "[dropout] needs a contiguous input, got ", x.describe());
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  launch("dropout", x.device(), &Kernels::dropout, out, x, p, key);
  return out;
}

MulGrads mul_backward(const Tensor& dy, const Tensor& a, const Tensor& b) {
  MulGrads g;
  g.da = mul(dy, b);
  if (b.numel() == a.numel()) {
    g.db = mul(dy, a);
  } else {
    Tensor prod = mul(dy, a);
    g.db = Tensor::empty(b.shape(), b.dtype(), b.device());
    sum_leading(prod.view({-1, b.numel()}), g.db.view({b.numel()}), Accumulate::No);
  }
  return g;
}

Tensor unary_forward(UnaryOp op, const Tensor& x, const Tensor& bias) {
  const char* name = unary_name(op);
  check_float(name, "x", x);
  if (bias.defined()) {
    HR_CHECK(x.dim() >= 1, "[", name, "] a bias needs x with a last dim; got ", x.describe());
    check_shape(name, "bias", bias, {x.size(-1)});
    check_same_device(name, x, bias);
    check_same_dtype(name, x, bias);
    HR_CHECK(x.is_contiguous(), "[", name, "] x must be contiguous to take the bias add in place; got ", x.describe());
  }
  Tensor xc = x.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  launch(name, x.device(), &Kernels::unary_forward, op, xc, bias.defined() ? bias.contiguous() : Tensor(), y);
  return y;
}

Tensor unary_backward(UnaryOp op, const Tensor& x, const Tensor& dy) {
  check_shape(unary_name(op), "dy", dy, x.shape());
  check_same_dtype(unary_name(op), x, dy);
  Tensor xc = x.contiguous(), dyc = dy.contiguous();
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  launch(unary_name(op), x.device(), &Kernels::unary_backward, op, xc, dyc, dx);
  return dx;
}

Tensor swiglu_forward(const Tensor& gate, const Tensor& up) {
  check_float("swiglu", "gate", gate);
  check_shape("swiglu", "up", up, gate.shape());
  check_same_device("swiglu", gate, up);
  check_same_dtype("swiglu", gate, up);
  Tensor g = gate.contiguous(), u = up.contiguous();
  Tensor y = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
  launch("swiglu", gate.device(), &Kernels::swiglu_forward, g, u, y);
  return y;
}

SwigluGrads swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy) {
  check_shape("swiglu_backward", "dy", dy, gate.shape());
  check_same_dtype("swiglu_backward", gate, up);
  check_same_dtype("swiglu_backward", gate, dy);
  Tensor g = gate.contiguous(), u = up.contiguous(), d = dy.contiguous();
  SwigluGrads out{Tensor::empty(gate.shape(), gate.dtype(), gate.device()),
                  Tensor::empty(up.shape(), up.dtype(), up.device())};
  launch("swiglu_backward", gate.device(), &Kernels::swiglu_backward, g, u, d, out.dgate, out.dup);
  return out;
}

}  // namespace hr::core
