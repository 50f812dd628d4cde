// The CUDA back-end's kernel table: the sizing functions (sizing.cpp) and every kernel of
// core/backend/kernel_list.h, each the twin of its CPU kernel.
#include "core/backend/cuda/cuda_kernels.h"
#include "core/backend/kernels.h"

namespace hr::cuda {

void attention_cached(const AttentionArgs& a) {
  attention_forward(a);  // with `past` set it takes the KV cache's kernel
}

}  // namespace hr::cuda

namespace hr::core {

const Kernels& cuda_kernels() {
  static const Kernels k = [] {
    Kernels t = cuda_sizing_kernels();
#define HR_REGISTER(name, ret, params) t.name = cuda::name;
    HR_KERNELS(HR_REGISTER)
#undef HR_REGISTER
    return t;
  }();
  return k;
}

}  // namespace hr::core
