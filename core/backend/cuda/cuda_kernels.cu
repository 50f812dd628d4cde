// The CUDA back-end's kernel table: GEMM (cuBLAS), copies, element-wise kernels and the attention forward (with
// a KV cache too); the rest is not there yet.
#include "core/backend/cuda/cuda_kernels.h"
#include "core/backend/kernels.h"

namespace hr::core {

const Kernels& cuda_kernels() {
  static const Kernels k = [] {
    Kernels t = cuda_sizing_kernels();
    t.fill = cuda::fill;
    t.copy = cuda::copy;
    t.gemm = cuda::gemm;
    t.dequantize = cuda::dequantize;
    t.axpby = cuda::axpby;
    t.dropout = cuda::dropout;
    t.mul = cuda::mul;
    t.unary_forward = cuda::unary_forward;
    t.unary_backward = cuda::unary_backward;
    t.swiglu_forward = cuda::swiglu_forward;
    t.swiglu_backward = cuda::swiglu_backward;
    t.broadcast_scalar = cuda::broadcast_scalar;
    t.attention_forward = cuda::attention_forward;
    t.attention_cached = cuda::attention_forward;
    return t;
  }();
  return k;
}

}  // namespace hr::core
