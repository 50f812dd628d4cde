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
NormOut layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps);
NormOut rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps);

struct NormGrads {
  Tensor dx, dweight, dbias;
};
// weight_grads false: only dx (frozen norm). dweight_into/dbias_into: accumulate there.
struct NormBackwardOptions {
  bool weight_grads = true;
  Accumulate accumulate = Accumulate::No;
  Tensor dweight_into, dbias_into;
};
NormGrads layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, Bias bias, const NormSaved& saved,
                             const NormBackwardOptions& options = {});
NormGrads rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const NormSaved& saved,
                           const NormBackwardOptions& options = {});

}  // namespace hr::core
