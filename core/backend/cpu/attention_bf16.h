// The CPU attention's bf16 tile products: AMX tiles (tdpbf16ps) where the CPU has them and the product is whole
// 32 x 32 blocks over 32-element steps, AVX512-BF16 dot products (vdpbf16ps) for the rest, so that a bf16 attention's
// products are not widened to f32 first. On the Intel Xeon measured (README), vdpbf16ps alone ran the attention no
// faster than the f32 tiles: the gain there is AMX's. The softmax and every accumulation stay in f32 (as SDPA's and
// FlashAttention's bf16 kernels keep them); the probabilities and the score gradients are rounded to bf16 for the
// products that take them, as theirs are. attention.cpp calls these where bf16_tiles_present(); the file is built
// with AVX-512 and AMX flags (core/CMakeLists.txt), so nothing here may run on a CPU without them, and it uses no
// inline function of another header (the linker would be free to keep this file's AVX-512 copy for every caller).
//
// Layouts, in bf16 elements (uint16_t) or bf16 pairs (uint32_t, two bf16 of one reduction step, low half first):
//   A: row-major, rows of `lda` elements whose reduction runs over consecutive pairs (an odd length padded with 0);
//   B: "pairs" layout [kp][n]: element (p, j) holds B's rows 2p and 2p+1 of column j.
#pragma once

#include <cstdint>

namespace hr::cpu::bf16_tiles {

// C[m x n] (row stride ldc) = alpha * A[m x 2kp] B[2kp x n], plus C's own values when `accumulate`. f32 products
// and sums (AMX and vdpbf16ps treat bf16 subnormals as zero).
void dot(int64_t m, int64_t n, int64_t kp, const uint16_t* a, int64_t lda, const uint32_t* b, float* c, int64_t ldc,
         float alpha, bool accumulate);

// `rows` f32 rows of `cols` <= 64 values (stride src_ld floats) rounded to bf16 rows of stride dst_ld elements (the
// columns from `cols` on written as 0). dst may alias src when dst_ld <= 2 * src_ld: each row is read whole before
// it is written.
void round_rows(const float* src, int64_t src_ld, int64_t rows, int64_t cols, uint16_t* dst, int64_t dst_ld);
// round_rows' error for rows that do not fit (cols > 64 or dst_ld < cols); defined in attention.cpp, outside the
// AVX-512 file, since building the message takes inline functions.
[[noreturn]] void rows_do_not_fit(int64_t cols, int64_t dst_ld);

// dst[c][r] = src[r][c] for `rows` x `cols` bf16 (src stride src_ld); dst's rows have stride dst_ld >= rows, the
// elements from `rows` on are 0.
void transpose(const uint16_t* src, int64_t src_ld, int64_t rows, int64_t cols, uint16_t* dst, int64_t dst_ld);

// B = X^T in the pairs layout for the product A X^T: X is `rows` x `cols` (cols even, row stride `stride`), and
// dst[p][j] holds X[j][2p], X[j][2p+1]. dst is [cols / 2][rows].
void pack_transposed(const uint16_t* x, int64_t stride, int64_t rows, int64_t cols, uint32_t* dst);

// B = X in the pairs layout for the product A X: dst[p][j] holds X[2p][j], X[2p+1][j] (X[rows][j] read as 0 when
// rows is odd). dst is [(rows + 1) / 2][cols].
void pack_rows(const uint16_t* x, int64_t stride, int64_t rows, int64_t cols, uint32_t* dst);

}  // namespace hr::cpu::bf16_tiles
