// Linear layers and batched matrix products, both on one GEMM kernel (f32/bf16/f16 inputs, f32 accumulation).
#pragma once

#include "core/ops/params.h"

namespace hr::core {

// c = alpha * a @ b + beta * c for 3-D views a (batch, m, k), b (batch, k, n) and contiguous c (batch, m, n).
void gemm(const Tensor& a, const Tensor& b, const Tensor& c, float alpha = 1.f, float beta = 0.f);
// The allocations gemm(a, b, c, alpha, beta) makes (its workspace and scratchpad), without the product: a loop that
// skips a product whose result it knows keeps the allocator's requests those of the loop that runs it, so that a
// step's requests, which the planner records, do not depend on the data.
void gemm_allocations(const Tensor& a, const Tensor& b, const Tensor& c, float alpha = 1.f, float beta = 0.f);

// A product's three operands.
struct GemmOperands {
  Tensor a, b, c;
};
// gemm over `part`, a part of the product `whole` (views of fewer rows of its a and c, or of a shorter inner
// dimension of its a and b), making the allocations gemm(whole) would make: a loop that runs only the rows whose
// result it needs keeps the allocator's requests those of the loop that runs them all. The part must fit the
// whole's allocations (gemm_fits_within); the whole for the part runs gemm(whole).
void gemm_within(const GemmOperands& part, const GemmOperands& whole, float alpha = 1.f, float beta = 0.f);
// Whether the part's kernel needs no more workspace and scratchpad than the whole's, run with the same alpha and
// beta (a back-end may pick another kernel for another shape).
bool gemm_fits_within(const GemmOperands& part, const GemmOperands& whole, float alpha = 1.f, float beta = 0.f);

// y = x @ w^T + bias. x (..., in), w (out, in), bias (out) or undefined. y has x's dtype.
Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias);

struct LinearGrads {
  Tensor dx, dw, dbias;
};
// Gradients of linear_forward. `need_dx` false skips dx (first layer, frozen input).
// dw/dbias are computed when `dw_into` / `dbias_into` are defined and then accumulate into them when
// `accumulate` is Yes (gradient accumulation without a temporary); or freshly allocated when `weight_grads`.
struct LinearBackwardOptions {
  bool need_dx = true;
  bool weight_grads = true;  // false for a frozen layer: only dx flows
  Accumulate accumulate = Accumulate::No;
  Tensor dw_into, dbias_into;
};
LinearGrads linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Bias bias,
                            const LinearBackwardOptions& options = {});

// c = a @ b over leading batch dims: a (..., m, k), b (..., k, n) with equal batch dims.
Tensor matmul_forward(const Tensor& a, const Tensor& b);
struct MatmulGrads {
  Tensor da, db;
};
MatmulGrads matmul_backward(const Tensor& dc, const Tensor& a, const Tensor& b);

}  // namespace hr::core
