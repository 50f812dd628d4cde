// Declarations of the CPU kernels (one file each family; core/backend/kernel_list.h lists them), and what the CPU
// back-end says of itself; cpu_kernels.cpp puts them in the table.
#pragma once

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

}  // namespace hr::cpu
