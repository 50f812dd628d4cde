// Declarations of the CUDA kernels; cuda_kernels.cu puts them in the table. Ops missing here say
// "[op] has no CUDA implementation" when called on a GPU.
#pragma once

#include "core/ops/params.h"

namespace hr::cuda {

using namespace hr::core;

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
void broadcast_scalar(const Tensor& out, const Tensor& scalar, float scale);
// Forward only; with a.past set, queries against a KV cache (generation).
void attention_forward(const AttentionArgs& a);

}  // namespace hr::cuda
