// The CPU attention's f32 tile products 8 floats wide (attention_f32x8.h).
#include "core/backend/cpu/attention_f32x8.h"

#include <algorithm>
#include <cmath>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "core/backend/cpu/transpose8.h"

namespace hr::cpu::f32x8_tiles {
namespace {

#if defined(__AVX2__) && defined(__FMA__)
// f32_tiles::dot's twin 8 floats wide: register blocks of up to 6 rows x 16 columns (12 accumulators, two B vectors
// and a broadcast in the 16 ymm registers), B read in place and no packing.
inline __m256i lane_mask(int64_t left) {  // lanes [0, left) on
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(std::clamp<int64_t>(left, 0, 8))),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Rows [0, R) and the columns [n0, n0 + 8 V) of C. kARow / kACol, where not 0, are A's strides known when compiling
// (the attention's A is row-major, a_col = 1, or a transpose, a_row = 1: the broadcasts' addresses then cost no
// registers or multiplies). kFull: all the columns lie below n, so B and C need no masks; else only the last vector
// crosses n (the callers give V = 2 only where n - n0 > 8) and takes the one mask (a mask per vector, held across the
// k loop, would be a 17th register with 6 rows).
template <int R, int V, bool kFull, int kARow, int kACol>
void block(int64_t n, int64_t k, const float* a, int64_t a_row_arg, int64_t a_col_arg, const float* b, int64_t ldb,
           float* c, int64_t ldc, int64_t n0, float alpha, bool accumulate) {
  constexpr int kLast = V - 1;
  const int64_t a_row = kARow ? kARow : a_row_arg, a_col = kACol ? kACol : a_col_arg;
  const __m256i mask = kFull ? _mm256_set1_epi32(-1) : lane_mask(n - n0 - 8 * kLast);
  const auto masked = [](int v) { return !kFull && v == kLast; };
  __m256 acc[R][V];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) acc[r][v] = _mm256_setzero_ps();
  for (int64_t p = 0; p < k; ++p) {
    const float* row = b + p * ldb + n0;
    __m256 bv[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v)
      bv[v] = masked(v) ? _mm256_maskload_ps(row + 8 * v, mask) : _mm256_loadu_ps(row + 8 * v);
    const float* ap = a + p * a_col;
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_broadcast_ss(ap + r * a_row);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[r][v] = _mm256_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  const __m256 scale = _mm256_set1_ps(alpha);
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) {
      float* out = c + r * ldc + n0 + 8 * v;
      __m256 x = _mm256_mul_ps(acc[r][v], scale);
      if (masked(v)) {
        if (accumulate) x = _mm256_add_ps(x, _mm256_maskload_ps(out, mask));
        _mm256_maskstore_ps(out, mask, x);
      } else {
        if (accumulate) x = _mm256_add_ps(x, _mm256_loadu_ps(out));
        _mm256_storeu_ps(out, x);
      }
    }
}

template <int R, int kARow, int kACol>
void row_block(int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t ldb,
               float* c, int64_t ldc, float alpha, bool accumulate) {
  for (int64_t n0 = 0; n0 < n; n0 += 16) {
    if (n - n0 >= 16)
      block<R, 2, true, kARow, kACol>(n, k, a, a_row, a_col, b, ldb, c, ldc, n0, alpha, accumulate);
    else if (n - n0 == 8)
      block<R, 1, true, kARow, kACol>(n, k, a, a_row, a_col, b, ldb, c, ldc, n0, alpha, accumulate);
    else if (n - n0 > 8)
      block<R, 2, false, kARow, kACol>(n, k, a, a_row, a_col, b, ldb, c, ldc, n0, alpha, accumulate);
    else
      block<R, 1, false, kARow, kACol>(n, k, a, a_row, a_col, b, ldb, c, ldc, n0, alpha, accumulate);
  }
}

template <int kARow, int kACol>
void dot_rows(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col, const float* b,
              int64_t ldb, float* c, int64_t ldc, float alpha, bool accumulate) {
  int64_t r0 = 0;
  for (; r0 + 6 <= m; r0 += 6)
    row_block<6, kARow, kACol>(n, k, a + r0 * a_row, a_row, a_col, b, ldb, c + r0 * ldc, ldc, alpha, accumulate);
  const float* ar = a + r0 * a_row;
  float* cr = c + r0 * ldc;
  switch (m - r0) {
    case 1:
      return row_block<1, kARow, kACol>(n, k, ar, a_row, a_col, b, ldb, cr, ldc, alpha, accumulate);
    case 2:
      return row_block<2, kARow, kACol>(n, k, ar, a_row, a_col, b, ldb, cr, ldc, alpha, accumulate);
    case 3:
      return row_block<3, kARow, kACol>(n, k, ar, a_row, a_col, b, ldb, cr, ldc, alpha, accumulate);
    case 4:
      return row_block<4, kARow, kACol>(n, k, ar, a_row, a_col, b, ldb, cr, ldc, alpha, accumulate);
    case 5:
      return row_block<5, kARow, kACol>(n, k, ar, a_row, a_col, b, ldb, cr, ldc, alpha, accumulate);
    default:
      return;
  }
}
#endif

}  // namespace

#if defined(__AVX2__) && defined(__FMA__)
void dot(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t ldb,
         float* c, int64_t ldc, float alpha, bool accumulate) {
  if (a_col == 1) return dot_rows<0, 1>(m, n, k, a, a_row, a_col, b, ldb, c, ldc, alpha, accumulate);
  if (a_row == 1) return dot_rows<1, 0>(m, n, k, a, a_row, a_col, b, ldb, c, ldc, alpha, accumulate);
  dot_rows<0, 0>(m, n, k, a, a_row, a_col, b, ldb, c, ldc, alpha, accumulate);
}
#else
// Any other CPU: the same sums (in order over p) a float at a time.
void dot(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t ldb,
         float* c, int64_t ldc, float alpha, bool accumulate) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float sum = 0.f;
      for (int64_t p = 0; p < k; ++p) sum = std::fma(a[i * a_row + p * a_col], b[p * ldb + j], sum);
      c[i * ldc + j] = sum * alpha + (accumulate ? c[i * ldc + j] : 0.f);
    }
}
#endif

void transpose(const float* x, int64_t stride, int64_t rows, int64_t cols, float* dst, float mul) {
  // Copies where mul is 1, as the blocks do: x's own bits (a product would quieten a signalling NaN, and flush a
  // denormal where the process runs with flush-to-zero).
  const auto one = [&](int64_t r, int64_t c) {
    dst[c * rows + r] = mul == 1.f ? x[r * stride + c] : mul * x[r * stride + c];
  };
  int64_t r0 = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const int64_t c8 = cols / 8 * 8;
  const __m256 by = _mm256_set1_ps(mul);
  for (; r0 + 8 <= rows; r0 += 8) {
    for (int64_t c0 = 0; c0 < c8; c0 += 8) {
      __m256 v[8];
      for (int i = 0; i < 8; ++i) {
        v[i] = _mm256_loadu_ps(x + (r0 + i) * stride + c0);
        if (mul != 1.f) v[i] = _mm256_mul_ps(v[i], by);
      }
      transpose8(v);
      for (int j = 0; j < 8; ++j) _mm256_storeu_ps(dst + (c0 + j) * rows + r0, v[j]);
    }
    for (int64_t r = r0; r < r0 + 8; ++r)
      for (int64_t c = c8; c < cols; ++c) one(r, c);
  }
#endif
  for (int64_t r = r0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) one(r, c);
}

}  // namespace hr::cpu::f32x8_tiles
