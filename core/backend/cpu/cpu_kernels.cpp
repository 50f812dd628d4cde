// The CPU backend's kernel table.
#include "core/backend/cpu/cpu_kernels.h"

#include "core/backend/cpu/cpu_common.h"
#include "core/backend/kernels.h"

namespace hr::cpu {

bool attention_isa_present() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return true;
#endif
}

}  // namespace hr::cpu

namespace hr::core {

const Kernels& cpu_kernels() {
  static const Kernels k = [] {
    Kernels t;
    t.backend = "CPU";
    t.gemm_workspace_bytes = cpu::gemm_workspace_bytes;
    t.gemm_scratchpad_bytes = cpu::gemm_scratchpad_bytes;
    t.attention_workspace_bytes = cpu::attention_workspace_bytes;
    t.norm_workspace_bytes = cpu::norm_workspace_bytes;
    t.column_sums_workspace_bytes = cpu::column_sums_workspace_bytes;
    t.embedding_workspace_bytes = cpu::embedding_workspace_bytes;
    t.fill = cpu::fill;
    t.copy = cpu::copy;
    t.copy_async = cpu::copy;
    t.copy_side = cpu::copy;  // one stream: the copy has arrived when it returns
    t.side_sync = [] {};
    t.gemm = cpu::gemm;
    t.dequantize = cpu::dequantize;
    t.axpby = cpu::axpby;
    t.dropout = cpu::dropout;
    t.mul = cpu::mul;
    t.unary_forward = cpu::unary_forward;
    t.unary_backward = cpu::unary_backward;
    t.swiglu_forward = cpu::swiglu_forward;
    t.swiglu_backward = cpu::swiglu_backward;
    t.norm_forward = cpu::norm_forward;
    t.norm_backward = cpu::norm_backward;
    t.softmax_forward = cpu::softmax_forward;
    t.softmax_backward = cpu::softmax_backward;
    t.rope = cpu::rope;
    t.embedding_forward = cpu::embedding_forward;
    t.embedding_backward = cpu::embedding_backward;
    t.patchify = cpu::patchify;
    if (cpu::attention_isa_present()) {
      t.attention_forward = cpu::attention_forward;
      t.attention_backward = cpu::attention_backward;
      t.attention_cached = cpu::attention_forward;
    } else {  // compiled for AVX2 + FMA (core/CMakeLists.txt): a named error instead of an illegal instruction
      t.attention_forward = t.attention_backward = t.attention_cached = [](const AttentionArgs&) {
        throw Error("[attention] the CPU attention kernel needs AVX2 and FMA (x86-64-v3); this CPU has neither");
      };
    }
    t.cross_entropy_forward = cpu::cross_entropy_forward;
    t.cross_entropy_backward = cpu::cross_entropy_backward;
    t.sum_leading = cpu::sum_leading;
    t.reduce_all = cpu::reduce_all;
    t.broadcast_scalar = cpu::broadcast_scalar;
    t.adamw_update = cpu::adamw_update;
    t.sgd_update = cpu::sgd_update;
    t.adafactor_update = cpu::adafactor_update;
    return t;
  }();
  return k;
}

}  // namespace hr::core
