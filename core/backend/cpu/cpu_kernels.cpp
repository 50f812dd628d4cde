// The CPU backend's kernel table, registered from core/backend/kernel_list.h; the entries that are another's
// kernel on the CPU (one stream: asynchronous and side copies are copies; a KV cache's attention is the forward).
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

void copy_async(const Tensor& dst, const Tensor& src) {
  copy(dst, src);
}
void copy_side(const Tensor& dst, const Tensor& src) {
  copy(dst, src);  // one stream: the copy has arrived when it returns
}
void side_sync() {}
void attention_cached(const AttentionArgs& a) {
  attention_forward(a);  // `past` set: the same tiles, each row's keys cut at its position
}

}  // namespace hr::cpu

namespace hr::core {

const Kernels& cpu_kernels() {
  static const Kernels k = [] {
    Kernels t;
    t.backend = "CPU";
#define HR_REGISTER(name, ret, params) t.name = cpu::name;
    HR_SIZING_FUNCTIONS(HR_REGISTER)
    HR_KERNELS(HR_REGISTER)
#undef HR_REGISTER
    if (cpu::attention_isa_present()) {  // the activations over Eigen's vectorized exp, tanh and erf
      t.unary_forward = cpu::unary_forward_avx2;
      t.unary_backward = cpu::unary_backward_avx2;
    } else {  // attention and SwiGLU are compiled for AVX2 + FMA only (core/CMakeLists.txt): a named error
              // instead of an illegal instruction
      t.attention_forward = t.attention_backward = t.attention_cached = [](const AttentionArgs&) {
        throw Error("[attention] the CPU attention kernel needs AVX2 and FMA (x86-64-v3); this CPU has neither");
      };
      t.swiglu_forward = [](const Tensor&, const Tensor&, const Tensor&) {
        throw Error("[swiglu] the CPU SwiGLU kernel needs AVX2 and FMA (x86-64-v3); this CPU has neither");
      };
      t.swiglu_backward = [](const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
        throw Error("[swiglu_backward] the CPU SwiGLU kernel needs AVX2 and FMA (x86-64-v3); this CPU has neither");
      };
    }
    return t;
  }();
  return k;
}

}  // namespace hr::core
