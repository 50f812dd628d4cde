// Reductions: sum and mean of a whole tensor (f32 scalar), sums over leading dims (bias grads), global norm.
#pragma once

#include <vector>

#include "core/ops/params.h"

namespace hr::core {

// f32 scalar tensors of shape ().
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);
// d(sum)/dx and d(mean)/dx: dy (a scalar) broadcast to x's shape and dtype.
Tensor sum_backward(const Tensor& dy, const Tensor& x);
Tensor mean_backward(const Tensor& dy, const Tensor& x);

// out (last dim) = sum of x over all leading dims; adds into out when accumulate is Yes.
void sum_leading(const Tensor& x, const Tensor& out, Accumulate accumulate);

// sqrt(sum of squares over all tensors), f32 scalar on the first tensor's device; accumulated in f32 in a
// fixed order so the result does not depend on thread count.
Tensor global_norm(const std::vector<Tensor>& xs);
// d(norm)/d(x_i) * dy = x_i * dy / norm, for each tensor.
std::vector<Tensor> global_norm_backward(const Tensor& dy, const std::vector<Tensor>& xs, const Tensor& norm);

}  // namespace hr::core
