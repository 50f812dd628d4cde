// Fused attention (FlashAttention-style tiles with an online softmax): O(L) memory forward and backward.
#pragma once

#include <vector>

#include "core/ops/params.h"

namespace hr::core {

struct AttentionOut {
  Tensor out;  // (batch, q_len, q_heads, head_dim), q's dtype
  Tensor lse;  // f32 (batch, q_heads, q_len): the log-sum-exp backward recomputes probabilities from
};

// q (batch, q_len, q_heads, head_dim); k, v (batch, kv_len, kv_heads, head_dim); q_heads a multiple of
// kv_heads (grouped-query attention). scale is usually 1/sqrt(head_dim). window > 0 (Mask::Causal only): query i,
// at key position p = i + kv_len - q_len, sees only the keys p - window < j <= p (a sliding window).
AttentionOut attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Mask mask, float scale,
                               int64_t window = 0);

// Attention of new queries against a KV cache (generation; forward only, causal): q (batch, q_len, q_heads,
// head_dim); k_cache, v_cache (batch, capacity, kv_heads, head_dim); past i64 (batch) on q's device. Row b's
// query i sits at position p = past[b] + i and sees the cache entries j <= p, which must be written (with a window,
// only p - window < j <= p).
AttentionOut attention_cached(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& past,
                              float scale, int64_t window = 0);

struct AttentionGrads {
  Tensor dq, dk, dv;
};
AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const AttentionOut& saved, Mask mask, float scale, int64_t window = 0);

// Packed (padding-free) sequences, as flash-attn's varlen functions take them: q (1, total, q_heads, head_dim) and
// k, v (1, total, kv_heads, head_dim) hold `lengths` sequences back to back (total their sum), each attending only
// to itself, as attention_forward would with that sequence alone. lse is f32 (q_heads * total): sequence s's
// (1, q_heads, lengths[s]) block after those of the sequences before it. Each sequence is one launch of the
// kernels above, on views of the packed tensors, with one workspace sized for the longest.
// `queries` (one per sequence, each at most its length; empty: the lengths) keeps the queries of each sequence's
// last queries[s] positions only: q, the output and dq hold those back to back (their sum rows), lse their
// (1, q_heads, queries[s]) blocks, and each attends to its whole sequence as its query at the same position would
// (the causal mask aligned at the sequence's end). dk and dv are then the gradients of those queries' attention.
AttentionOut attention_forward_packed(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const std::vector<int64_t>& lengths, Mask mask, float scale, int64_t window = 0,
                                      const std::vector<int64_t>& queries = {});
AttentionGrads attention_backward_packed(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                         const AttentionOut& saved, const std::vector<int64_t>& lengths, Mask mask,
                                         float scale, int64_t window = 0, const std::vector<int64_t>& queries = {});

}  // namespace hr::core
