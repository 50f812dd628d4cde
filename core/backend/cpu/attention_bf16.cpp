// AVX512-BF16 tile products for the CPU attention (attention_bf16.h). Built with -mavx512bf16 and its companions on
// x86-64; elsewhere the functions exist but are never called (bf16_tiles_present() is false there).
#include "core/backend/cpu/attention_bf16.h"

#include <cstring>

#include "core/backend/cpu/cpu_kernels.h"
#include "core/check.h"

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define HR_BF16_TILES 1
#endif
#if HR_BF16_TILES && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define HR_AMX_TILES 1
#endif

namespace hr::cpu::bf16_tiles {

namespace {

// n zeros from p. memset, not std::fill: this file may use no inline function of another header (the header says why).
void zero(uint16_t* p, int64_t n) {
  if (n > 0) std::memset(p, 0, std::size_t(n) * sizeof(uint16_t));
}

}  // namespace

#if HR_BF16_TILES

namespace {

constexpr int kRows = 6;     // output rows per block: 6 x 4 accumulators, 4 B vectors and a broadcast in 32 zmm
constexpr int kVectors = 4;  // 16-float output vectors per block

inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1u);
}

// Rows [0, R) and the columns [n0, n0 + 16 V) (masked at n) of C.
template <int R, int V>
void block(int64_t n, int64_t kp, const uint16_t* a, int64_t lda, const uint32_t* b, float* c, int64_t ldc, int64_t n0,
           float alpha, bool accumulate) {
  __mmask16 mask[V];
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v) mask[v] = tail_mask(n - n0 - 16 * v);
  // Every loop over r and v unrolled, so that the accumulators live in registers (GCC keeps an array it cannot
  // scalarize on the stack, and stores each accumulator back every step).
  __m512 acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kp; ++p) {
    const uint32_t* row = b + p * n + n0;
    __m512i bv[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) bv[v] = _mm512_maskz_loadu_epi32(mask[v], row + 16 * v);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      uint32_t pair;
      std::memcpy(&pair, a + r * lda + 2 * p, sizeof pair);
      const __m512i av = _mm512_set1_epi32(int(pair));
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)av, (__m512bh)bv[v]);
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
void row_block(int64_t n, int64_t kp, const uint16_t* a, int64_t lda, const uint32_t* b, float* c, int64_t ldc,
               float alpha, bool accumulate) {
  for (int64_t n0 = 0; n0 < n; n0 += 16 * kVectors) {
    const int64_t vectors = (n - n0 + 15) / 16;
    switch (vectors < kVectors ? vectors : kVectors) {
      case 1:
        block<R, 1>(n, kp, a, lda, b, c, ldc, n0, alpha, accumulate);
        break;
      case 2:
        block<R, 2>(n, kp, a, lda, b, c, ldc, n0, alpha, accumulate);
        break;
      case 3:
        block<R, 3>(n, kp, a, lda, b, c, ldc, n0, alpha, accumulate);
        break;
      default:
        block<R, kVectors>(n, kp, a, lda, b, c, ldc, n0, alpha, accumulate);
    }
  }
}

#if HR_AMX_TILES
// AMX: tiles 0-3 hold a 2 x 2 block of 16 x 16 f32 outputs, 4-5 two 16-row slices of A (16 pairs each), 6-7 two
// 16 x 16-pair slices of B. The configuration is loaded per call: oneDNN's AMX GEMMs load their own on the same
// thread.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

void amx_configure() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
}

// Rows [0, m) and columns [0, n) of C (both multiples of 32) = A B (+ C when `accumulate`), over kp pairs (a
// multiple of 16); A's and C's row strides lda and ldc, B's n pairs.
void amx_blocks(int64_t m, int64_t n, int64_t kp, const uint16_t* a, int64_t lda, const uint32_t* b, float* c,
                int64_t ldc, bool accumulate) {
  const int64_t sa = lda * 2, sb = n * 4, sc = ldc * 4;  // strides in bytes
  for (int64_t m0 = 0; m0 < m; m0 += 32)
    for (int64_t n0 = 0; n0 < n; n0 += 32) {
      float* out = c + m0 * ldc + n0;
      if (accumulate) {
        _tile_loadd(0, out, sc);
        _tile_loadd(1, out + 16, sc);
        _tile_loadd(2, out + 16 * ldc, sc);
        _tile_loadd(3, out + 16 * ldc + 16, sc);
      } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      }
      for (int64_t p0 = 0; p0 < kp; p0 += 16) {
        _tile_loadd(4, a + m0 * lda + 2 * p0, sa);
        _tile_loadd(5, a + (m0 + 16) * lda + 2 * p0, sa);
        _tile_loadd(6, b + p0 * n + n0, sb);
        _tile_loadd(7, b + p0 * n + n0 + 16, sb);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, out, sc);
      _tile_stored(1, out + 16, sc);
      _tile_stored(2, out + 16 * ldc, sc);
      _tile_stored(3, out + 16 * ldc + 16, sc);
    }
}

// The rows of a product that AMX takes (a multiple of 32; 0 where a dimension is not whole tiles, or where AMX is
// absent or turned off). alpha scales C afterwards, so a product that adds into C with alpha != 1 stays on the
// dot-product path.
int64_t amx_rows(int64_t m, int64_t n, int64_t kp, float alpha, bool accumulate) {
  static const bool amx = amx_tiles_present();
  if (!amx || n % 32 != 0 || kp % 16 != 0 || (accumulate && alpha != 1.f)) return 0;
  return m / 32 * 32;
}
#endif

}  // namespace

void dot(int64_t m, int64_t n, int64_t kp, const uint16_t* a, int64_t lda, const uint32_t* b, float* c, int64_t ldc,
         float alpha, bool accumulate) {
  int64_t r0 = 0;
#if HR_AMX_TILES
  if (const int64_t rows = amx_rows(m, n, kp, alpha, accumulate); rows > 0) {
    amx_configure();
    amx_blocks(rows, n, kp, a, lda, b, c, ldc, accumulate);
    _tile_release();
    if (alpha != 1.f)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < n; ++j) c[r * ldc + j] *= alpha;
    r0 = rows;
  }
#endif
  for (; r0 + kRows <= m; r0 += kRows)
    row_block<kRows>(n, kp, a + r0 * lda, lda, b, c + r0 * ldc, ldc, alpha, accumulate);
  const uint16_t* ar = a + r0 * lda;
  float* cr = c + r0 * ldc;
  switch (m - r0) {
    case 1:
      return row_block<1>(n, kp, ar, lda, b, cr, ldc, alpha, accumulate);
    case 2:
      return row_block<2>(n, kp, ar, lda, b, cr, ldc, alpha, accumulate);
    case 3:
      return row_block<3>(n, kp, ar, lda, b, cr, ldc, alpha, accumulate);
    case 4:
      return row_block<4>(n, kp, ar, lda, b, cr, ldc, alpha, accumulate);
    case 5:
      return row_block<5>(n, kp, ar, lda, b, cr, ldc, alpha, accumulate);
    default:
      return;
  }
}

void round_rows(const float* src, int64_t src_ld, int64_t rows, int64_t cols, uint16_t* dst, int64_t dst_ld) {
  if (cols > 64 || dst_ld < cols) rows_do_not_fit(cols, dst_ld);
  alignas(64) uint16_t row[64];
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = src + r * src_ld;
    for (int64_t c0 = 0; c0 < cols; c0 += 16) {
      const __mmask16 mask = tail_mask(cols - c0);
      const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, s + c0));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + c0), (__m256i)h);
    }
    std::memcpy(dst + r * dst_ld, row, std::size_t(cols) * sizeof(uint16_t));
    zero(dst + r * dst_ld + cols, dst_ld - cols);
  }
}

#else  // no AVX512-BF16 in this build: never called (bf16_tiles_present() is false)

void dot(int64_t, int64_t, int64_t, const uint16_t*, int64_t, const uint32_t*, float*, int64_t, float, bool) {
  throw Error("[attention] bf16 tile products are not built for this CPU");
}
void round_rows(const float*, int64_t, int64_t, int64_t, uint16_t*, int64_t) {
  throw Error("[attention] bf16 tile products are not built for this CPU");
}

#endif

void transpose(const uint16_t* src, int64_t src_ld, int64_t rows, int64_t cols, uint16_t* dst, int64_t dst_ld) {
#if HR_BF16_TILES
  // Columns c and c + 1 of 16 rows at a time: one 32-bit gather at src + r src_ld + c (scale 2), its low halves
  // column c and its high halves column c + 1. A last odd column reads the element after it only where the rows
  // are padded (src_ld > cols); otherwise it goes one element at a time below.
  const __m512i index = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           _mm512_set1_epi32(int(src_ld)));
  const int64_t paired = src_ld > cols ? cols : cols & ~int64_t(1);
  for (int64_t r0 = 0; r0 < rows; r0 += 16) {
    const __mmask16 mask = tail_mask(rows - r0);
    const uint16_t* base = src + r0 * src_ld;
    for (int64_t c = 0; c < paired; c += 2) {
      const __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mask, index, base + c, 2);
      _mm512_mask_cvtepi32_storeu_epi16(dst + c * dst_ld + r0, mask, g);
      if (c + 1 < cols)
        _mm512_mask_cvtepi32_storeu_epi16(dst + (c + 1) * dst_ld + r0, mask,
                                          _mm512_maskz_srli_epi32(__mmask16(0xffff), g, 16));
    }
  }
  for (int64_t c = paired; c < cols; ++c)
    for (int64_t r = 0; r < rows; ++r) dst[c * dst_ld + r] = src[r * src_ld + c];
  for (int64_t c = 0; c < cols; ++c) zero(dst + c * dst_ld + rows, dst_ld - rows);
  return;
#endif
  for (int64_t c = 0; c < cols; ++c) {
    uint16_t* d = dst + c * dst_ld;
    for (int64_t r = 0; r < rows; ++r) d[r] = src[r * src_ld + c];
    zero(d + rows, dst_ld - rows);
  }
}

void pack_transposed(const uint16_t* x, int64_t stride, int64_t rows, int64_t cols, uint32_t* dst) {
#if HR_BF16_TILES
  // 16 rows' pair p at a time: 32-bit gathers at x + j stride + 2p (in bf16 elements, scale 2; no alignment needed).
  const __m512i index = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           _mm512_set1_epi32(int(stride)));
  for (int64_t j0 = 0; j0 < rows; j0 += 16) {
    const __mmask16 mask = tail_mask(rows - j0);
    const uint16_t* base = x + j0 * stride;
    for (int64_t p = 0; p < cols / 2; ++p)
      _mm512_mask_storeu_epi32(dst + p * rows + j0, mask,
                               _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mask, index, base + 2 * p, 2));
  }
  return;
#endif
  for (int64_t j = 0; j < rows; ++j) {
    const uint16_t* row = x + j * stride;
    for (int64_t p = 0; p < cols / 2; ++p) dst[p * rows + j] = uint32_t(row[2 * p]) | uint32_t(row[2 * p + 1]) << 16;
  }
}

void pack_rows(const uint16_t* x, int64_t stride, int64_t rows, int64_t cols, uint32_t* dst) {
  for (int64_t p = 0; p < (rows + 1) / 2; ++p) {
    const uint16_t* lo = x + 2 * p * stride;
    const uint16_t* hi = 2 * p + 1 < rows ? lo + stride : nullptr;
    uint32_t* d = dst + p * cols;
    if (hi)
      for (int64_t j = 0; j < cols; ++j) d[j] = uint32_t(lo[j]) | uint32_t(hi[j]) << 16;
    else
      for (int64_t j = 0; j < cols; ++j) d[j] = uint32_t(lo[j]);
  }
}

}  // namespace hr::cpu::bf16_tiles
