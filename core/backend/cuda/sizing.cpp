// Workspace sizes of the CUDA back-end, in plain C++ so every build (and the meta device) can plan a GPU run.
// They are exactly what the CUDA kernels are given: cuBLASLt's workspace, the widened GEMM operands, cuDNN's
// fused-attention workspace or the own attention backward's delta (attention.cu), the norm weight-gradient
// partials (norm.cu).
#include <algorithm>
#include <atomic>

#include "core/backend/cuda/attention_path.h"
#include "core/backend/kernels.h"

namespace hr::core {

namespace {

constexpr std::size_t kCublasWorkspace = std::size_t(4) << 20;  // per GEMM call, as cublasSetWorkspace is given
constexpr int64_t kNormRowsPerPartial = 32;                     // rows summed per weight-gradient partial

std::size_t align(std::size_t n) {
  return (n + 255) / 256 * 256;
}

std::size_t gemm_scratchpad(const GemmDesc&) {
  return kCublasWorkspace;
}

// cuBLAS wants one input type: operands of two dtypes are staged in f32 when C is f32, else in C's 16-bit type
// (an f32-input GEMM has no 16-bit output).
std::size_t gemm_bytes(const GemmDesc& d) {
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

std::atomic<CudnnAttentionQuery> g_cudnn_query{nullptr};

std::size_t own_attention_bytes(const AttentionDesc& a, bool backward) {
  if (!backward) return 0;
  return align(std::size_t(a.batch * a.q_heads * a.q_len) * 4);  // delta = rowsum(dO * O), f32
}

// On a GPU, cuDNN's own figure for the shapes whose graph builds there. Without one (planning for a GPU
// elsewhere), a shape cuDNN admits gets the larger of cuDNN's rule and the own kernel's need: either kernel
// runs within it.
std::size_t attention_bytes(const AttentionDesc& a, bool backward) {
  const std::size_t own = own_attention_bytes(a, backward);
  if (!cudnn_attention_admits(a, false)) return own;
  if (CudnnAttentionQuery query = g_cudnn_query.load()) {
    std::size_t workspace = 0;
    return query(a, backward, &workspace) ? std::max(workspace, own) : own;
  }
  return std::max(own, cudnn_attention_rule_workspace(a, backward));
}

std::size_t norm_bytes(int64_t rows, int64_t cols) {
  const int64_t partials = std::max<int64_t>(1, (rows + kNormRowsPerPartial - 1) / kNormRowsPerPartial);
  return 2 * align(std::size_t(partials * cols) * 4);
}

}  // namespace

bool cudnn_attention_admits(const AttentionDesc& d, bool kv_cache) {
  return !kv_cache && (d.dtype == DType::BF16 || d.dtype == DType::F16) && d.head_dim % 8 == 0 && d.head_dim > 0 &&
         d.head_dim <= 128 && d.batch > 0 && d.q_len > 0 && d.kv_len > 0;
}

std::size_t cudnn_attention_rule_workspace(const AttentionDesc& d, bool backward) {
  if (!backward) return 0;
  const std::size_t rows = std::size_t(d.batch * d.q_heads * d.q_len);
  return align(rows * std::size_t(d.head_dim) * 4) + align(rows * 4);
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
    t.gemm_workspace_bytes = gemm_bytes;
    t.gemm_scratchpad_bytes = gemm_scratchpad;
    t.attention_workspace_bytes = attention_bytes;
    t.norm_workspace_bytes = norm_bytes;
    return t;
  }();
  return k;
}

}  // namespace hr::core
