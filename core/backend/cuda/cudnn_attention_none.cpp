// The CUDA back-end without cuDNN's frontend: every attention takes the own kernel (attention.cu).
#include "core/backend/cuda/cudnn_attention.h"

namespace hr::cuda {

void create_cudnn_handle() {}
bool start_cudnn(CudnnCreate) {
  return false;
}
void stop_cudnn() {}
void set_cudnn_attention_enabled(bool) {}
bool cudnn_attention_forward(const core::AttentionArgs&) {
  return false;
}
bool cudnn_attention_backward(const core::AttentionArgs&) {
  return false;
}
const char* cudnn_attention_version() {
  return "not built in (no cuDNN frontend headers at configure time)";
}

}  // namespace hr::cuda
