// The CUDA back-end's kernel table: every kernel of core/backend/kernels.h, each the twin of its CPU kernel.
#include "core/backend/cuda/cuda_kernels.h"
#include "core/backend/kernels.h"

namespace hr::core {

const Kernels& cuda_kernels() {
  static const Kernels k = [] {
    Kernels t = cuda_sizing_kernels();
    t.fill = cuda::fill;
    t.copy = cuda::copy;
    t.copy_async = cuda::copy_async;
    t.copy_side = cuda::copy_side;
    t.side_sync = cuda::side_sync;
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
    t.norm_forward = cuda::norm_forward;
    t.norm_backward = cuda::norm_backward;
    t.softmax_forward = cuda::softmax_forward;
    t.softmax_backward = cuda::softmax_backward;
    t.rope = cuda::rope;
    t.embedding_forward = cuda::embedding_forward;
    t.embedding_backward = cuda::embedding_backward;
    t.patchify = cuda::patchify;
    t.attention_forward = cuda::attention_forward;
    t.attention_backward = cuda::attention_backward;
    t.attention_cached = cuda::attention_forward;
    t.cross_entropy_forward = cuda::cross_entropy_forward;
    t.cross_entropy_backward = cuda::cross_entropy_backward;
    t.sum_leading = cuda::sum_leading;
    t.reduce_all = cuda::reduce_all;
    t.adamw_update = cuda::adamw_update;
    t.sgd_update = cuda::sgd_update;
    t.adafactor_update = cuda::adafactor_update;
    return t;
  }();
  return k;
}

}  // namespace hr::core
