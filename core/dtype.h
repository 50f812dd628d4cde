// Element types carried by tensors at run time, and exact f32 <-> bf16/f16 conversion (round to nearest even).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace hr::core {

enum class DType : uint8_t { F32, BF16, F16, I32, I64, U8 };

std::size_t dtype_size(DType t);
const char* dtype_name(DType t);             // "f32", "bf16", ...
DType parse_dtype(const std::string& name);  // throws naming the allowed values
inline bool is_float(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F16;
}

struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16 to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x0040u)};  // quiet NaN, sign kept
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return bf16{uint16_t((u + rounding) >> 16)};
}
inline float to_f32(bf16 h) {
  return bits_f32(uint32_t(h.bits) << 16);
}

inline f16 to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return f16{uint16_t(sign | 0x7e00u | ((abs >> 13) & 0x1ffu))};  // NaN stays NaN
  if (abs >= 0x477ff000u) return f16{uint16_t(sign | 0x7c00u)};                          // rounds to >= 65520: inf
  if (abs < 0x38800000u) {                    // result is subnormal or zero: scale to units of 2^-24 and round
    if (abs < 0x33000000u) return f16{sign};  // below half the smallest subnormal
    uint32_t e = abs >> 23;
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e;  // 113 - e + 13
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return f16{uint16_t(sign | q)};
  }
  uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u);  // round to nearest even at bit 13
  r -= 0x38000000u;                                // rebias exponent 127 -> 15
  return f16{uint16_t(sign | (r >> 13))};
}
inline float to_f32(f16 h) {
  uint32_t sign = uint32_t(h.bits & 0x8000u) << 16;
  uint32_t e = (h.bits >> 10) & 0x1fu;
  uint32_t m = h.bits & 0x3ffu;
  if (e == 0x1f) return bits_f32(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    if (m == 0) return bits_f32(sign);
    float v = float(m) * 5.9604644775390625e-08f;  // m * 2^-24
    return sign ? -v : v;
  }
  return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

// Loads/stores of a float through a runtime-typed element pointer; kernels use the typed versions below.
template <typename T>
inline float load(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, float>)
    return p[i];
  else
    return to_f32(p[i]);
}
template <typename T>
inline void store(T* p, int64_t i, float v) {
  if constexpr (std::is_same_v<T, float>)
    p[i] = v;
  else if constexpr (std::is_same_v<T, bf16>)
    p[i] = to_bf16(v);
  else
    p[i] = to_f16(v);
}

}  // namespace hr::core
