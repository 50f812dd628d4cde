// The kernel table: every kernel a backend may provide. An op asks its device's table; a null entry means
// "not supported on this backend" and the op says so by name. Outputs and workspaces are allocated by the
// op before the call, so kernels never allocate and the meta device needs no kernels at all.
#pragma once

#include "core/ops/optimizer.h"
#include "core/ops/params.h"

namespace hr::core {

// How a GEMM of two operand dtypes computes: the CPU widens both to f32, cuBLAS stages the odd one in the output's
// dtype first (core/backend/cuda/gemm.cu). An op that can hand it one dtype instead (the cross-entropy's logit
// gradient, cast as the kernel writes it) asks.
enum class GemmMixing : uint8_t { WidenToF32, NarrowToOutput };

struct Kernels {
  const char* backend = "";
  // Facts of the back-end that ops plan by (the meta device mirrors them like the sizing functions).
  GemmMixing gemm_mixing = GemmMixing::WidenToF32;
  std::size_t cross_entropy_chunk_bytes = std::size_t(32) << 20;  // f32 logits per chunk of the fused loss
  // Sizing
  // A GEMM's workspace holds the operands it stages in another dtype first; its scratchpad is what the GEMM
  // kernel itself needs (oneDNN's or cuBLAS's workspace, packing buffers). The op allocates both.
  std::size_t (*gemm_workspace_bytes)(const GemmDesc&) = nullptr;
  std::size_t (*gemm_scratchpad_bytes)(const GemmDesc&) = nullptr;
  std::size_t (*attention_workspace_bytes)(const AttentionDesc&, AttentionPass pass) = nullptr;
  std::size_t (*norm_workspace_bytes)(int64_t rows, int64_t cols) = nullptr;
  // Sums over the rows of a (rows, cols) array (sum_leading, Adafactor's column moments): what a back-end keeps
  // between its passes.
  std::size_t (*column_sums_workspace_bytes)(int64_t rows, int64_t cols) = nullptr;
  // The embedding backward over `ids` tokens (the CUDA back-end sorts them there).
  std::size_t (*embedding_workspace_bytes)(int64_t ids) = nullptr;

  // Memory
  void (*fill)(const Tensor& out, float value) = nullptr;
  void (*copy)(const Tensor& dst, const Tensor& src) = nullptr;  // any strides, casts between dtypes
  // copy, except that a host<->device transfer may still run when it returns (on the compute stream): both
  // tensors must stay alive until the stream next synchronizes. From pinned host memory it overlaps compute.
  void (*copy_async)(const Tensor& dst, const Tensor& src) = nullptr;
  // A host<->device copy on the side (copy) stream, after the work the compute stream has queued: kernels queued
  // after it run while it moves. Both tensors stay alive and untouched until side_sync() returns, which blocks
  // until every side copy has arrived (so whatever is queued after it is ordered after them).
  void (*copy_side)(const Tensor& dst, const Tensor& src) = nullptr;
  void (*side_sync)() = nullptr;

  // Linear algebra
  void (*gemm)(const GemmArgs&) = nullptr;
  void (*dequantize)(const DequantArgs&) = nullptr;

  // Element-wise
  void (*axpby)(const Tensor& out, float alpha, const Tensor& x, float beta, const Tensor& y) = nullptr;
  void (*mul)(const Tensor& out, const Tensor& a, const Tensor& b) = nullptr;  // b repeats over a's leading dims
  // out = x * keep(key, i) / (1 - p), keep as core/ops/dropout_mask.h draws it
  void (*dropout)(const Tensor& out, const Tensor& x, float p, uint64_t key) = nullptr;
  void (*unary_forward)(UnaryOp op, const Tensor& x, const Tensor& y) = nullptr;
  void (*unary_backward)(UnaryOp op, const Tensor& x, const Tensor& dy, const Tensor& dx) = nullptr;
  void (*swiglu_forward)(const Tensor& gate, const Tensor& up, const Tensor& y) = nullptr;
  void (*swiglu_backward)(const Tensor& gate, const Tensor& up, const Tensor& dy, const Tensor& dgate,
                          const Tensor& dup) = nullptr;

  // Normalisation and softmax
  void (*norm_forward)(const NormArgs&) = nullptr;
  void (*norm_backward)(const NormArgs&) = nullptr;
  void (*softmax_forward)(const Tensor& x, const Tensor& y) = nullptr;
  void (*softmax_backward)(const Tensor& y, const Tensor& dy, const Tensor& dx) = nullptr;

  // Position and lookup
  void (*rope)(const RopeArgs&) = nullptr;
  void (*embedding_forward)(const Tensor& ids, const Tensor& table, const Tensor& out) = nullptr;
  void (*embedding_backward)(const Tensor& ids, const Tensor& dy, const Tensor& dtable,
                             const Tensor& workspace) = nullptr;  // accumulates
  void (*patchify)(const Tensor& images, const Tensor& patches, int64_t patch, bool inverse) = nullptr;

  // Fused blocks
  void (*attention_forward)(const AttentionArgs&) = nullptr;
  void (*attention_backward)(const AttentionArgs&) = nullptr;
  void (*attention_cached)(const AttentionArgs&) = nullptr;  // forward with `past` set: queries against a KV cache
  void (*cross_entropy_forward)(const CrossEntropyArgs&) = nullptr;
  void (*cross_entropy_backward)(const CrossEntropyArgs&) = nullptr;

  // Reductions
  // out = sum over all but the last dim of x (+ what out holds, when accumulating)
  void (*sum_leading)(const Tensor& x, const Tensor& out, Accumulate accumulate, const Tensor& workspace) = nullptr;
  void (*reduce_all)(ReduceOp op, const Tensor& x, const Tensor& out_f32_scalar) = nullptr;
  void (*broadcast_scalar)(const Tensor& out, const Tensor& scalar, float scale) = nullptr;

  // Optimizers
  void (*adamw_update)(const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& m, const Tensor& v,
                       const AdamWHyper& h) = nullptr;
  void (*sgd_update)(const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& momentum,
                     const SgdHyper& h) = nullptr;
  void (*adafactor_update)(const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& row,
                           const Tensor& col, const AdafactorHyper& h, const Tensor& workspace) = nullptr;
};

const Kernels& cpu_kernels();
// Throws "[cuda] no CUDA back-end in this build" when built without CUDA.
const Kernels& cuda_kernels();
// The CUDA backend's workspace-size functions only: plain C++, in every build, so meta can mirror a GPU.
const Kernels& cuda_sizing_kernels();
// The table for `device`; meta has none (its ops only allocate).
const Kernels* kernels_for(Device device);
// Workspace sizes follow the backend a device runs, or for meta its target.
const Kernels& sizing_kernels(Device device);
const Kernels& sizing_kernels(Backend backend);

}  // namespace hr::core
