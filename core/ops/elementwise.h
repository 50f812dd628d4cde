// Element-wise ops: add/sub/mul/scale, the activations (gelu erf/tanh, quick_gelu, silu) and swiglu.
#pragma once

#include "core/ops/params.h"

namespace hr::core {

// out = alpha * x + beta * y. y has x's shape or repeats over x's leading dims (a bias row).
Tensor axpby(float alpha, const Tensor& x, float beta, const Tensor& y);
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& x, float s);
// In place: x += alpha * y (y may repeat over x's leading dims). Used for residuals, biases, grad accumulation.
void add_(const Tensor& x, const Tensor& y, float alpha = 1.f);
inline void add_rows_(const Tensor& x, const Tensor& row) {
  add_(x, row);
}
struct AddGrads {
  Tensor da, db;
};
// Gradients of axpby(alpha, a, beta, b): alpha * dy and beta * dy, the latter summed over the leading dims
// b was repeated over. add is (1, 1), sub (1, -1).
AddGrads axpby_backward(const Tensor& dy, float alpha, float beta, const Tensor& b);
inline Tensor scale_backward(const Tensor& dy, float s) {
  return scale(dy, s);
}

// out = a * b; b has a's shape or repeats over a's leading dims.
Tensor mul(const Tensor& a, const Tensor& b);
struct MulGrads {
  Tensor da, db;
};
// db is reduced over the repeated dims when b was broadcast.
MulGrads mul_backward(const Tensor& dy, const Tensor& a, const Tensor& b);

// Dropout with probability p: x * keep / (1 - p), keep drawn from (key, element) (core/ops/dropout_mask.h).
// Its backward is the same call on the gradient with the same key.
Tensor dropout(const Tensor& x, float p, uint64_t key);

// bias (x's last dim) or undefined: the bias add of the linear layer before the activation, fused into its pass:
// x += bias over x's rows in place (x contiguous: the GEMM's output, which the backward reads as the
// pre-activation), then y = op(x). The same values as add_rows_(x, bias) and then the activation.
Tensor unary_forward(UnaryOp op, const Tensor& x, const Tensor& bias = Tensor());
Tensor unary_backward(UnaryOp op, const Tensor& x, const Tensor& dy);
inline Tensor gelu(const Tensor& x) {
  return unary_forward(UnaryOp::Gelu, x);
}
inline Tensor quick_gelu(const Tensor& x) {
  return unary_forward(UnaryOp::QuickGelu, x);
}
const char* unary_name(UnaryOp op);

// y = silu(gate) * up.
Tensor swiglu_forward(const Tensor& gate, const Tensor& up);
struct SwigluGrads {
  Tensor dgate, dup;
};
SwigluGrads swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy);

}  // namespace hr::core
