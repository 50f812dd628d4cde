// The rules the CUDA kernels and their workspace sizes (sizing.cpp) share, in one place: plain C++, so that the
// meta device plans a GPU's workspaces on any machine with the numbers the kernels themselves use.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace hr::cuda {

constexpr std::size_t kWorkspaceAlignment = 256;  // bytes: every carved piece of a workspace starts aligned
constexpr std::size_t align_workspace(std::size_t bytes) {
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

// cuBLASLt's workspace per GEMM, as NVIDIA's cuBLAS guide recommends it: 32 MiB from Hopper on (sm 9.0), 4 MiB
// before. A smaller one makes the heuristic drop the algorithms that need more.
constexpr std::size_t kCublasWorkspaceBeforeHopper = std::size_t(4) << 20;
constexpr std::size_t kCublasWorkspaceHopper = std::size_t(32) << 20;
constexpr int kHopperArch = 90;  // compute capability 9.0 as major * 10 + minor
constexpr std::size_t cublas_workspace_bytes(int arch) {
  return arch >= kHopperArch ? kCublasWorkspaceHopper : kCublasWorkspaceBeforeHopper;
}

// f32 logits per chunk of the fused cross-entropy: GEMMs of about a thousand rows at a 32k vocabulary, which keep a
// GPU's tensor cores busy (the CPU's chunk is a quarter of it).
constexpr std::size_t kCrossEntropyChunkBytes = std::size_t(128) << 20;

// Column sums over the rows of a (rows, cols) array (bias gradients, norm weight gradients, Adafactor's column
// moments) in two passes and a fixed order: blocks of kColumnTile columns x kRowLanes row lanes each sum one
// stretch of rows_per_partial rows into a partial (per lane, then the lanes in order), and a second pass adds each
// column's partials in order. The stretches are cut so that about kColumnSumBlocks blocks share the first pass,
// but none takes fewer than kMinRowsPerPartial rows. The partials are doubles.
constexpr int64_t kColumnTile = 32;
constexpr int64_t kRowLanes = 8;
constexpr int64_t kColumnSumBlocks = 1024;
constexpr int64_t kMinRowsPerPartial = 64;

struct ColumnSplit {
  int64_t col_tiles = 1, partials = 1, rows_per_partial = 1;
};

constexpr ColumnSplit column_split(int64_t rows, int64_t cols) {
  ColumnSplit s;
  s.col_tiles = std::max<int64_t>(1, (cols + kColumnTile - 1) / kColumnTile);
  const int64_t by_blocks = (kColumnSumBlocks + s.col_tiles - 1) / s.col_tiles;
  const int64_t by_rows = std::max<int64_t>(1, rows / kMinRowsPerPartial);
  const int64_t wanted = std::clamp<int64_t>(by_blocks, 1, by_rows);
  s.rows_per_partial = std::max<int64_t>(1, (rows + wanted - 1) / wanted);
  s.partials = std::max<int64_t>(1, (rows + s.rows_per_partial - 1) / s.rows_per_partial);
  return s;
}

// The partials of `sums` column sums at once (2 for a norm's weight and bias gradients).
constexpr std::size_t column_sums_workspace_bytes(int64_t rows, int64_t cols, int sums) {
  const ColumnSplit s = column_split(rows, cols);
  return cols <= 0 ? 0 : align_workspace(std::size_t(s.partials * sums * cols) * sizeof(double));
}

}  // namespace hr::cuda
