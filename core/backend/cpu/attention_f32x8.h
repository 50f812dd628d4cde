// The CPU attention's f32 tile products where the CPU has no AVX-512 (or ONEDNN_MAX_CPU_ISA caps it below
// avx512_core): attention_f32.h's dot 8 floats wide, in AVX2 + FMA (attention_f32x8.cpp is built with them on
// x86-64, as attention.cpp is: core/CMakeLists.txt), a float at a time on other CPUs; attention.cpp calls it where
// avx512_tiles_present() is false. The transpose is every CPU's (AVX-512 gathers were slower).
#pragma once

#include <cstdint>

namespace hr::cpu::f32x8_tiles {

// C[m x n] (row stride ldc) = alpha * A B, plus C's own values when `accumulate`, with f32_tiles::dot's arguments:
// A's element (i, p) at a[i * a_row + p * a_col], B row-major k x n (row stride ldb). Register blocks of up to 6 rows
// x 16 columns, B read in place, the column edge masked (C's columns past n are never touched). Sums in f32, in order
// over p.
void dot(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t ldb,
         float* c, int64_t ldc, float alpha, bool accumulate);

// dst[c * rows + r] = mul * x[r * stride + c] for `rows` x `cols` floats: 8 x 8 blocks through AVX2 shuffles, the
// edges a float at a time; where mul is 1, a copy of x's bits.
void transpose(const float* x, int64_t stride, int64_t rows, int64_t cols, float* dst, float mul = 1.f);

}  // namespace hr::cpu::f32x8_tiles
