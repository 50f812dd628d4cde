// Softmax over the last dim, and rotary position embeddings (LLaMA's rotate-half layout).
#pragma once

#include "core/ops/params.h"

namespace hr::core {

Tensor softmax_forward(const Tensor& x);
// dx = y * (dy - sum(dy * y)) from the saved output y.
Tensor softmax_backward(const Tensor& y, const Tensor& dy);

// x (batch, seq, heads, head_dim) rotated by positions (batch, seq) i32/i64 with base `theta`.
Tensor rope_forward(const Tensor& x, const Tensor& positions, float theta);
// The inverse rotation applied to dy.
Tensor rope_backward(const Tensor& dy, const Tensor& positions, float theta);

}  // namespace hr::core
