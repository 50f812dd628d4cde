// dtype conversions: bf16/f16 round to nearest even, NaN/inf preserved, exhaustive f16 round trip.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "core/check.h"
#include "core/dtype.h"

using namespace hr::core;

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::BF16);
  EXPECT_THROW(parse_dtype("f8"), hr::Error);
}

TEST(DType, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between two bf16 values (1 and 1 + 2^-7): ties go to the even mantissa (1).
  EXPECT_EQ(to_bf16(1.0f + std::ldexp(1.f, -8)).bits, to_bf16(1.0f).bits);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up.
  EXPECT_EQ(to_f32(to_bf16(1.0f + 3 * std::ldexp(1.f, -8))), 1.0f + std::ldexp(1.f, -6));
  // Just above halfway rounds up.
  EXPECT_EQ(to_f32(to_bf16(1.0f + std::ldexp(1.f, -8) + std::ldexp(1.f, -20))), 1.0f + std::ldexp(1.f, -7));
  EXPECT_EQ(to_f32(to_bf16(-2.5f)), -2.5f);
}

TEST(DType, Bf16KeepsSpecials) {
  EXPECT_TRUE(std::isnan(to_f32(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload lives only in the low bits must not round into infinity.
  EXPECT_TRUE(std::isnan(to_f32(to_bf16(bits_f32(0x7f800001u)))));
  EXPECT_EQ(to_f32(to_bf16(INFINITY)), INFINITY);
  EXPECT_EQ(to_f32(to_bf16(-INFINITY)), -INFINITY);
  EXPECT_EQ(to_bf16(-0.0f).bits, 0x8000);
  // The largest float rounds to infinity in bf16, as round-to-nearest-even requires.
  EXPECT_EQ(to_f32(to_bf16(std::numeric_limits<float>::max())), INFINITY);
}

TEST(DType, F16ExhaustiveRoundTrip) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    f16 h{uint16_t(b)};
    float f = to_f32(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(to_f32(to_f16(f))));
      continue;
    }
    ASSERT_EQ(to_f16(f).bits, h.bits) << "bits " << b;
  }
}

TEST(DType, F16MatchesCompilerConversion) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 2000000; ++i) {
    float f = bits_f32(bits(rng));
    if (std::isnan(f)) continue;
    _Float16 ref = static_cast<_Float16>(f);
    uint16_t rb;
    std::memcpy(&rb, &ref, 2);
    ASSERT_EQ(to_f16(f).bits, rb) << "float bits " << f32_bits(f);
  }
  // Halfway cases: 1 + 2^-11 ties to 1; 2049 ties to 2048; 65520 overflows to inf; subnormal ties.
  EXPECT_EQ(to_f32(to_f16(1.f + std::ldexp(1.f, -11))), 1.f);
  EXPECT_EQ(to_f32(to_f16(2049.f)), 2048.f);
  EXPECT_EQ(to_f32(to_f16(65520.f)), INFINITY);
  EXPECT_EQ(to_f32(to_f16(65519.f)), 65504.f);
  EXPECT_EQ(to_f16(std::ldexp(1.f, -25)).bits, 0);  // half the smallest subnormal: ties to 0
  EXPECT_EQ(to_f16(std::ldexp(3.f, -25)).bits, 2);  // 1.5 subnormal units: ties to even (2)
  EXPECT_TRUE(std::isnan(to_f32(to_f16(NAN))));
}
