// The kernel table's entries, listed once: each back-end's declarations and its registration are generated from
// these lists (core/backend/kernels.h, cpu/cpu_kernels.*, cuda/cuda_kernels.*, cuda/sizing.cpp), so adding a kernel
// is its list line plus its kernel in each back-end, and a back-end that lacks one fails to link. An entry is
// X(name, return type, (parameters)).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/ops/optimizer.h"
#include "core/ops/params.h"

// Workspace sizes: functions of shapes (and, for CUDA, of the architecture the context sizes for), which the meta
// device mirrors to plan a back-end anywhere. A GEMM's workspace holds the operands it stages in another dtype;
// its scratchpad is what the GEMM kernel itself needs (oneDNN's or cuBLASLt's workspace, packing buffers).
#define HR_SIZING_FUNCTIONS(X)                                                               \
  X(gemm_workspace_bytes, std::size_t, (const GemmDesc& desc))                               \
  X(gemm_scratchpad_bytes, std::size_t, (const GemmDesc& desc))                              \
  X(attention_workspace_bytes, std::size_t, (const AttentionDesc& desc, AttentionPass pass)) \
  X(norm_workspace_bytes, std::size_t, (int64_t rows, int64_t cols))                         \
  X(column_sums_workspace_bytes, std::size_t, (int64_t rows, int64_t cols))                  \
  X(embedding_workspace_bytes, std::size_t, (int64_t ids))

// The kernels. They never allocate: the op allocates outputs and workspaces (sized above) before the call.
#define HR_KERNELS(X)                                                                                               \
  /* Memory: copy takes any strides and casts between dtypes; copy_async may still run when it returns (both        \
     tensors alive until the stream next synchronizes); copy_side runs on the side stream after the compute         \
     stream's queued work, and side_sync waits for every side copy. */                                              \
  X(fill, void, (const Tensor& out, float value))                                                                   \
  X(copy, void, (const Tensor& dst, const Tensor& src))                                                             \
  X(copy_async, void, (const Tensor& dst, const Tensor& src))                                                       \
  X(copy_side, void, (const Tensor& dst, const Tensor& src))                                                        \
  X(side_sync, void, ())                                                                                            \
  /* Linear algebra */                                                                                              \
  X(gemm, void, (const GemmArgs& args))                                                                             \
  X(dequantize, void, (const DequantArgs& args))                                                                    \
  /* Element-wise: b of mul repeats over a's leading dims; dropout keeps core/ops/dropout_mask.h's mask; a defined  \
     bias of unary_forward is added into x in place first (x = x + bias over x's rows, then y = op(x)) */           \
  X(axpby, void, (const Tensor& out, float alpha, const Tensor& x, float beta, const Tensor& y))                    \
  X(mul, void, (const Tensor& out, const Tensor& a, const Tensor& b))                                               \
  X(dropout, void, (const Tensor& out, const Tensor& x, float p, uint64_t key))                                     \
  X(unary_forward, void, (UnaryOp op, const Tensor& x, const Tensor& bias, const Tensor& y))                        \
  X(unary_backward, void, (UnaryOp op, const Tensor& x, const Tensor& dy, const Tensor& dx))                        \
  X(swiglu_forward, void, (const Tensor& gate, const Tensor& up, const Tensor& y))                                  \
  X(swiglu_backward, void,                                                                                          \
    (const Tensor& gate, const Tensor& up, const Tensor& dy, const Tensor& dgate, const Tensor& dup))               \
  /* Normalisation and softmax */                                                                                   \
  X(norm_forward, void, (const NormArgs& args))                                                                     \
  X(norm_backward, void, (const NormArgs& args))                                                                    \
  X(softmax_forward, void, (const Tensor& x, const Tensor& y))                                                      \
  X(softmax_backward, void, (const Tensor& y, const Tensor& dy, const Tensor& dx))                                  \
  /* Position and lookup (rope_table: RoPE's cos and sin per token, once a step); embedding_backward                \
     accumulates into dtable */                                                                                     \
  X(rope, void, (const RopeArgs& args))                                                                             \
  X(rope_table, void, (const RopeArgs& args))                                                                       \
  X(embedding_forward, void, (const Tensor& ids, const Tensor& table, const Tensor& out))                           \
  X(embedding_backward, void, (const Tensor& ids, const Tensor& dy, const Tensor& dtable, const Tensor& workspace)) \
  X(patchify, void, (const Tensor& images, const Tensor& patches, int64_t patch, PatchDirection direction))         \
  X(mix_rows, void, (const MixArgs& args))                                                                          \
  /* Fused blocks; attention_cached is the forward with `past` set: queries against a KV cache */                   \
  X(attention_forward, void, (const AttentionArgs& args))                                                           \
  X(attention_backward, void, (const AttentionArgs& args))                                                          \
  X(attention_cached, void, (const AttentionArgs& args))                                                            \
  X(cross_entropy_forward, void, (const CrossEntropyArgs& args))                                                    \
  X(cross_entropy_backward, void, (const CrossEntropyArgs& args))                                                   \
  /* Reductions: sum_leading sums over all but the last dim (into out, or onto it) */                               \
  X(sum_leading, void, (const Tensor& x, const Tensor& out, Accumulate accumulate, const Tensor& workspace))        \
  X(reduce_all, void, (ReduceOp op, const Tensor& x, const Tensor& out))                                            \
  X(broadcast_scalar, void, (const Tensor& out, const Tensor& scalar, float scale))                                 \
  /* Optimizers */                                                                                                  \
  X(adamw_update, void,                                                                                             \
    (const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& m, const Tensor& v,               \
     const AdamWHyper& h))                                                                                          \
  X(adamw8bit_update, void,                                                                                         \
    (const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& m_codes, const Tensor& m_absmax,  \
     const Tensor& v_codes, const Tensor& v_absmax, const AdamWHyper& h))                                           \
  X(sgd_update, void,                                                                                               \
    (const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& momentum, const SgdHyper& h))     \
  X(adafactor_update, void,                                                                                         \
    (const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& row, const Tensor& col,           \
     const AdafactorHyper& h, const Tensor& workspace))

// A back-end's declarations of its sizing functions and kernels (in its namespace).
#define HR_DECLARE_ENTRY(name, ret, params) ret name params;
// The table's field for an entry.
#define HR_TABLE_FIELD(name, ret, params) ret(*name) params = nullptr;
