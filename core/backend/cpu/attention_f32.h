// The CPU attention's f32 tile products on AVX-512: 16-float vectors in register blocks of up to 6 rows x 64 columns,
// where the f32 tiles otherwise run their products 8 floats wide (attention_f32x8.h, AVX2). attention.cpp calls these
// where avx512_tiles_present(); the file is
// built with AVX-512 flags, so nothing here may run on a CPU without them, and it uses no inline function of
// another header (the linker would be free to keep this file's AVX-512 copy for every caller).
#pragma once

#include <cstdint>

namespace hr::cpu::f32_tiles {

// C[m x n] (row stride ldc) = alpha * A B, plus C's own values when `accumulate`. A is m x k with element (i, p) at
// a[i * a_row + p * a_col]: a_row = lda, a_col = 1 for a row-major A; a_row = 1, a_col = lda for the transpose of a
// row-major k x m matrix. B is row-major k x n (row stride ldb). Sums in f32, in order over p.
void dot(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t ldb,
         float* c, int64_t ldc, float alpha, bool accumulate);

// y[i] = exp(x[i]) for n floats (x and y may be the same): the kernels' exponential, Cephes' polynomial on 16 lanes,
// within a few ulp of std::exp; NaN stays NaN, -inf gives 0, overflow inf.
void exp_floats(const float* x, float* y, int64_t n);

// y[i] = 1 / (1 + exp(-alpha x[i])) for n floats (x and y may be the same), through exp_floats' exponential and an
// IEEE division: the sigmoid of SiLU (alpha 1), SwiGLU and quick GELU (1.702). NaN stays NaN; 1 and 0 at the ends.
void sigmoid_floats(const float* x, float* y, int64_t n, float alpha);

// The column-wise forward's online softmax over one key tile. st is S^T (bk x bq, row stride bq): row jj holds key
// jj's scores against the tile's bq <= 64 queries. Key jj is visible to the queries r with first_query + jj <= r
// and, when window > 0, r < first_query + jj + window. Each query's column becomes its exponentials (zero where
// not visible), its running max m[r] and sum l[r] take the tile in, and column r of O^T (d x bq, row stride bq) is
// rescaled to the new max. NaN propagates; a query that has seen nothing keeps m = -inf, l and its column.
void softmax_columns(float* st, int64_t bk, int64_t bq, int64_t first_query, int64_t window, float* m, float* l,
                     float* ot, int64_t d);

// The row-wise forward's online softmax (the bf16 tiles') for one query's row of a tile: bk scores, keys [first,
// last) visible. The row becomes its exponentials (zeros elsewhere), m and l take it in, and the output row o (d
// floats) is rescaled to the new max. NaN propagates; a row that has seen nothing (or only -inf) becomes zeros and
// leaves m, l and o as they were.
void softmax_row(float* s, int64_t bk, int64_t first, int64_t last, float& m, float& l, float* o, int64_t d);

// x[r * ld + c] *= s[c] for the rows x cols floats of x.
void scale_columns(float* x, int64_t rows, int64_t cols, int64_t ld, const float* s);

// The backward's row of one query against a key tile (bk keys, [first, last) visible): the scores p become the
// probabilities exp(scale p - lse), and dp (dO V^T) the score gradients p (dp - delta) scale; zeros elsewhere.
void probs_and_grads_row(float* p, float* dp, int64_t bk, int64_t first, int64_t last, float scale, float lse,
                         float delta);

}  // namespace hr::cpu::f32_tiles
