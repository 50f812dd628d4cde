// AVX-512 f32 tile products for the CPU attention (attention_f32.h). Built with -mavx512f on x86-64; elsewhere
// dot() exists but is never called (avx512_tiles_present() is false there).
#include "core/backend/cpu/attention_f32.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#define HR_F32_TILES 1
#else
#include "core/check.h"
#endif

namespace hr::cpu::f32_tiles {

#if HR_F32_TILES

namespace {

constexpr int kRows = 6;     // output rows per block: 6 x 4 accumulators, 4 B vectors and a broadcast in 32 zmm
constexpr int kVectors = 4;  // 16-float output vectors per block

inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1u);
}

// Rows [0, R) and the columns [n0, n0 + 16 V) (masked at n) of C. Every loop over r and v unrolled, so that the
// accumulators live in registers.
template <int R, int V>
void block(int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t ldb, float* c,
           int64_t ldc, int64_t n0, float alpha, bool accumulate) {
  __mmask16 mask[V];
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v) mask[v] = tail_mask(n - n0 - 16 * v);
  __m512 acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < k; ++p) {
    const float* row = b + p * ldb + n0;
    __m512 bv[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) bv[v] = _mm512_maskz_loadu_ps(mask[v], row + 16 * v);
    const float* ap = a + p * a_col;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(ap[r * a_row]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  const __m512 scale = _mm512_set1_ps(alpha);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      float* out = c + r * ldc + n0 + 16 * v;
      __m512 x = _mm512_mul_ps(acc[r][v], scale);
      if (accumulate) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(mask[v], out));
      _mm512_mask_storeu_ps(out, mask[v], x);
    }
}

template <int R>
void row_block(int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t ldb,
               float* c, int64_t ldc, float alpha, bool accumulate) {
  for (int64_t n0 = 0; n0 < n; n0 += 16 * kVectors) {
    const int64_t left = (n - n0 + 15) / 16;
    switch (left < kVectors ? left : kVectors) {
      case 1:
        block<R, 1>(n, k, a, a_row, a_col, b, ldb, c, ldc, n0, alpha, accumulate);
        break;
      case 2:
        block<R, 2>(n, k, a, a_row, a_col, b, ldb, c, ldc, n0, alpha, accumulate);
        break;
      case 3:
        block<R, 3>(n, k, a, a_row, a_col, b, ldb, c, ldc, n0, alpha, accumulate);
        break;
      default:
        block<R, kVectors>(n, k, a, a_row, a_col, b, ldb, c, ldc, n0, alpha, accumulate);
    }
  }
}

}  // namespace

void dot(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t ldb,
         float* c, int64_t ldc, float alpha, bool accumulate) {
  int64_t r0 = 0;
  for (; r0 + kRows <= m; r0 += kRows)
    row_block<kRows>(n, k, a + r0 * a_row, a_row, a_col, b, ldb, c + r0 * ldc, ldc, alpha, accumulate);
  const float* ar = a + r0 * a_row;
  float* cr = c + r0 * ldc;
  switch (m - r0) {
    case 1:
      return row_block<1>(n, k, ar, a_row, a_col, b, ldb, cr, ldc, alpha, accumulate);
    case 2:
      return row_block<2>(n, k, ar, a_row, a_col, b, ldb, cr, ldc, alpha, accumulate);
    case 3:
      return row_block<3>(n, k, ar, a_row, a_col, b, ldb, cr, ldc, alpha, accumulate);
    case 4:
      return row_block<4>(n, k, ar, a_row, a_col, b, ldb, cr, ldc, alpha, accumulate);
    case 5:
      return row_block<5>(n, k, ar, a_row, a_col, b, ldb, cr, ldc, alpha, accumulate);
    default:
      return;
  }
}

void transpose(const float* x, int64_t stride, int64_t rows, int64_t cols, float* dst) {
  const __m512i index = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           _mm512_set1_epi32(int(stride)));
  for (int64_t r0 = 0; r0 < rows; r0 += 16) {
    const __mmask16 mask = tail_mask(rows - r0);
    const float* base = x + r0 * stride;
    for (int64_t c = 0; c < cols; ++c)
      _mm512_mask_storeu_ps(dst + c * rows + r0, mask,
                            _mm512_mask_i32gather_ps(_mm512_setzero_ps(), mask, index, base + c, 4));
  }
}

#else  // no AVX-512 in this build: never called (avx512_tiles_present() is false)

void dot(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t, float,
         bool) {
  throw Error("[attention] AVX-512 f32 tile products are not built for this CPU");
}
void transpose(const float*, int64_t, int64_t, int64_t, float*) {
  throw Error("[attention] AVX-512 f32 tile products are not built for this CPU");
}

#endif

}  // namespace hr::cpu::f32_tiles
