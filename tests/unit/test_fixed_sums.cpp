// The CPU's order-fixed sums (core/backend/cpu/cpu_common.h): sums in lanes taken together keep each sum's bits, and
// a whole tensor's sum of squares (the gradient norm's) is the documented order's (64 chunks, each in 8 lanes, then
// the chunks in order) on any thread count. Each is checked against plain loops here.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/backend/cpu/cpu_common.h"
#include "core/ops/reduce.h"

using hr::core::Device;
using hr::core::DType;
using hr::core::Tensor;

namespace {

// Values over many magnitudes, so that a sum's bits depend on its order.
std::vector<float> spread_values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> ex(-20, 20);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(nd(rng), ex(rng));
  return v;
}

// sum_in_lanes' order, written out: element i in lane (i - begin) % 8, the lanes added pairwise at the end.
double lanes_reference(const std::vector<float>& v, int64_t begin, int64_t end, bool squares) {
  double lane[8] = {};
  for (int64_t i = begin; i < end; ++i) {
    const double x = v[std::size_t(i)];
    lane[(i - begin) % 8] += squares ? x * x : x;
  }
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

}  // namespace

// Four sums in lockstep, of unequal lengths (empty, shorter than the 8 lanes, not a multiple of them, and one
// stretch past the others), each the bits of its own sum in lanes.
TEST(FixedSums, SumsTakenTogetherKeepEachSumsBits) {
  const std::vector<float> v = spread_values(1000, 1);
  const int64_t cases[][2][4] = {{{0, 100, 200, 300}, {100, 200, 300, 400}},
                                 {{0, 5, 9, 9}, {5, 9, 9, 30}},
                                 {{0, 131, 264, 397}, {131, 264, 397, 1000}},
                                 {{3, 3, 17, 500}, {400, 10, 18, 999}}};
  for (const auto& c : cases) {
    const int64_t(&begin)[4] = c[0];
    const int64_t(&end)[4] = c[1];
    double together[4];
    hr::cpu::sums_in_lanes(
        begin, end, [&](int g, int64_t i) { return double(v[std::size_t(i)]) * (g + 1); }, together);
    for (int g = 0; g < 4; ++g) {
      const double alone =
          hr::cpu::sum_in_lanes(begin[g], end[g], [&](int64_t i) { return double(v[std::size_t(i)]) * (g + 1); });
      EXPECT_EQ(together[g], alone) << "sum " << g << " of [" << begin[g] << ", " << end[g] << ")";
    }
  }
}

// The gradient norm of a tensor is the root of the fixed order's sum of squares, computed here with plain loops,
// whatever the thread count; the plain sum is the fixed order's sum.
TEST(FixedSums, WholeTensorSumsFollowTheFixedOrderOnAnyThreadCount) {
  const int saved = omp_get_max_threads();
  for (const int64_t n : {int64_t(7), int64_t(4095), int64_t(70001)}) {
    const std::vector<float> v = spread_values(std::size_t(n), unsigned(n));
    for (const bool squares : {true, false}) {
      double want = 0.0;
      for (int64_t c = 0; c < hr::cpu::kFixedChunks; ++c)
        want += lanes_reference(v, n * c / hr::cpu::kFixedChunks, n * (c + 1) / hr::cpu::kFixedChunks, squares);
      const Tensor t = Tensor::from_floats(v, {n}, DType::F32, Device::cpu());
      for (const int threads : {1, 2, 3}) {
        omp_set_num_threads(threads);
        // global_norm adds each tensor's f32 sum of squares onto zero, then takes the root
        const float got = (squares ? hr::core::global_norm({t}) : hr::core::sum(t)).to_floats()[0];
        EXPECT_EQ(got, squares ? std::sqrt(float(want)) : float(want))
            << n << " elements, " << (squares ? "sum of squares" : "sum") << ", " << threads << " threads";
      }
    }
  }
  omp_set_num_threads(saved);
}
