// Embedding lookup and image patchify (the patch-embedding conv as patchify + linear).
#pragma once

#include <vector>

#include "core/ops/params.h"

namespace hr::core {

// ids (...) i32/i64 into table (vocab, dim) -> (..., dim). An id outside [0, vocab) is an error naming it.
Tensor embedding_forward(const Tensor& ids, const Tensor& table);
// Scatter-adds dy rows into dtable (vocab, dim); into `dtable_into` when defined (accumulates), else zeros.
Tensor embedding_backward(const Tensor& ids, const Tensor& dy, const Shape& table_shape, DType table_dtype,
                          const Tensor& dtable_into = {});

// A linear mix of rows (MixArgs in params.h): src (rows, dim), extra (dim) or undefined, begin (tokens + 1) and row
// (entries) i64, weight (entries) f32, all on src's device -> (tokens, dim). Its backward is the same op with the
// transposed mix (transpose_mix) over dy: rows (rows + 1, dim), the last one extra's gradient.
Tensor mix_rows(const Tensor& src, const Tensor& extra, const Tensor& begin, const Tensor& row, const Tensor& weight);
struct HostMix {
  std::vector<int64_t> begin{0}, row;
  std::vector<float> weight;
};
// The transposed mix of `tokens` outputs over `rows` source rows: for each source row and then the extra (as row
// `rows`), its (token, weight) entries in token order; the extra's entries read row -1's.
HostMix transpose_mix(const std::vector<int64_t>& begin, const std::vector<int64_t>& row,
                      const std::vector<float>& weight, int64_t rows);

// images (batch, channels, height, width) -> (batch, (h/p)*(w/p), channels*p*p), each patch flattened in the
// (channel, row, col) order of a conv weight (out, channels, p, p); patches in row-major grid order.
Tensor patchify(const Tensor& images, int64_t patch);
// The inverse scatter: d(patches) -> d(images).
Tensor patchify_backward(const Tensor& dpatches, const Shape& image_shape, int64_t patch);

}  // namespace hr::core
