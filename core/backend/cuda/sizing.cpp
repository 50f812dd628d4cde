// Workspace sizes of the CUDA back-end, in plain C++ so every build (and the meta device) can plan a GPU run.
// They are exactly what the CUDA kernels are given: cuBLASLt's workspace (by architecture), the widened GEMM
// operands, cuDNN's fused-attention workspace or the own attention backward's delta (attention.cu), the column
// sums' partials (norm weight gradients, bias gradients, Adafactor's column moments). The rules the kernels share
// are in sizing_rules.h.
#include <algorithm>
#include <atomic>

#include "core/backend/cuda/attention_path.h"
#include "core/backend/cuda/bitonic.h"
#include "core/backend/cuda/sizing_rules.h"
#include "core/backend/kernels.h"
#include "core/memory/device_memory.h"

namespace hr::core {

namespace {

std::atomic<CudnnAttentionQuery> g_cudnn_query{nullptr};

std::size_t align(std::size_t n) {
  return cuda::align_workspace(n);
}

}  // namespace

// The sizing functions of kernel_list.h for the CUDA back-end.
namespace sizing {

// cuBLASLt's workspace for the architecture this context sizes for (every GEMM call gets it whole).
std::size_t gemm_scratchpad_bytes(const GemmDesc&) {
  return cuda::cublas_workspace_bytes(sizing_cuda_arch());
}

// cuBLAS wants one input type: operands of two dtypes are staged in f32 when C is f32, else in C's 16-bit type
// (an f32-input GEMM has no 16-bit output).
std::size_t gemm_workspace_bytes(const GemmDesc& d) {
  std::size_t bytes = 0;
  if (d.m == 0 || d.n == 0 || d.k == 0 || d.batch == 0) return 0;
  if (d.a_dtype != d.b_dtype) {
    const DType common = d.c_dtype;
    const std::size_t e = core::dtype_size(common);
    if (d.a_dtype != common) bytes += align(std::size_t((d.a_strides[0] ? d.batch : 1) * d.m * d.k) * e);
    if (d.b_dtype != common) bytes += align(std::size_t((d.b_strides[0] ? d.batch : 1) * d.k * d.n) * e);
  }
  return bytes;
}

std::size_t own_attention_bytes(const AttentionDesc& a, AttentionPass pass) {
  if (pass != AttentionPass::Backward) return 0;
  return align(std::size_t(a.batch * a.q_heads * a.q_len) * 4);  // delta = rowsum(dO * O), f32
}

// On a GPU, cuDNN's own figure for the shapes whose graph builds there. Without one (planning for a GPU
// elsewhere), a shape cuDNN admits gets the larger of cuDNN's rule and the own kernel's need: either kernel
// runs within it.
std::size_t attention_workspace_bytes(const AttentionDesc& a, AttentionPass pass) {
  const std::size_t own = own_attention_bytes(a, pass);
  // A KV cache's queries take the own kernel: no cuDNN graph is built (or asked about) for them.
  if (!cudnn_attention_admits(a, pass)) return own;
  if (CudnnAttentionQuery query = g_cudnn_query.load()) {
    std::size_t workspace = 0;
    return query(a, pass, &workspace) ? std::max(workspace, own) : own;
  }
  return std::max(own, cudnn_attention_rule_workspace(a, pass));
}

// The weight and the bias gradient's column sums at once.
std::size_t norm_workspace_bytes(int64_t rows, int64_t cols) {
  return cuda::column_sums_workspace_bytes(rows, cols, 2);
}

std::size_t column_sums_workspace_bytes(int64_t rows, int64_t cols) {
  return cuda::column_sums_workspace_bytes(rows, cols, 1);
}

// The sorted (id, position) keys of the embedding backward, padded for the bitonic network.
std::size_t embedding_workspace_bytes(int64_t ids) {
  return ids > 0 ? align(std::size_t(cuda::bitonic_length(ids)) * sizeof(uint64_t)) : 0;
}

}  // namespace sizing

bool cudnn_attention_admits(const AttentionDesc& d, AttentionPass pass) {
  return pass != AttentionPass::Cached && (d.dtype == DType::BF16 || d.dtype == DType::F16) && d.head_dim % 8 == 0 &&
         d.head_dim > 0 && d.head_dim <= 128 && d.batch > 0 && d.q_len > 0 && d.kv_len > 0 && !d.windowed();
}

std::size_t cudnn_attention_rule_workspace(const AttentionDesc& d, AttentionPass pass) {
  if (pass != AttentionPass::Backward) return 0;
  const std::size_t rows = std::size_t(d.batch * d.q_heads * d.q_len);
  return align(rows * std::size_t(d.head_dim) * 4) + align(rows * 4);
}

namespace {
thread_local AttentionKernel t_last_attention = AttentionKernel::None;
}

void note_attention_kernel(AttentionKernel kernel) {
  t_last_attention = kernel;
}
AttentionKernel last_attention_kernel() {
  return t_last_attention;
}
const char* attention_kernel_name(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::None:
      return "none";
    case AttentionKernel::Cudnn:
      return "cuDNN";
    case AttentionKernel::Tiled:
      return "own tiled";
    case AttentionKernel::Rows:
      return "own per-row";
  }
  return "?";
}

void set_cudnn_attention_query(CudnnAttentionQuery query) {
  g_cudnn_query.store(query);
}
CudnnAttentionQuery cudnn_attention_query() {
  return g_cudnn_query.load();
}

const Kernels& cuda_sizing_kernels() {
  static const Kernels k = [] {
    Kernels t;
    t.backend = "CUDA";
    t.gemm_mixing = GemmMixing::NarrowToOutput;
    t.cross_entropy_chunk_bytes = cuda::kCrossEntropyChunkBytes;
    // Whole chunks: the cut products have not run on a GPU.
    t.cross_entropy_row_grain = 0;
#define HR_REGISTER(name, ret, params) t.name = sizing::name;
    HR_SIZING_FUNCTIONS(HR_REGISTER)
#undef HR_REGISTER
    return t;
  }();
  return k;
}

}  // namespace hr::core
