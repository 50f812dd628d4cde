// Helpers shared by the CPU kernels: dtype dispatch, threading, workspace carving.
#pragma once

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

#include "core/backend/dispatch_index.h"
#include "core/check.h"
#include "core/tensor.h"

namespace hr::cpu {

using core::bf16;
using core::dispatch_index;
using core::DType;
using core::f16;
using core::load;
using core::store;
using core::Tensor;

// Threads the CPU backend uses, and so the count its workspace sizes assume.
inline int num_threads() {
  return omp_get_max_threads();
}

// Calls f(T{}) with T the C++ type of a float dtype.
template <typename F>
void dispatch_float(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::F32:
      f(float{});
      return;
    case DType::BF16:
      f(bf16{});
      return;
    case DType::F16:
      f(f16{});
      return;
    default:
      throw Error(str("[", op, "] unsupported dtype ", core::dtype_name(t), " (expects f32, bf16 or f16)"));
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

// Sums that must not depend on the thread count are taken over a fixed number of index chunks, each summed
// in order in double, and the chunk sums are then added in order. The partial sums live on the stack: a
// kernel never allocates.
constexpr int64_t kFixedChunks = 64;
constexpr int64_t kParallelMinWork = 4096;  // below this many element visits one thread does them all
using ChunkSums = std::array<double, kFixedChunks>;

// partial[c] = sum of term(i) over chunk c of [0, n); term may also write per-index results. `work_per_term`:
// the elements one term visits (a row's length), so that heavy terms are spread over threads.
template <typename F>
void sum_fixed_chunks(int64_t n, ChunkSums& partial, F&& term, int64_t work_per_term = 1) {
#pragma omp parallel for schedule(static) if (n > 1 && n * work_per_term >= kParallelMinWork)
  for (int64_t c = 0; c < kFixedChunks; ++c) {
    const int64_t begin = n * c / kFixedChunks, end = n * (c + 1) / kFixedChunks;
    double s = 0.0;
    for (int64_t i = begin; i < end; ++i) s += term(i);
    partial[std::size_t(c)] = s;
  }
}

// The sum of term(i) over [begin, end) in double, as kSumLanes interleaved partial sums (element i in lane
// (i - begin) % kSumLanes) added in a fixed order at the end: the same bits on every thread count, and independent
// additions that run in vector registers, where one chain of dependent additions waited out each one's latency
// (a sum of squares ran at one element per four cycles).
constexpr int kSumLanes = 8;
template <typename F>
double sum_in_lanes(int64_t begin, int64_t end, F&& term) {
  double lane[kSumLanes] = {};
  int64_t i = begin;
  for (; i + kSumLanes <= end; i += kSumLanes)
    for (int j = 0; j < kSumLanes; ++j) lane[j] += term(i + j);
  for (int j = 0; i < end; ++i, ++j) lane[j] += term(i);
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// sum_fixed_chunks for a cheap term per element (a load and a product): each chunk summed in lanes.
template <typename F>
void sum_fixed_chunks_in_lanes(int64_t n, ChunkSums& partial, F&& term) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
  for (int64_t c = 0; c < kFixedChunks; ++c)
    partial[std::size_t(c)] = sum_in_lanes(n * c / kFixedChunks, n * (c + 1) / kFixedChunks, term);
}

inline double total(const ChunkSums& partial) {
  double t = 0.0;
  for (double s : partial) t += s;
  return t;
}

}  // namespace hr::cpu
