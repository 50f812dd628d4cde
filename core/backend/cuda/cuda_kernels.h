// Declarations of the CUDA kernels; cuda_kernels.cu puts them in the table (every entry of core/backend/kernels.h).
#pragma once

#include "core/ops/optimizer.h"
#include "core/ops/params.h"

namespace hr::cuda {

using namespace hr::core;

// Creates the library handles the kernels use (cuBLAS, cuBLASLt, cuDNN) on the current device, if not yet: start-up
// measures what they take.
void create_library_handles();

void fill(const Tensor& out, float value);
void copy(const Tensor& dst, const Tensor& src);
void copy_async(const Tensor& dst, const Tensor& src);
void copy_side(const Tensor& dst, const Tensor& src);
void side_sync();
void gemm(const GemmArgs& a);
void dequantize(const DequantArgs& a);
void axpby(const Tensor& out, float alpha, const Tensor& x, float beta, const Tensor& y);
void mul(const Tensor& out, const Tensor& a, const Tensor& b);
void dropout(const Tensor& out, const Tensor& x, float p, uint64_t key);
void unary_forward(UnaryOp op, const Tensor& x, const Tensor& y);
void unary_backward(UnaryOp op, const Tensor& x, const Tensor& dy, const Tensor& dx);
void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& y);
void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy, const Tensor& dgate, const Tensor& dup);
void broadcast_scalar(const Tensor& out, const Tensor& scalar, float scale);
// With a.past set, queries against a KV cache (generation).
void attention_forward(const AttentionArgs& a);
void attention_backward(const AttentionArgs& a);
void norm_forward(const NormArgs& a);
void norm_backward(const NormArgs& a);
void softmax_forward(const Tensor& x, const Tensor& y);
void softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx);
void rope(const RopeArgs& a);
void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out);
void embedding_backward(const Tensor& ids, const Tensor& dy, const Tensor& dtable, const Tensor& workspace);
void patchify(const Tensor& images, const Tensor& patches, int64_t patch, bool inverse);
void cross_entropy_forward(const CrossEntropyArgs& a);
void cross_entropy_backward(const CrossEntropyArgs& a);
void sum_leading(const Tensor& x, const Tensor& out, Accumulate accumulate, const Tensor& workspace);
void reduce_all(ReduceOp op, const Tensor& x, const Tensor& out);
void adamw_update(const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& m, const Tensor& v,
                  const AdamWHyper& h);
void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& momentum,
                const SgdHyper& h);
void adafactor_update(const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& row,
                      const Tensor& col, const AdafactorHyper& h, const Tensor& workspace);

}  // namespace hr::cuda
