// Layer norm and RMS norm over the last dim, with saved statistics for backward.
#pragma once

#include "core/ops/params.h"

namespace hr::core {

struct NormSaved {
  Tensor mean;  // f32 (rows); undefined for RMS norm
  Tensor rstd;  // f32 (rows)
};

struct NormOut {
  Tensor y;
  NormSaved saved;
};

// weight (cols); bias (cols) or undefined. x (..., cols).
// residual (x's shape) or undefined: the pre-norm block's residual add fused into the norm, x += residual in place
// (x contiguous: the branch's output the stream is added onto) in the norm's own pass; y normalizes the sum. The
// same values as add_(x, residual) and then the norm.
NormOut layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                          const Tensor& residual = Tensor());
NormOut rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& residual = Tensor());

struct NormGrads {
  Tensor dx, dweight, dbias;
};
// weight_grads false: only dx (frozen norm). dweight_into/dbias_into: accumulate there.
struct NormBackwardOptions {
  bool weight_grads = true;
  Accumulate accumulate = Accumulate::No;
  Tensor dweight_into, dbias_into;
  // (x's shape) or undefined: added onto dx in the same pass, as add_(dx, add_to_dx) would (the residual stream's
  // gradient of a pre-norm block).
  Tensor add_to_dx;
};
NormGrads layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, Bias bias, const NormSaved& saved,
                             const NormBackwardOptions& options = {});
NormGrads rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const NormSaved& saved,
                           const NormBackwardOptions& options = {});

}  // namespace hr::core
