// The kernel table: every kernel a backend may provide (listed once, in kernel_list.h). An op asks its device's
// table; a null entry means "not supported on this backend" and the op says so by name. Outputs and workspaces
// are allocated by the op before the call, so kernels never allocate and the meta device needs no kernels at all.
#pragma once

#include <utility>
#include <vector>

#include "core/backend/kernel_list.h"

namespace hr::core {

// How a GEMM of two operand dtypes computes: the CPU widens both to f32, cuBLAS stages the odd one in the output's
// dtype first (core/backend/cuda/gemm.cu). An op that can hand it one dtype instead (the cross-entropy's logit
// gradient, cast as the kernel writes it) asks.
enum class GemmMixing : uint8_t { WidenToF32, NarrowToOutput };

struct Kernels {
  const char* backend = "";
  // Facts of the back-end that ops plan by (the meta device mirrors them like the sizing functions).
  GemmMixing gemm_mixing = GemmMixing::WidenToF32;
  std::size_t cross_entropy_chunk_bytes = std::size_t(32) << 20;  // f32 logits per chunk of the fused loss
  // The grain, in rows, that the loss's chunk where the labelled rows end cuts its products to (0: whole chunks).
  int64_t cross_entropy_row_grain = 64;
  // Every sizing function and kernel of core/backend/kernel_list.h, null where a back-end does not have it.
  HR_SIZING_FUNCTIONS(HR_TABLE_FIELD)
  HR_KERNELS(HR_TABLE_FIELD)
};

// Each entry of the lists by name, and whether `k` has it: for the check that every back-end registers every
// kernel, and for reports.
std::vector<std::pair<const char*, bool>> kernel_entries(const Kernels& k);

const Kernels& cpu_kernels();
// Throws "[cuda] no CUDA back-end in this build" when built without CUDA.
const Kernels& cuda_kernels();
// The CUDA backend's workspace-size functions only: plain C++, in every build, so meta can mirror a GPU.
const Kernels& cuda_sizing_kernels();
// The table for `device`; meta has none (its ops only allocate).
const Kernels* kernels_for(Device device);
// Workspace sizes follow the backend a device runs, or for meta its target.
const Kernels& sizing_kernels(Device device);
const Kernels& sizing_kernels(Backend backend);

}  // namespace hr::core
