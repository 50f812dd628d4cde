// Which kernel a CUDA attention takes, shared by the kernels and the sizing so that the workspace an op allocates
// is the one its kernel uses. cuDNN's fused attention (cudnn_attention.cpp) takes the shapes its flash kernels
// support; the back-end's own kernel (attention.cu) takes the rest, f32 and KV caches included.
#pragma once

#include <cstddef>

#include "core/ops/params.h"

namespace hr::core {

// cuDNN 9's rule for its fused (flash) attention: bf16 or f16, head_dim a multiple of 8 up to 128, no KV
// cache (AttentionPass::Cached), and no sliding window that hides a key (the own kernels apply the window; cuDNN's
// diagonal band has never run here on a GPU, so it is not used). A shape it admits may still fail to build on a given
// GPU; the query below then says no.
bool cudnn_attention_admits(const AttentionDesc& d, AttentionPass pass);

// What cuDNN reports as the graph's workspace, from the sizes its flash backward keeps in f32 (dQ's accumulator
// and the softmax row sums): the figure a machine without a GPU plans with. Forward needs none.
std::size_t cudnn_attention_rule_workspace(const AttentionDesc& d, AttentionPass pass);

// Set by the CUDA back-end once its cuDNN handle exists on a GPU: true and cuDNN's own workspace figure when
// the graph for the shape builds there, false when the shape takes the back-end's own kernel.
using CudnnAttentionQuery = bool (*)(const AttentionDesc& d, AttentionPass pass, std::size_t* workspace);
void set_cudnn_attention_query(CudnnAttentionQuery query);
CudnnAttentionQuery cudnn_attention_query();

// The kernel the last CUDA attention call on this thread ran: cuDNN's fused graph, the own tiled kernels
// (training shapes) or the own per-query-row kernel (a KV cache). The op table reports it per case, and checks
// that a shape cuDNN takes did run there.
enum class AttentionKernel : uint8_t { None, Cudnn, Tiled, Rows };
void note_attention_kernel(AttentionKernel kernel);
AttentionKernel last_attention_kernel();
const char* attention_kernel_name(AttentionKernel kernel);

}  // namespace hr::core
