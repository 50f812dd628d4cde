// The activations' constants, shared by the scalar kernels (elementwise.cpp) and the vectorized ones
// (vector_math.cpp). Constants only: an inline function here would be compiled for AVX2 in one file and not in the
// other, and the linker could keep either copy.
#pragma once

namespace hr::cpu {

constexpr float kSqrt2Inv = 0.70710678118654752f;
constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
constexpr float kGeluTanhCubic = 0.044715f;
constexpr float kQuickGeluAlpha = 1.702f;

}  // namespace hr::cpu
