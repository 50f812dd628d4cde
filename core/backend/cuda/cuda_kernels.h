// Declarations of the CUDA kernels (core/backend/kernel_list.h lists them; the sizing functions are sizing.cpp's);
// cuda_kernels.cu puts them in the table.
#pragma once

#include "core/backend/kernel_list.h"

namespace hr::cuda {

using namespace hr::core;

// Creates the library handles the kernels use (cuBLAS, cuBLASLt, cuDNN) on the current device, if not yet: start-up
// measures what they take.
void create_library_handles();

// HR_OP_PROFILE=FILE set: times every kernel-table call of this thread on the GPU, by op, into FILE at exit
// (op_profile.cpp). Called with the library handles; does nothing without the variable.
void start_op_profile();

HR_KERNELS(HR_DECLARE_ENTRY)

}  // namespace hr::cuda
