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

// RoPE's angles once a step: f32 (batch, seq, 2, head_dim / 2), each token's cosines then sines for positions (batch,
// seq) with base `theta`, the values rope_forward computes on every call (angles in double). Every layer's q and k,
// forward and backward, then rotate by it: the same results, without a sine or cosine per call.
Tensor rope_table(const Tensor& positions, int64_t head_dim, float theta);
Tensor rope_forward(const Tensor& x, const Tensor& table);
Tensor rope_backward(const Tensor& dy, const Tensor& table);

// Where a batch's tokens sit, for the layers' RoPE: positions (batch, seq) and, where kernels are fused, their table
// (rope_table), which rotate() and unrotate() then read instead of computing angles.
struct Rotary {
  Tensor positions, table;
  float theta = 10000.f;
  Tensor rotate(const Tensor& x) const;     // rope_forward
  Tensor unrotate(const Tensor& dy) const;  // rope_backward
};

}  // namespace hr::core
