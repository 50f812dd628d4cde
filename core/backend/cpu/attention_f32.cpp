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
constexpr __mmask16 kAll = 0xffff;

inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1u);
}

inline int64_t clamp(int64_t x, int64_t lo, int64_t hi) {  // std::clamp is another header's inline function
  return x < lo ? lo : x > hi ? hi : x;
}

inline __m512i lanes() {  // 0, 1, ..., 15
  return _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
}

// exp on 16 lanes: n = round(x / ln 2), r = x - n ln 2 in two parts (Cody and Waite), Cephes' degree-6 polynomial
// for exp(r), scaled by 2^n. x is clamped first, so -inf gives 0 and large x inf; max and min return their second
// operand when either is NaN, so NaN stays NaN.
// (The all-lanes maskz forms: GCC 12 warns that the plain ones' _mm512_undefined_ps() may be used uninitialized.)
inline __m512 exp16(__m512 x) {
  x = _mm512_maskz_min_ps(kAll, _mm512_set1_ps(88.8f), _mm512_maskz_max_ps(kAll, _mm512_set1_ps(-104.f), x));
  const __m512 n = _mm512_maskz_roundscale_ps(kAll, _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_maskz_scalef_ps(kAll, p, n);
}

// The largest lane and the sum of the lanes, in every lane: halves, quarters, pairs and neighbours swapped in
// turn (no scalar chain; GCC 12's _mm512_reduce_*_ps trip the uninitialized warning above). No NaN in x for the
// max.
inline __m512 lanes_max(__m512 x) {
  x = _mm512_maskz_max_ps(kAll, x, _mm512_maskz_shuffle_f32x4(kAll, x, x, 0x4e));
  x = _mm512_maskz_max_ps(kAll, x, _mm512_maskz_shuffle_f32x4(kAll, x, x, 0xb1));
  x = _mm512_maskz_max_ps(kAll, x, _mm512_maskz_permute_ps(kAll, x, 0x4e));
  return _mm512_maskz_max_ps(kAll, x, _mm512_maskz_permute_ps(kAll, x, 0xb1));
}
inline __m512 lanes_sum(__m512 x) {
  x = _mm512_add_ps(x, _mm512_maskz_shuffle_f32x4(kAll, x, x, 0x4e));
  x = _mm512_add_ps(x, _mm512_maskz_shuffle_f32x4(kAll, x, x, 0xb1));
  x = _mm512_add_ps(x, _mm512_maskz_permute_ps(kAll, x, 0x4e));
  return _mm512_add_ps(x, _mm512_maskz_permute_ps(kAll, x, 0xb1));
}

// The larger of a and b per lane, NaN where either is NaN (a NaN in a wins).
inline __m512 nan_max(__m512 a, __m512 b) {
  const __m512 mx = _mm512_maskz_max_ps(kAll, a, b);  // b where either is NaN
  return _mm512_mask_mov_ps(mx, _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
}

// Rows [0, R) and the columns [n0, n0 + 16 V) (masked at n) of C. Every loop over r and v unrolled, so that the
// accumulators live in registers.
// kFull: all 16 V columns lie below n, so the loads of B need no mask (masks held across the k loop spill).
template <int R, int V, bool kFull = false>
void block(int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t ldb, float* c,
           int64_t ldc, int64_t n0, float alpha, bool accumulate) {
  __mmask16 mask[V];
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v) mask[v] = kFull ? kAll : tail_mask(n - n0 - 16 * v);
  __m512 acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < k; ++p) {
    const float* row = b + p * ldb + n0;
    __m512 bv[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      bv[v] = kFull ? _mm512_loadu_ps(row + 16 * v) : _mm512_maskz_loadu_ps(mask[v], row + 16 * v);
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

// Columns [n0, n0 + 16 V) of rows [0, R), unmasked where all 16 V of them lie below n.
template <int R, int V>
void vectors(int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t ldb, float* c,
             int64_t ldc, int64_t n0, float alpha, bool accumulate) {
  if (n - n0 >= 16 * V)
    block<R, V, true>(n, k, a, a_row, a_col, b, ldb, c, ldc, n0, alpha, accumulate);
  else
    block<R, V>(n, k, a, a_row, a_col, b, ldb, c, ldc, n0, alpha, accumulate);
}

template <int R>
void row_block(int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t ldb,
               float* c, int64_t ldc, float alpha, bool accumulate) {
  for (int64_t n0 = 0; n0 < n; n0 += 16 * kVectors) {
    const int64_t left = (n - n0 + 15) / 16;
    switch (left < kVectors ? left : kVectors) {
      case 1:
        vectors<R, 1>(n, k, a, a_row, a_col, b, ldb, c, ldc, n0, alpha, accumulate);
        break;
      case 2:
        vectors<R, 2>(n, k, a, a_row, a_col, b, ldb, c, ldc, n0, alpha, accumulate);
        break;
      case 3:
        vectors<R, 3>(n, k, a, a_row, a_col, b, ldb, c, ldc, n0, alpha, accumulate);
        break;
      default:
        vectors<R, kVectors>(n, k, a, a_row, a_col, b, ldb, c, ldc, n0, alpha, accumulate);
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

void exp_floats(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, mask, exp16(_mm512_maskz_loadu_ps(mask, x + i)));
  }
}

void sigmoid_floats(const float* x, float* y, int64_t n, float alpha) {
  const __m512 one = _mm512_set1_ps(1.f), minus_alpha = _mm512_set1_ps(-alpha);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = tail_mask(n - i);
    const __m512 e = exp16(_mm512_mul_ps(minus_alpha, _mm512_maskz_loadu_ps(mask, x + i)));
    _mm512_mask_storeu_ps(y + i, mask, _mm512_div_ps(one, _mm512_add_ps(one, e)));
  }
}

void softmax_columns(float* st, int64_t bk, int64_t bq, int64_t first_query, int64_t window, float* m, float* l,
                     float* ot, int64_t d) {
  const __m512 one = _mm512_set1_ps(1.f);
  for (int64_t c0 = 0; c0 < bq; c0 += 16) {
    const __mmask16 cols = tail_mask(bq - c0);
    const __m512i r = _mm512_add_epi32(lanes(), _mm512_set1_epi32(int(c0)));
    // The queries that see key jj: r >= first_query + jj, and below first_query + jj + window with a window.
    const auto visible = [&](int64_t jj) {
      const int64_t lo = first_query + jj;
      __mmask16 v = cols & _mm512_cmpge_epi32_mask(r, _mm512_set1_epi32(int(clamp(lo, -1, bq))));
      if (window > 0) v &= _mm512_cmplt_epi32_mask(r, _mm512_set1_epi32(int(clamp(lo + window, -1, bq))));
      return v;
    };
    const __m512 m_old = _mm512_maskz_loadu_ps(cols, m + c0);
    __m512 mx = m_old;
    for (int64_t jj = 0; jj < bk; ++jj)
      mx = _mm512_mask_mov_ps(mx, visible(jj), nan_max(mx, _mm512_maskz_loadu_ps(cols, st + jj * bq + c0)));
    // A query whose max is still -inf has seen nothing (or only -inf): its exponentials are 0 and alpha 1.
    const __mmask16 live = cols & _mm512_cmp_ps_mask(mx, _mm512_set1_ps(-__builtin_inff()), _CMP_NEQ_UQ);
    const __m512 alpha = _mm512_mask_mov_ps(one, live, exp16(_mm512_sub_ps(m_old, mx)));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t jj = 0; jj < bk; ++jj) {
      float* row = st + jj * bq + c0;
      const __m512 p =
          _mm512_maskz_mov_ps(visible(jj) & live, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(cols, row), mx)));
      _mm512_mask_storeu_ps(row, cols, p);
      sum = _mm512_add_ps(sum, p);
    }
    _mm512_mask_storeu_ps(l + c0, cols, _mm512_fmadd_ps(_mm512_maskz_loadu_ps(cols, l + c0), alpha, sum));
    _mm512_mask_storeu_ps(m + c0, cols, mx);
    if ((_mm512_cmp_ps_mask(alpha, one, _CMP_NEQ_UQ) & cols) == 0) continue;  // O^T keeps its scale
    for (int64_t c = 0; c < d; ++c) {
      float* o = ot + c * bq + c0;
      _mm512_mask_storeu_ps(o, cols, _mm512_mul_ps(_mm512_maskz_loadu_ps(cols, o), alpha));
    }
  }
}

void softmax_row(float* s, int64_t bk, int64_t first, int64_t last, float& m, float& l, float* o, int64_t d) {
  const __m512i first_v = _mm512_set1_epi32(int(first)), last_v = _mm512_set1_epi32(int(last));
  const auto seen = [&](int64_t c0) {
    const __m512i c = _mm512_add_epi32(lanes(), _mm512_set1_epi32(int(c0)));
    return tail_mask(bk - c0) & _mm512_cmpge_epi32_mask(c, first_v) & _mm512_cmplt_epi32_mask(c, last_v);
  };
  const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
  __m512 vmax = _mm512_set1_ps(m);
  for (int64_t c0 = 0; c0 < bk; c0 += 16) vmax = nan_max(vmax, _mm512_mask_loadu_ps(neg_inf, seen(c0), s + c0));
  const __m512 mxv =
      _mm512_cmp_ps_mask(vmax, vmax, _CMP_UNORD_Q) ? _mm512_set1_ps(__builtin_nanf("")) : lanes_max(vmax);
  const float mx = _mm512_cvtss_f32(mxv);
  if (mx == -__builtin_inff()) {
    for (int64_t c0 = 0; c0 < bk; c0 += 16) _mm512_mask_storeu_ps(s + c0, tail_mask(bk - c0), _mm512_setzero_ps());
    return;
  }
  __m512 sum = _mm512_setzero_ps();
  for (int64_t c0 = 0; c0 < bk; c0 += 16) {
    const __mmask16 cols = tail_mask(bk - c0);
    const __m512 p = _mm512_maskz_mov_ps(seen(c0), exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(cols, s + c0), mxv)));
    _mm512_mask_storeu_ps(s + c0, cols, p);
    sum = _mm512_add_ps(sum, p);
  }
  const __m512 alpha = exp16(_mm512_set1_ps(m - mx));
  l = l * _mm512_cvtss_f32(alpha) + _mm512_cvtss_f32(lanes_sum(sum));
  m = mx;
  for (int64_t c0 = 0; c0 < d; c0 += 16) {
    const __mmask16 cols = tail_mask(d - c0);
    _mm512_mask_storeu_ps(o + c0, cols, _mm512_mul_ps(_mm512_maskz_loadu_ps(cols, o + c0), alpha));
  }
}

void scale_columns(float* x, int64_t rows, int64_t cols, int64_t ld, const float* s) {
  for (int64_t c0 = 0; c0 < cols; c0 += 16) {
    const __mmask16 mask = tail_mask(cols - c0);
    const __m512 by = _mm512_maskz_loadu_ps(mask, s + c0);
    for (int64_t r = 0; r < rows; ++r) {
      float* row = x + r * ld + c0;
      _mm512_mask_storeu_ps(row, mask, _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, row), by));
    }
  }
}

void probs_and_grads_row(float* p, float* dp, int64_t bk, int64_t first, int64_t last, float scale, float lse,
                         float delta) {
  const __m512 sc = _mm512_set1_ps(scale), ls = _mm512_set1_ps(lse), de = _mm512_set1_ps(delta);
  for (int64_t c0 = 0; c0 < bk; c0 += 16) {
    const __mmask16 cols = tail_mask(bk - c0);
    const __m512i c = _mm512_add_epi32(lanes(), _mm512_set1_epi32(int(c0)));
    const __mmask16 seen = cols & _mm512_cmpge_epi32_mask(c, _mm512_set1_epi32(int(first))) &
                           _mm512_cmplt_epi32_mask(c, _mm512_set1_epi32(int(last)));
    const __m512 pr = _mm512_maskz_mov_ps(seen, exp16(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(cols, p + c0), sc, ls)));
    const __m512 g = _mm512_mul_ps(_mm512_mul_ps(pr, _mm512_sub_ps(_mm512_maskz_loadu_ps(cols, dp + c0), de)), sc);
    _mm512_mask_storeu_ps(p + c0, cols, pr);
    _mm512_mask_storeu_ps(dp + c0, cols, g);
  }
}

#else  // no AVX-512 in this build: never called (avx512_tiles_present() is false)

void dot(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t, float,
         bool) {
  throw Error("[attention] AVX-512 f32 tile products are not built for this CPU");
}
void exp_floats(const float*, float*, int64_t) {
  throw Error("[attention] AVX-512 f32 tile products are not built for this CPU");
}
void softmax_columns(float*, int64_t, int64_t, int64_t, int64_t, float*, float*, float*, int64_t) {
  throw Error("[attention] AVX-512 f32 tile products are not built for this CPU");
}
void softmax_row(float*, int64_t, int64_t, int64_t, float&, float&, float*, int64_t) {
  throw Error("[attention] AVX-512 f32 tile products are not built for this CPU");
}
void scale_columns(float*, int64_t, int64_t, int64_t, const float*) {
  throw Error("[attention] AVX-512 f32 tile products are not built for this CPU");
}
void probs_and_grads_row(float*, float*, int64_t, int64_t, int64_t, float, float, float) {
  throw Error("[attention] AVX-512 f32 tile products are not built for this CPU");
}

#endif

}  // namespace hr::cpu::f32_tiles
