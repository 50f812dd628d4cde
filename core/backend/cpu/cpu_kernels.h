// Declarations of the CPU kernels (one file each family; core/backend/kernel_list.h lists them), and what the CPU
// back-end says of itself; cpu_kernels.cpp puts them in the table.
#pragma once

#include <cmath>

#include "core/backend/kernel_list.h"

namespace hr::cpu {

using namespace hr::core;  // kernels speak the core vocabulary

HR_SIZING_FUNCTIONS(HR_DECLARE_ENTRY)
HR_KERNELS(HR_DECLARE_ENTRY)

// Which way this GEMM runs at the current thread count: "brgemm", "f32 copies + brgemm" or "packed".
const char* gemm_path(const GemmDesc& d);
// GEMM plans kept (at most the 256 most recently used: shapes that vary with the batch do not pile up).
std::size_t gemm_plans_cached();
// Whether this CPU runs the attention kernels (compiled for AVX2 + FMA on x86-64).
bool attention_isa_present();
// Whether a bf16 attention runs its tile products as AVX512-BF16 dot products (attention_bf16.h): the CPU has
// AVX512-BF16 and oneDNN may use it (ONEDNN_MAX_CPU_ISA below avx512_core_bf16 turns both off, so that one
// machine runs the paths the others take). Decided once per process.
bool bf16_tiles_present();
// Whether the attention's f32 tile products (every dtype without bf16 tiles) run 16 floats wide (attention_f32.h):
// the CPU has AVX-512 and oneDNN may use it (ONEDNN_MAX_CPU_ISA below avx512_core: 8 wide, attention_f32x8.h).
bool avx512_tiles_present();
// Whether those products run on AMX tiles where their shapes are whole tiles: bf16_tiles_present(), the CPU has
// AMX-BF16, oneDNN may use it (ONEDNN_MAX_CPU_ISA at least avx512_core_amx) and the kernel grants this process the
// tile data (Linux's arch_prctl(ARCH_REQ_XCOMP_PERM), which oneDNN asks for too). Decided once per process.
bool amx_tiles_present();

// out[i] = exp(in[i]) for n floats (out may be in): Eigen's vectorized exp, compiled for AVX2 + FMA
// (vector_math.cpp), called only where attention_isa_present().
void exp_floats_avx2(const float* in, float* out, int64_t n);
// The activations over Eigen's vectorized exp, tanh and erf (vector_math.cpp, AVX2 + FMA): the kernel table's
// unary entries where attention_isa_present(), elementwise.cpp's scalar kernels elsewhere.
void unary_forward_avx2(UnaryOp op, const Tensor& x, const Tensor& bias, const Tensor& y);
void unary_backward_avx2(UnaryOp op, const Tensor& x, const Tensor& dy, const Tensor& dx);
// The same on any CPU: the vectorized exp where the CPU has it, else std::exp.
inline void exp_floats(const float* in, float* out, int64_t n) {
  static const bool vectorized = attention_isa_present();
  if (vectorized) {
    exp_floats_avx2(in, out, n);
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = std::exp(in[i]);
}

}  // namespace hr::cpu
