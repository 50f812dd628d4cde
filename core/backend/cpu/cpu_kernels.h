// Declarations of the CPU kernels (one file each family); cpu_kernels.cpp puts them in the table.
#pragma once

#include "core/ops/optimizer.h"
#include "core/ops/params.h"

namespace hr::cpu {

using namespace hr::core;  // kernels speak the core vocabulary

std::size_t gemm_workspace_bytes(const GemmDesc& d);
std::size_t gemm_scratchpad_bytes(const GemmDesc& d);
// Which way this GEMM runs at the current thread count: "brgemm", "f32 copies + brgemm" or "packed".
const char* gemm_path(const GemmDesc& d);
// GEMM plans kept (at most the 256 most recently used: shapes that vary with the batch do not pile up).
std::size_t gemm_plans_cached();
std::size_t attention_workspace_bytes(const AttentionDesc& d, AttentionPass pass);
std::size_t norm_workspace_bytes(int64_t rows, int64_t cols);
std::size_t column_sums_workspace_bytes(int64_t rows, int64_t cols);  // 0: one pass in a fixed order
std::size_t embedding_workspace_bytes(int64_t ids);                   // 0: in place, by column

void fill(const Tensor& out, float value);
void copy(const Tensor& dst, const Tensor& src);
void gemm(const GemmArgs& a);
void dequantize(const DequantArgs& a);

void axpby(const Tensor& out, float alpha, const Tensor& x, float beta, const Tensor& y);
void mul(const Tensor& out, const Tensor& a, const Tensor& b);
void dropout(const Tensor& out, const Tensor& x, float p, uint64_t key);
void unary_forward(UnaryOp op, const Tensor& x, const Tensor& y);
void unary_backward(UnaryOp op, const Tensor& x, const Tensor& dy, const Tensor& dx);
void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& y);
void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy, const Tensor& dgate, const Tensor& dup);

void norm_forward(const NormArgs& a);
void norm_backward(const NormArgs& a);
void softmax_forward(const Tensor& x, const Tensor& y);
void softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx);
void rope(const RopeArgs& a);
void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out);
void embedding_backward(const Tensor& ids, const Tensor& dy, const Tensor& dtable, const Tensor& workspace);
void patchify(const Tensor& images, const Tensor& patches, int64_t patch, bool inverse);

// Whether this CPU runs the attention kernels (compiled for AVX2 + FMA on x86-64).
bool attention_isa_present();
void attention_forward(const AttentionArgs& a);
void attention_backward(const AttentionArgs& a);
void cross_entropy_forward(const CrossEntropyArgs& a);
void cross_entropy_backward(const CrossEntropyArgs& a);

void sum_leading(const Tensor& x, const Tensor& out, Accumulate accumulate, const Tensor& workspace);
void reduce_all(ReduceOp op, const Tensor& x, const Tensor& out);
void broadcast_scalar(const Tensor& out, const Tensor& scalar, float scale);

void adamw_update(const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& m, const Tensor& v,
                  const AdamWHyper& h);
void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& momentum,
                const SgdHyper& h);
void adafactor_update(const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& row,
                      const Tensor& col, const AdafactorHyper& h, const Tensor& workspace);

}  // namespace hr::cpu
