// Fused attention (FlashAttention-style tiles with an online softmax): O(L) memory forward and backward.
#pragma once

#include "core/ops/params.h"

namespace hr::core {

struct AttentionOut {
  Tensor out;  // (batch, q_len, q_heads, head_dim), q's dtype
  Tensor lse;  // f32 (batch, q_heads, q_len): the log-sum-exp backward recomputes probabilities from
};

// q (batch, q_len, q_heads, head_dim); k, v (batch, kv_len, kv_heads, head_dim); q_heads a multiple of
// kv_heads (grouped-query attention). scale is usually 1/sqrt(head_dim).
AttentionOut attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Mask mask, float scale);

struct AttentionGrads {
  Tensor dq, dk, dv;
};
AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const AttentionOut& saved, Mask mask, float scale);

}  // namespace hr::core
