// Linear layers over a quantized frozen weight (core/quant.h): the GEMMs dequantize the weight a tile at a time
// into a workspace and never hold it whole, so a layer costs its quantized bytes plus one tile.
#pragma once

#include "core/ops/params.h"

namespace hr::core {

// The largest dequantized tile a quantized linear layer allocates (tests pass smaller ones to exercise tiling).
constexpr int64_t kDequantTileBytes = int64_t(16) << 20;

// out (rows, cols) <- elements [row0, row0 + rows) x [col0, col0 + cols) of the weight in `blob`.
void dequantize_into(const Tensor& blob, const QuantLayout& layout, int64_t row0, int64_t col0, const Tensor& out);
// The whole weight (rows, cols) in `dtype`.
Tensor dequantize_weight(const Tensor& blob, const QuantLayout& layout, DType dtype);

// y = x @ W^T + bias with W (out, in) quantized; y has x's dtype. Tiles of rows of W, each into its columns of y.
Tensor qlinear_forward(const Tensor& x, const Tensor& blob, const QuantLayout& layout, const Tensor& bias,
                       int64_t tile_bytes = kDequantTileBytes);
// dx = dy @ W (the weight is frozen: no dW). Tiles of columns of W, each into its columns of dx.
Tensor qlinear_backward_dx(const Tensor& dy, const Tensor& blob, const QuantLayout& layout,
                           int64_t tile_bytes = kDequantTileBytes);

}  // namespace hr::core
