// cuDNN's fused attention on the CUDA back-end (cudnn_attention.cpp; cudnn_attention_none.cpp where the build
// has no cuDNN frontend). Each call runs cuDNN for a shape it takes and returns true, or returns false and leaves
// the shape to the own kernel (attention.cu).
#pragma once

#include <string>

#include "core/ops/params.h"

namespace hr::cuda {

// Creates the cuDNN handle on the current device and registers the sizing query (attention_path.h). A cuDNN that
// cannot start leaves the fused path off (a warning on stderr): the own kernels run every attention.
void create_cudnn_handle();
// The same with `create` in cudnnCreate's place (tests start it with one that fails): it makes the handle (a
// cudnnHandle_t) or says why not. True when cuDNN started; a handle that exists already is kept. stop_cudnn
// destroys it (and the sizing query goes), so that a test can start it again.
using CudnnCreate = bool (*)(void** handle, std::string* why);
bool start_cudnn(CudnnCreate create);
void stop_cudnn();
// On by default; HR_CUDNN_ATTENTION=0 starts a process with it off. Off, every shape takes the own kernel.
void set_cudnn_attention_enabled(bool on);
bool cudnn_attention_forward(const core::AttentionArgs& a);
bool cudnn_attention_backward(const core::AttentionArgs& a);
// "cuDNN <version>, frontend <version>", or why fused attention is not built in.
const char* cudnn_attention_version();

}  // namespace hr::cuda
