// The CPU attention's f32 tile primitives against plain scalar loops in double. The AVX-512 ones (attention_f32.h):
// the exponential and the sigmoid, the products over every block shape and stride, the column-wise online softmax
// with its masks, NaN and -inf, and the backward's probability and gradient rows; on a CPU without AVX-512 each of
// those tests checks that the attention never chooses them. The 8-wide ones (attention_f32x8.h): the products
// (every other CPU's) and the transpose (every CPU's), on every CPU. The op table checks the attention these make up;
// here each primitive is pinned on its own, tails included.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/backend/cpu/attention_f32.h"
#include "core/backend/cpu/attention_f32x8.h"
#include "core/backend/cpu/cpu_kernels.h"
#include "core/backend/kernels.h"
#include "core/check.h"

namespace ft = hr::cpu::f32_tiles;
namespace f8 = hr::cpu::f32x8_tiles;

namespace {

// Whether this CPU can execute the primitives (x86-64 builds them with AVX-512 flags), whatever ONEDNN_MAX_CPU_ISA
// lets the attention choose: under the ISA reruns they are still checked here.
bool cpu_has_avx512() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

// Where the CPU cannot execute them, what holds instead is that the attention never chooses them.
#define HR_NEED_AVX512_TILES()                                                                         \
  if (!cpu_has_avx512()) {                                                                             \
    EXPECT_FALSE(hr::cpu::avx512_tiles_present()) << "the AVX-512 tiles chosen on a CPU without them"; \
    return;                                                                                            \
  }

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> random_floats(std::size_t n, float lo, float hi, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(gen);
  return v;
}

TEST(F32Tiles, ExpIsWithinFourUlpOfStdExpAndKeepsTheSpecialValues) {
  HR_NEED_AVX512_TILES();
  std::vector<float> x = random_floats(10007, -110.f, 90.f, 1);
  for (float v : {0.f, -0.f, 1.f, -1.f, 88.7f, 88.72f, 88.8f, 100.f, -87.f, -103.f, -104.f, -200.f, kInf, -kInf,
                  std::numeric_limits<float>::quiet_NaN()})
    x.push_back(v);
  std::vector<float> y(x.size());
  ft::exp_floats(x.data(), y.data(), int64_t(x.size()));
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(double(x[i]));
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(y[i]));
    } else if (want > std::numeric_limits<float>::max()) {
      EXPECT_EQ(y[i], kInf) << "exp(" << x[i] << ")";
    } else if (want < std::numeric_limits<float>::min()) {  // subnormal or zero: absolute error
      EXPECT_NEAR(y[i], want, 2e-45) << "exp(" << x[i] << ")";
    } else {
      EXPECT_NEAR(y[i] / want, 1.0, 4 * std::numeric_limits<float>::epsilon()) << "exp(" << x[i] << ")";
    }
  }
  // In place, with a length that is no multiple of 16: the tail lanes past n stay untouched.
  std::vector<float> z = {0.f, 1.f,  2.f,  3.f,  4.f,  5.f,  6.f,  7.f,  8.f,
                          9.f, 10.f, 11.f, 12.f, 13.f, 14.f, 15.f, 16.f, 42.f};
  ft::exp_floats(z.data(), z.data(), 17);
  EXPECT_NEAR(z[16] / std::exp(16.0), 1.0, 4 * std::numeric_limits<float>::epsilon());
  EXPECT_EQ(z[17], 42.f);
}

TEST(F32Tiles, SigmoidIsWithinFiveUlpOfTheDoubleSigmoidAndKeepsTheSpecialValues) {
  HR_NEED_AVX512_TILES();
  for (float alpha : {1.f, 1.702f}) {
    std::vector<float> x = random_floats(10007, -60.f, 60.f, 2);
    for (float v : {0.f, -0.f, 1e-30f, 15.f, -15.f, 52.f, -52.f, 60.f, -60.f, 100.f, -100.f, 1e30f, -1e30f, kInf, -kInf,
                    std::numeric_limits<float>::quiet_NaN()})
      x.push_back(v);
    std::vector<float> y = x;
    ft::sigmoid_floats(y.data(), y.data(), int64_t(y.size()), alpha);
    for (std::size_t i = 0; i < x.size(); ++i) {
      // The argument rounded to float first, as the kernel (and any f32 sigmoid) has it: at |alpha x| ~ 60 that
      // rounding alone moves exp by ~30 ulp.
      const float arg = -alpha * x[i];
      const double want = 1.0 / (1.0 + std::exp(double(arg)));
      if (std::isnan(x[i])) {
        EXPECT_TRUE(std::isnan(y[i]));
      } else if (want < std::numeric_limits<float>::min()) {  // below float's normal range (0 once exp overflows)
        EXPECT_NEAR(y[i], want, 4e-39) << "sigmoid(" << x[i] << ")";
      } else {
        EXPECT_NEAR(y[i] / want, 1.0, 5 * std::numeric_limits<float>::epsilon())
            << "sigmoid(" << alpha << " * " << x[i] << ")";
      }
    }
    EXPECT_EQ(y[y.size() - 3], 1.f);  // +inf
    EXPECT_EQ(y[y.size() - 2], 0.f);  // -inf
  }
  // A length that is no multiple of 16: the lanes past n stay untouched.
  std::vector<float> z(18, 0.f);
  z[17] = 42.f;
  ft::sigmoid_floats(z.data(), z.data(), 17, 1.f);
  EXPECT_EQ(z[16], 0.5f);
  EXPECT_EQ(z[17], 42.f);
}

// C = alpha A B (+ C) in double, A read through (a_row, a_col), B row-major with row stride ldb.
void reference_dot(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col, const float* b,
                   int64_t ldb, std::vector<double>& c, int64_t ldc, float alpha, bool accumulate) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += double(a[i * a_row + p * a_col]) * b[p * ldb + j];
      c[std::size_t(i * ldc + j)] = alpha * s + (accumulate ? c[std::size_t(i * ldc + j)] : 0.0);
    }
}

using DotFn = void (*)(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t, float*,
                       int64_t, float, bool);

// `dot` against reference_dot over row counts 1..9, 13 and 64 (six-row blocks and every remainder) and column counts
// that end on and off the 16-column (8-wide) and 64-column (16-wide) blocks, with A as rows, as a transpose and as
// every other column (neither stride 1), with and without accumulation; C's padding columns must stay untouched.
void check_dot_shapes(DotFn dot) {
  struct Shape {
    int64_t m, n, k;
  };
  // Columns on and off whole 64-column blocks, with 1 to 4 vectors left over, whole (8, 16, 24, 32, 40, 48, 96) or
  // with a masked tail (1, 3, 5, 9, 12, 15, 17, 21, 60, 65, 100, 185); each 8-wide edge block (one or two vectors,
  // whole or masked) under several row remainders.
  const std::vector<Shape> shapes = {{64, 64, 64}, {7, 64, 64},  {5, 65, 33}, {6, 128, 8},   {1, 21, 64},  {2, 16, 1},
                                     {3, 48, 17},  {4, 80, 64},  {64, 1, 64}, {13, 100, 40}, {5, 60, 9},   {8, 185, 12},
                                     {9, 32, 20},  {6, 96, 7},   {11, 8, 5},  {6, 9, 3},     {12, 15, 30}, {7, 17, 2},
                                     {6, 3, 65},   {10, 12, 48}, {4, 8, 6},   {3, 12, 9},    {2, 24, 5},   {1, 9, 7},
                                     {3, 5, 11},   {1, 40, 3},   {3, 0, 4},   {0, 5, 4},     {4, 5, 0}};
  unsigned seed = 10;
  enum Layout { kRows, kTransposed, kEveryOther };  // A row-major; a transpose; every other column of a row-major A
  for (const Shape& s : shapes)
    for (Layout layout : {kRows, kTransposed, kEveryOther})
      for (bool accumulate : {false, true}) {
        const bool transposed_a = layout == kTransposed;
        SCOPED_TRACE(testing::Message() << s.m << "x" << s.n << "x" << s.k << (transposed_a ? " A^T" : "")
                                        << (layout == kEveryOther ? " A[:, ::2]" : "") << (accumulate ? " +=" : ""));
        const int64_t lda = (transposed_a            ? s.m
                             : layout == kEveryOther ? 2 * s.k
                                                     : s.k) +
                            3,
                      ldb = s.n + 5, ldc = s.n + 2;
        const int64_t a_row = transposed_a ? 1 : lda, a_col = transposed_a ? lda : layout == kEveryOther ? 2 : 1;
        const std::vector<float> a = random_floats(std::size_t((transposed_a ? s.k : s.m) * lda), -1, 1, ++seed);
        const std::vector<float> b = random_floats(std::size_t(s.k * ldb), -1, 1, ++seed);
        std::vector<float> c = random_floats(std::size_t(s.m * ldc), -1, 1, ++seed);
        std::vector<double> want(c.begin(), c.end());
        reference_dot(s.m, s.n, s.k, a.data(), a_row, a_col, b.data(), ldb, want, ldc, 0.5f, accumulate);
        dot(s.m, s.n, s.k, a.data(), a_row, a_col, b.data(), ldb, c.data(), ldc, 0.5f, accumulate);
        for (int64_t i = 0; i < s.m; ++i)
          for (int64_t j = 0; j < ldc; ++j) {
            const std::size_t at = std::size_t(i * ldc + j);
            if (j < s.n)
              ASSERT_NEAR(c[at], want[at], 1e-5 * (1 + double(s.k))) << "C(" << i << ", " << j << ")";
            else
              ASSERT_EQ(double(c[at]), want[at]) << "padding C(" << i << ", " << j << ") was written";
          }
      }
}

TEST(F32Tiles, DotMatchesTheReferenceForEveryBlockShapeStrideAndTail) {
  HR_NEED_AVX512_TILES();
  check_dot_shapes(&ft::dot);
}

// The 8-wide products run on every CPU the attention runs on (attention_isa_present(): AVX2 + FMA, as the file is
// compiled on x86-64; a float at a time elsewhere), whatever the attention chooses on this one. Where the CPU cannot
// execute them, what holds instead is that the kernel table refuses the attention by name.
#define HR_NEED_ATTENTION_ISA()                                                                   \
  if (!hr::cpu::attention_isa_present()) {                                                        \
    EXPECT_THROW(hr::core::cpu_kernels().attention_forward(hr::core::AttentionArgs{}), hr::Error) \
        << "the attention kernels reachable on a CPU without AVX2 and FMA";                       \
    return;                                                                                       \
  }

TEST(F32x8Tiles, DotMatchesTheReferenceForEveryBlockShapeStrideAndTail) {
  HR_NEED_ATTENTION_ISA();
  check_dot_shapes(&f8::dot);
}

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// The transpose over 8 x 8 blocks and both edges (rows and columns past the last whole block), scaled and not, with a
// source stride wider than its columns: the scaled copy is the product, the unscaled one x's bits, in the blocks and
// at the edges alike (-0, infinities, a quiet NaN's payload, a signalling NaN, a denormal).
TEST(F32x8Tiles, TransposeCopiesEveryElementExactlyAcrossBlocksAndEdges) {
  HR_NEED_ATTENTION_ISA();
  const std::vector<float> special = {-0.f, kInf, -kInf, from_bits(0x7fc01234u), from_bits(0xff800001u), 1e-40f};
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
           {8, 8}, {64, 64}, {64, 12}, {21, 7}, {17, 24}, {3, 40}, {1, 1}, {65, 48}, {9, 9}, {16, 13}, {0, 5}})
    for (float mul : {1.f, 0.125f, -3.f}) {
      SCOPED_TRACE(testing::Message() << rows << "x" << cols << " * " << mul);
      const int64_t stride = cols + 5;
      std::vector<float> x = random_floats(std::size_t(rows * stride), -1, 1, unsigned(rows * 131 + cols));
      // The special values along the first row (a block where there is one) and along the last row, from its first
      // and from its last column (the edges where there are some).
      for (int64_t v = 0; v < int64_t(special.size()) && rows > 0; ++v) {
        const int64_t c = v % cols, r = v / cols % rows;
        x[std::size_t(r * stride + c)] = special[std::size_t(v)];
        x[std::size_t((rows - 1 - r) * stride + c)] = special[std::size_t(v)];
        x[std::size_t((rows - 1 - r) * stride + cols - 1 - c)] = special[std::size_t(v)];
      }
      const float guard = 77.f;
      std::vector<float> t(std::size_t(rows * cols) + 3, guard);
      f8::transpose(x.data(), stride, rows, cols, t.data(), mul);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const float in = x[std::size_t(r * stride + c)], got = t[std::size_t(c * rows + r)];
          if (mul == 1.f) {
            ASSERT_EQ(bits(got), bits(in)) << "(" << r << ", " << c << ")";
            continue;
          }
          const float want = mul * in;
          if (std::isnan(want)) {
            ASSERT_TRUE(std::isnan(got)) << "(" << r << ", " << c << ")";
            continue;
          }
          ASSERT_EQ(got, want) << "(" << r << ", " << c << ")";
          ASSERT_EQ(std::signbit(got), std::signbit(want)) << "(" << r << ", " << c << ")";
        }
      for (std::size_t i = std::size_t(rows * cols); i < t.size(); ++i) ASSERT_EQ(t[i], guard) << "written past dst";
    }
}

// The row online softmax over a tile, in double, for query r's column: the reference for softmax_columns.
struct ColumnState {
  double m = -INFINITY, l = 0;
};

TEST(F32Tiles, SoftmaxColumnsMatchesTheRowOnlineSoftmaxUnderEveryMask) {
  HR_NEED_AVX512_TILES();
  struct Case {
    int64_t bk, bq, first_query, window;
  };
  const std::vector<Case> cases = {
      {64, 64, 0, 0},     // the causal diagonal tile
      {64, 64, -64, 0},   // no mask (every key visible)
      {64, 64, -40, 0},   // causal, keys partly behind the queries
      {37, 21, 3, 0},     // tails on both sides
      {64, 64, -10, 16},  // a sliding window
      {5, 64, 60, 8},     // keys seen by none of the first queries
      {64, 17, 30, 0},    // keys seen by no query of the tile
  };
  const int64_t d = 24;
  unsigned seed = 100;
  for (const Case& c : cases)
    for (int tiles = 1; tiles <= 2; ++tiles) {  // a second tile rescales what the first left
      SCOPED_TRACE(testing::Message() << "bk " << c.bk << " bq " << c.bq << " first " << c.first_query << " window "
                                      << c.window << " tiles " << tiles);
      std::vector<float> m(std::size_t(c.bq), -kInf), l(std::size_t(c.bq), 0.f);
      std::vector<float> ot = random_floats(std::size_t(d * c.bq), -1, 1, ++seed);
      std::vector<ColumnState> ref(std::size_t(c.bq));
      std::vector<double> ref_ot(ot.begin(), ot.end());
      for (int t = 0; t < tiles; ++t) {
        std::vector<float> st = random_floats(std::size_t(c.bk * c.bq), -6, 6, ++seed);
        if (c.bq > 2) st[std::size_t(c.bq + 2)] = -kInf;  // a visible -inf score gives a zero
        const std::vector<float> scores = st;
        const int64_t first = c.first_query + (t == 1 ? -c.bk : 0);  // the second tile holds earlier keys
        ft::softmax_columns(st.data(), c.bk, c.bq, first, c.window, m.data(), l.data(), ot.data(), d);
        for (int64_t r = 0; r < c.bq; ++r) {
          const auto visible = [&](int64_t jj) {
            return r >= first + jj && (c.window <= 0 || r < first + jj + c.window);
          };
          ColumnState& s = ref[std::size_t(r)];
          double mx = s.m;
          for (int64_t jj = 0; jj < c.bk; ++jj)
            if (visible(jj)) mx = std::max(mx, double(scores[std::size_t(jj * c.bq + r)]));
          double sum = 0;
          for (int64_t jj = 0; jj < c.bk; ++jj) {
            const double p = visible(jj) && mx != -INFINITY ? std::exp(scores[std::size_t(jj * c.bq + r)] - mx) : 0;
            EXPECT_NEAR(st[std::size_t(jj * c.bq + r)], p, 6e-7 * (1 + p)) << "P(" << jj << ", " << r << ")";
            sum += p;
          }
          const double alpha = mx == -INFINITY ? 1.0 : std::exp(s.m - mx);
          s.l = s.l * alpha + sum;
          s.m = mx;
          for (int64_t i = 0; i < d; ++i) ref_ot[std::size_t(i * c.bq + r)] *= alpha;
          EXPECT_EQ(double(m[std::size_t(r)]), s.m) << "m(" << r << ")";
          EXPECT_NEAR(l[std::size_t(r)], s.l, 1e-5 * (1 + s.l)) << "l(" << r << ")";
        }
      }
      for (std::size_t i = 0; i < ot.size(); ++i) ASSERT_NEAR(ot[i], ref_ot[i], 1e-6) << "O^T at " << i;
    }
}

TEST(F32Tiles, SoftmaxColumnsPropagatesNaNAndLeavesQueriesThatSawNothing) {
  HR_NEED_AVX512_TILES();
  const int64_t bk = 8, bq = 20, d = 3;
  std::vector<float> st = random_floats(std::size_t(bk * bq), -1, 1, 7);
  st[std::size_t(2 * bq + 5)] = std::numeric_limits<float>::quiet_NaN();  // key 2, query 5: visible (5 >= 2)
  st[std::size_t(6 * bq + 1)] = std::numeric_limits<float>::quiet_NaN();  // key 6, query 1: masked (1 < 6)
  std::vector<float> m(bq, -kInf), l(bq, 0.f), ot(std::size_t(d * bq), 1.f);
  ft::softmax_columns(st.data(), bk, bq, /*first_query=*/0, 0, m.data(), l.data(), ot.data(), d);
  EXPECT_TRUE(std::isnan(m[5]) && std::isnan(l[5]) && std::isnan(ot[5]));
  EXPECT_FALSE(std::isnan(m[1]) || std::isnan(l[1]));  // its NaN sat behind the mask
  for (int64_t r = 0; r < bq; ++r) {
    if (r == 5) continue;
    EXPECT_FALSE(std::isnan(ot[std::size_t(r)])) << r;
  }
  // Keys 0..7 from query 8 on only: queries 0..7 see nothing, keep m = -inf, l = 0 and their O^T column.
  std::vector<float> st2 = random_floats(std::size_t(bk * bq), -1, 1, 8);
  std::vector<float> m2(bq, -kInf), l2(bq, 0.f), ot2(std::size_t(d * bq), 2.f);
  ft::softmax_columns(st2.data(), bk, bq, /*first_query=*/8, 0, m2.data(), l2.data(), ot2.data(), d);
  for (int64_t r = 0; r < 8; ++r) {
    EXPECT_EQ(m2[std::size_t(r)], -kInf);
    EXPECT_EQ(l2[std::size_t(r)], 0.f);
    for (int64_t jj = 0; jj < bk; ++jj) EXPECT_EQ(st2[std::size_t(jj * bq + r)], 0.f);
    for (int64_t i = 0; i < d; ++i) EXPECT_EQ(ot2[std::size_t(i * bq + r)], 2.f);
  }
  EXPECT_GT(l2[8], 0.f);
}

TEST(F32Tiles, SoftmaxRowMatchesTheOnlineSoftmaxOfOneRow) {
  HR_NEED_AVX512_TILES();
  const int64_t d = 40;
  unsigned seed = 300;
  for (int64_t bk : {64, 37, 9})
    for (int64_t first : {int64_t(0), int64_t(5)})
      for (int64_t last : {bk, bk - 3, int64_t(5)})
        for (float m0 : {-kInf, 0.5f, 9.f}) {  // nothing seen yet; a max below the row's; one above it
          SCOPED_TRACE(testing::Message() << "bk " << bk << " seen [" << first << ", " << last << ") m " << m0);
          std::vector<float> s = random_floats(std::size_t(bk) + 16, -4, 4, ++seed);
          std::vector<float> o = random_floats(std::size_t(d) + 16, -1, 1, ++seed);
          const std::vector<float> s0 = s, o0 = o;
          float m = m0, l = m0 == -kInf ? 0.f : 2.5f;
          const float l0 = l;
          ft::softmax_row(s.data(), bk, first, last, m, l, o.data(), d);
          double mx = m0;
          for (int64_t j = first; j < last; ++j) mx = std::max(mx, double(s0[std::size_t(j)]));
          if (mx == -INFINITY) {  // only when nothing is visible and nothing was seen
            EXPECT_EQ(m, -kInf);
            EXPECT_EQ(l, l0);
            for (int64_t j = 0; j < bk; ++j) EXPECT_EQ(s[std::size_t(j)], 0.f);
            continue;
          }
          double sum = 0;
          for (int64_t j = 0; j < bk + 16; ++j) {
            const std::size_t at = std::size_t(j);
            const double p = j >= first && j < last ? std::exp(s0[at] - mx) : 0.0;
            if (j < bk) {
              EXPECT_NEAR(s[at], p, 6e-7 * (1 + p)) << j;
              sum += p;
            } else {
              EXPECT_EQ(s[at], s0[at]) << "past the row: " << j;
            }
          }
          const double alpha = std::exp(double(m0) - mx);
          EXPECT_EQ(double(m), mx);
          EXPECT_NEAR(l, l0 * alpha + sum, 1e-5 * (1 + l0 * alpha + sum));
          for (int64_t c = 0; c < d + 16; ++c) {
            const std::size_t at = std::size_t(c);
            if (c < d)
              EXPECT_NEAR(o[at], o0[at] * alpha, 1e-6) << c;
            else
              EXPECT_EQ(o[at], o0[at]) << "past the output row: " << c;
          }
        }
  // NaN in a visible score makes the row NaN; behind the mask it is ignored.
  std::vector<float> s(20, 0.5f), o(8, 1.f);
  s[3] = std::numeric_limits<float>::quiet_NaN();
  float m = -kInf, l = 0.f;
  ft::softmax_row(s.data(), 20, 4, 20, m, l, o.data(), 8);
  EXPECT_EQ(m, 0.5f);
  EXPECT_NEAR(l, 16.0, 1e-5);
  s.assign(20, 0.5f);
  s[3] = std::numeric_limits<float>::quiet_NaN();
  m = -kInf;
  l = 0.f;
  ft::softmax_row(s.data(), 20, 0, 20, m, l, o.data(), 8);
  EXPECT_TRUE(std::isnan(m) && std::isnan(l) && std::isnan(s[0]) && std::isnan(o[0]));
}

TEST(F32Tiles, ProbsAndGradsRowMatchTheFormulaInsideTheSeenKeysAndZeroOutside) {
  HR_NEED_AVX512_TILES();
  for (int64_t bk : {64, 37, 5})
    for (int64_t first : {int64_t(0), int64_t(3)})
      for (int64_t last : {bk, bk - 2, int64_t(3)}) {
        SCOPED_TRACE(testing::Message() << "bk " << bk << " seen [" << first << ", " << last << ")");
        std::vector<float> p = random_floats(std::size_t(bk) + 16, -3, 3, unsigned(bk + first * 7 + last));
        std::vector<float> dp = random_floats(std::size_t(bk) + 16, -1, 1, unsigned(bk * 3 + first + last));
        const std::vector<float> p0 = p, dp0 = dp;
        const float scale = 0.125f, lse = 1.75f, delta = 0.3f;
        ft::probs_and_grads_row(p.data(), dp.data(), bk, first, last, scale, lse, delta);
        for (int64_t j = 0; j < bk + 16; ++j) {
          const std::size_t at = std::size_t(j);
          if (j >= bk) {  // past the row: untouched
            EXPECT_EQ(p[at], p0[at]);
            EXPECT_EQ(dp[at], dp0[at]);
          } else if (j < first || j >= last) {
            EXPECT_EQ(p[at], 0.f) << j;
            EXPECT_EQ(dp[at], 0.f) << j;
          } else {
            const double want_p = std::exp(double(p0[at]) * scale - lse);
            EXPECT_NEAR(p[at], want_p, 6e-7 * want_p) << j;
            EXPECT_NEAR(dp[at], want_p * (double(dp0[at]) - delta) * scale, 1e-7) << j;
          }
        }
      }
}

TEST(F32Tiles, ColumnScaling) {
  HR_NEED_AVX512_TILES();
  std::vector<float> y = random_floats(std::size_t(4 * 40), -1, 1, 4), y0 = y;
  const std::vector<float> s = random_floats(37, -2, 2, 5);
  ft::scale_columns(y.data(), 4, 37, 40, s.data());
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t c = 0; c < 40; ++c) {
      const std::size_t at = std::size_t(r * 40 + c);
      EXPECT_EQ(y[at], c < 37 ? y0[at] * s[std::size_t(c)] : y0[at]);
    }
}

}  // namespace
