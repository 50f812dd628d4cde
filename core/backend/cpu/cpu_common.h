// Helpers shared by the CPU kernels: dtype dispatch, threading, workspace carving.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "core/tensor.h"

namespace hr::cpu {

using core::bf16;
using core::DType;
using core::f16;
using core::Tensor;
using core::load;
using core::store;

// Threads the CPU backend uses, and so the count its workspace sizes assume.
inline int num_threads() { return omp_get_max_threads(); }

// Calls f(T{}) with T the C++ type of a float dtype.
template <typename F>
void dispatch_float(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::F32: f(float{}); return;
    case DType::BF16: f(bf16{}); return;
    case DType::F16: f(f16{}); return;
    default: throw Error(str("[", op, "] unsupported dtype ", core::dtype_name(t), " (expects f32, bf16 or f16)"));
  }
}

// Calls f(T{}) with T the C++ type of an index dtype.
template <typename F>
void dispatch_index(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::I32: f(int32_t{}); return;
    case DType::I64: f(int64_t{}); return;
    default: throw Error(str("[", op, "] indices must be i32 or i64; got ", core::dtype_name(t)));
  }
}

// Splits a workspace into 64-byte-aligned float arrays in order.
class WorkspaceCarver {
 public:
  explicit WorkspaceCarver(void* base) : at_(static_cast<char*>(base)) {}
  float* floats(std::size_t n) {
    float* p = reinterpret_cast<float*>(at_);
    at_ += bytes(n);
    return p;
  }
  static std::size_t bytes(std::size_t floats) { return (floats * sizeof(float) + 63) / 64 * 64; }

 private:
  char* at_;
};

// A float copy of a small parameter vector (norm weights): a few KiB of stack-like host scratch.
std::vector<float> to_float_vector(const Tensor& t);

}  // namespace hr::cpu
