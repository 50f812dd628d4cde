// Cross-entropy fused with the output projection, in row chunks: the (tokens, vocab) logits never exist whole.
#pragma once

#include "core/ops/params.h"

namespace hr::core {

// Default chunk: as many rows as fit `chunk_bytes` of f32 logits (at least one row), the back-end's size
// (Kernels::cross_entropy_chunk_bytes: larger GEMMs on a GPU).
int64_t default_chunk_rows(int64_t tokens, int64_t vocab, std::size_t chunk_bytes);

struct CrossEntropyOptions {
  int64_t ignore_index = -100;
  // loss = (sum of per-token losses over valid tokens) / normalizer. Usually the number of valid labels
  // (the data pipeline knows it on the host); a micro-batch of an accumulation may pass the global count.
  float normalizer = 1.f;
  int64_t chunk_rows = 0;  // 0: default_chunk_rows with the back-end's chunk size
  // Rows from `labelled_rows` on carry no label (ignore_index): the caller has moved its labelled rows to the
  // front. The chunks wholly past them run no product, since their loss and gradients are zero, and the chunk they
  // end in runs its products over its labelled rows rounded up to a multiple of the row grain (all its rows where
  // the grain is 0, or where the back-end's kernel for the fewer rows would need more scratch). Every chunk still
  // makes the allocations of its whole products (gemm_allocations, gemm_within), so that a step's allocations do not
  // depend on how many tokens its labels cover. The rows a product runs over must be finite. The gradients of the
  // rows no product runs over are zero; the lse of the chunks wholly past the labelled rows is not written.
  // -1: any row may carry a label.
  int64_t labelled_rows = -1;
  int64_t row_grain = 0;  // 0: the back-end's (Kernels::cross_entropy_row_grain, where 0 means whole chunks)
  // Done: the caller has checked every label (llava.forward does, on the host): no kernel checks them again.
  LabelCheck labels = LabelCheck::InKernel;
};

struct CrossEntropyOut {
  Tensor loss;  // f32 scalar
  Tensor lse;   // f32 (tokens), saved for backward
};

// hidden (tokens, d), weight (vocab, d), labels (tokens) i32/i64.
CrossEntropyOut cross_entropy_forward(const Tensor& hidden, const Tensor& weight, const Tensor& labels,
                                      const CrossEntropyOptions& options);

struct CrossEntropyGrads {
  Tensor dhidden, dweight;
};
// dloss: f32 scalar. weight_grads false for a frozen lm_head; dweight_into (+accumulate) to add into a grad.
struct CrossEntropyBackwardOptions {
  bool weight_grads = true;
  Accumulate accumulate = Accumulate::No;
  Tensor dweight_into;
};
CrossEntropyGrads cross_entropy_backward(const Tensor& dloss, const Tensor& hidden, const Tensor& weight,
                                         const Tensor& labels, const CrossEntropyOut& saved,
                                         const CrossEntropyOptions& options,
                                         const CrossEntropyBackwardOptions& backward = {});

}  // namespace hr::core
