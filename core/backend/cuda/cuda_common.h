// Host-side helpers of the CUDA kernels: dtype dispatch to CUDA element types.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/backend/cuda/cuda_check.h"
#include "core/tensor.h"

namespace hr::cuda {

using core::DType;
using core::Tensor;

template <typename F>
void dispatch_float(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::F32:
      f(float{});
      return;
    case DType::BF16:
      f(__nv_bfloat16{});
      return;
    case DType::F16:
      f(__half{});
      return;
    default:
      throw Error(str("[", op, "] unsupported dtype ", core::dtype_name(t), " on CUDA"));
  }
}

}  // namespace hr::cuda
