// Quantized linear layers: dequantize a tile, GEMM it, write its columns of the output.
#include "core/ops/quant_linear.h"

#include <algorithm>

#include "core/ops/copy.h"
#include "core/ops/dispatch.h"
#include "core/ops/elementwise.h"
#include "core/ops/linear.h"

namespace hr::core {

namespace {

void check_blob(const char* op, const Tensor& blob, const QuantLayout& l) {
  HR_CHECK(blob.dtype() == DType::U8 && blob.dim() == 1 && blob.numel() == l.bytes && blob.is_contiguous(), "[", op,
           "] expects the ", l.bytes, "-byte blob of a ", l.describe(), " weight; got ", blob.describe());
}

// Rows (or columns) of a tile: as many as fit `tile_bytes` with `width` elements of `e` bytes each, at least one.
int64_t tile_count(int64_t total, int64_t width, std::size_t e, int64_t tile_bytes) {
  return std::clamp<int64_t>(tile_bytes / (width * int64_t(e)), 1, total);
}

Tensor dequant_tile(const Tensor& blob, const QuantLayout& l, int64_t row0, int64_t rows, int64_t col0, int64_t cols,
                    DType dtype) {
  Tensor tile;
  {
    MemoryScope scope(Category::Workspace);
    tile = Tensor::empty({rows, cols}, dtype, blob.device());
  }
  dequantize_into(blob, l, row0, col0, tile);
  return tile;
}

}  // namespace

void dequantize_into(const Tensor& blob, const QuantLayout& l, int64_t row0, int64_t col0, const Tensor& out) {
  check_blob("dequantize", blob, l);
  check_float("dequantize", "out", out);
  check_same_device("dequantize", blob, out);
  HR_CHECK(out.dim() == 2 && out.is_contiguous() && row0 >= 0 && col0 >= 0 && row0 + out.size(0) <= l.rows &&
               col0 + out.size(1) <= l.cols,
           "[dequantize] tile ", out.describe(), " at (", row0, ", ", col0, ") is not within ", l.describe());
  if (out.numel() == 0) return;
  launch("dequantize", out.device(), &Kernels::dequantize, DequantArgs{blob, l, row0, col0, out});
}

Tensor dequantize_weight(const Tensor& blob, const QuantLayout& l, DType dtype) {
  Tensor w = Tensor::empty({l.rows, l.cols}, dtype, blob.device());
  dequantize_into(blob, l, 0, 0, w);
  return w;
}

namespace {

// c3 (1, n, N) = a3 @ B, B built `step` output columns at a time: `tile(j0, width)` gives the 3-D (1, k, width)
// operand for columns [j0, j0 + width). A tile narrower than N is multiplied into a workspace, then copied into
// its columns of c3 (a K-split would round a low-precision output once per tile).
template <typename Tile>
void gemm_column_tiles(const Tensor& a3, const Tensor& c3, int64_t step, Tile&& tile) {
  const int64_t n = c3.size(1), N = c3.size(2);
  for (int64_t j0 = 0; j0 < N; j0 += step) {
    const int64_t width = std::min(step, N - j0);
    const Tensor b = tile(j0, width);
    if (width == N) {
      gemm(a3, b, c3);
      continue;
    }
    Tensor part;
    {
      MemoryScope scope(Category::Workspace);
      part = Tensor::empty({1, n, width}, c3.dtype(), c3.device());
    }
    gemm(a3, b, part);
    copy_(c3.slice(2, j0, j0 + width), part);
  }
}

// The output of a quantized linear op: `t`'s shape with its last dim `last`, viewed (1, rows, last) beside t's.
struct Out {
  Tensor full, view3, in3;
};
Out output_for(const Tensor& t, int64_t last) {
  Shape shape = t.shape();
  shape.back() = last;
  Out o;
  o.full = Tensor::empty(shape, t.dtype(), t.device());
  o.in3 = t.reshape({1, -1, t.size(-1)});
  o.view3 = o.full.view({1, o.in3.size(1), last});
  return o;
}

}  // namespace

Tensor qlinear_forward(const Tensor& x, const Tensor& blob, const QuantLayout& l, const Tensor& bias,
                       int64_t tile_bytes) {
  check_blob("qlinear", blob, l);
  check_float("qlinear", "x", x);
  check_same_device("qlinear", x, blob);
  const int64_t out = l.rows, in = l.cols;
  HR_CHECK(x.dim() >= 1 && x.size(-1) == in, "[qlinear] input ", x.describe(), " does not match the ", l.describe(),
           " weight");
  const Out y = output_for(x, out);
  // Rows of W are columns of y.
  gemm_column_tiles(y.in3, y.view3, tile_count(out, in, dtype_size(x.dtype()), tile_bytes),
                    [&](int64_t r0, int64_t rows) {
                      return dequant_tile(blob, l, r0, rows, 0, in, x.dtype()).view({1, rows, in}).transpose(1, 2);
                    });
  if (bias.defined()) {
    check_shape("qlinear", "bias", bias, {out});
    add_rows_(y.full, bias);
  }
  return y.full;
}

Tensor qlinear_backward_dx(const Tensor& dy, const Tensor& blob, const QuantLayout& l, int64_t tile_bytes) {
  check_blob("qlinear_backward", blob, l);
  check_float("qlinear_backward", "dy", dy);
  check_same_device("qlinear_backward", dy, blob);
  const int64_t out = l.rows, in = l.cols;
  HR_CHECK(dy.dim() >= 1 && dy.size(-1) == out, "[qlinear_backward] dy ", dy.describe(), " does not match the ",
           l.describe(), " weight");
  const Out dx = output_for(dy, in);
  // Columns of W are columns of dx.
  gemm_column_tiles(dx.in3, dx.view3, tile_count(in, out, dtype_size(dy.dtype()), tile_bytes),
                    [&](int64_t c0, int64_t cols) {
                      return dequant_tile(blob, l, 0, out, c0, cols, dy.dtype()).view({1, out, cols});
                    });
  return dx.full;
}

}  // namespace hr::core
