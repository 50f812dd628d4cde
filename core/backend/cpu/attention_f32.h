// The CPU attention's f32 tile products on AVX-512: 16-float vectors in register blocks of up to 6 rows x 64 columns,
// where the f32 tiles otherwise run Eigen's products, whose packet width is fixed at AVX2's 8 floats when
// attention.cpp compiles (core/CMakeLists.txt). attention.cpp calls these where avx512_tiles_present(); the file is
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

// dst[c * rows + r] = x[r * stride + c] for `rows` x `cols` floats: the transpose that a product A X^T takes as its B.
// Gathers of 16 rows at a time; stride * 16 must fit in 32 bits.
void transpose(const float* x, int64_t stride, int64_t rows, int64_t cols, float* dst);

}  // namespace hr::cpu::f32_tiles
