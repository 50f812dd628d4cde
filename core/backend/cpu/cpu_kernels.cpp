// The CPU backend's kernel table, registered from core/backend/kernel_list.h; the entries that are another's
// kernel on the CPU (one stream: asynchronous and side copies are copies; a KV cache's attention is the forward).
#include "core/backend/cpu/cpu_kernels.h"

#include <oneapi/dnnl/dnnl.hpp>

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

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

bool bf16_tiles_present() {
#if defined(__x86_64__) && defined(HR_HAVE_BF16_TILES)
  static const bool present = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
                              __builtin_cpu_supports("avx512vl") &&
                              dnnl::get_effective_cpu_isa() >= dnnl::cpu_isa::avx512_core_bf16;
  return present;
#else
  return false;
#endif
}

bool avx512_tiles_present() {
#if defined(__x86_64__) && defined(HR_HAVE_BF16_TILES)
  static const bool present =
      __builtin_cpu_supports("avx512f") && dnnl::get_effective_cpu_isa() >= dnnl::cpu_isa::avx512_core;
  return present;
#else
  return false;
#endif
}

bool amx_tiles_present() {
#if defined(__x86_64__) && defined(HR_HAVE_BF16_TILES)
  static const bool present = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!bf16_tiles_present() || !__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    const bool amx_bf16 = edx & (1u << 22), amx_tile = edx & (1u << 24);
    if (!amx_bf16 || !amx_tile || dnnl::get_effective_cpu_isa() < dnnl::cpu_isa::avx512_core_amx) return false;
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;  // <asm/prctl.h>, XFEATURE_XTILEDATA
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
  }();
  return present;
#else
  return false;
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
