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

// G sums in lanes taken together: out[g] = sum_in_lanes(begin[g], end[g], term(g, .)), bit for bit. Each sum is one
// chain of dependent additions per lane, so a single sum waits out the addition's latency at every step; G of them
// in lockstep keep G times as many additions in flight (a norm's rows, a reduction's chunks).
template <int G, typename F>
void sums_in_lanes(const int64_t (&begin)[G], const int64_t (&end)[G], F&& term, double (&out)[G]) {
  double lane[G][kSumLanes] = {};
  int64_t common = end[0] - begin[0];
  for (int g = 1; g < G; ++g) common = std::min(common, end[g] - begin[g]);
  common -= common % kSumLanes;  // so that every element keeps its lane, (i - begin) % kSumLanes
  for (int64_t k = 0; k < common; k += kSumLanes)
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < kSumLanes; ++j) lane[g][j] += term(g, begin[g] + k + j);
  for (int g = 0; g < G; ++g) {
    double* l = lane[g];
    int64_t i = begin[g] + common;
    for (; i + kSumLanes <= end[g]; i += kSumLanes)
      for (int j = 0; j < kSumLanes; ++j) l[j] += term(g, i + j);
    for (int j = 0; i < end[g]; ++i, ++j) l[j] += term(g, i);
    out[g] = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
  }
}

// sum_fixed_chunks for a cheap term per element (a load and a product): each chunk summed in lanes, four chunks at
// a time (sums_in_lanes; from memory, a 128 MiB gradient's sum of squares on 2 AMX Xeon threads took 9.3 ms one chunk
// at a time).
template <typename F>
void sum_fixed_chunks_in_lanes(int64_t n, ChunkSums& partial, F&& term) {
  constexpr int kTogether = 4;
  static_assert(kFixedChunks % kTogether == 0);
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
  for (int64_t c0 = 0; c0 < kFixedChunks; c0 += kTogether) {
    int64_t begin[kTogether], end[kTogether];
    for (int g = 0; g < kTogether; ++g)
      begin[g] = n * (c0 + g) / kFixedChunks, end[g] = n * (c0 + g + 1) / kFixedChunks;
    double sums[kTogether];
    sums_in_lanes(
        begin, end, [&](int, int64_t i) { return term(i); }, sums);
    for (int g = 0; g < kTogether; ++g) partial[std::size_t(c0 + g)] = sums[g];
  }
}

inline double total(const ChunkSums& partial) {
  double t = 0.0;
  for (double s : partial) t += s;
  return t;
}

}  // namespace hr::cpu
