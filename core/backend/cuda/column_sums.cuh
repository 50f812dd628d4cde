// Column sums in a fixed order, the shape sizing_rules.h's column_split gives them: the first pass's device
// function (one stretch of rows per block, summed per row lane and then the lanes in order) and the second pass's
// (each column's partials in order). No atomics: the same bits every run. Users: sum_leading (bias gradients),
// norm_backward (weight and bias gradients), Adafactor's column moments.
#pragma once

#include "core/backend/cuda/launch.cuh"
#include "core/backend/cuda/sizing_rules.h"

namespace hr::cuda {

// The first pass's launch shape: split.col_tiles * split.partials blocks of kColumnTile x kRowLanes threads.
inline dim3 column_partials_grid(const char* op, const ColumnSplit& split) {
  return checked_grid(op, split.col_tiles * split.partials);
}
inline dim3 column_partials_block() {
  return dim3(unsigned(kColumnTile), unsigned(kRowLanes));
}

// First pass: term(r, c, s) adds row r's terms of column c into s[0], ..., s[K - 1]; partial[(p * K + k) * cols + c]
// receives sum k over stretch p of the rows.
template <int K, typename Term>
__device__ void column_partials(long long rows, long long cols, ColumnSplit split, double* partial, Term term) {
  __shared__ double lanes[K][kRowLanes][kColumnTile];
  const long long tile = blockIdx.x % split.col_tiles, p = blockIdx.x / split.col_tiles;
  const long long c = tile * kColumnTile + threadIdx.x;
  const long long r0 = p * split.rows_per_partial, r1 = min(rows, r0 + split.rows_per_partial);
  double s[K];
  for (int k = 0; k < K; ++k) s[k] = 0.0;
  if (c < cols)
    for (long long r = r0 + threadIdx.y; r < r1; r += kRowLanes) term(r, c, s);
  for (int k = 0; k < K; ++k) lanes[k][threadIdx.y][threadIdx.x] = s[k];
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  for (int k = 0; k < K; ++k) {
    double t = 0.0;
    for (int l = 0; l < kRowLanes; ++l) t += lanes[k][l][threadIdx.x];
    partial[(p * K + k) * cols + c] = t;
  }
}

// Second pass: column c's sum k, its partials added in order.
template <int K>
__device__ double column_total(const double* partial, long long partials, long long cols, long long c, int k) {
  double t = 0.0;
  for (long long p = 0; p < partials; ++p) t += partial[(p * K + k) * cols + c];
  return t;
}

}  // namespace hr::cuda
