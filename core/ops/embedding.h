// Embedding lookup and image patchify (the patch-embedding conv as patchify + linear).
#pragma once

#include "core/ops/params.h"

namespace hr::core {

// ids (...) i32/i64 into table (vocab, dim) -> (..., dim). An id outside [0, vocab) is an error naming it.
Tensor embedding_forward(const Tensor& ids, const Tensor& table);
// Scatter-adds dy rows into dtable (vocab, dim); into `dtable_into` when defined (accumulates), else zeros.
Tensor embedding_backward(const Tensor& ids, const Tensor& dy, const Shape& table_shape, DType table_dtype,
                          const Tensor& dtable_into = {});

// images (batch, channels, height, width) -> (batch, (h/p)*(w/p), channels*p*p), each patch flattened in the
// (channel, row, col) order of a conv weight (out, channels, p, p); patches in row-major grid order.
Tensor patchify(const Tensor& images, int64_t patch);
// The inverse scatter: d(patches) -> d(images).
Tensor patchify_backward(const Tensor& dpatches, const Shape& image_shape, int64_t patch);

}  // namespace hr::core
