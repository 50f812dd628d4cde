// The bitonic sorting network the CUDA embedding backward sorts its (id, position) keys with: which pair each
// thread compares at each step and the schedule of steps, in plain C++ shared by the kernels and a CPU test that
// runs the same schedule on the host. Bitonic sorting needs no stability (the keys are unique), does a fixed amount
// of work in a fixed order, and its workspace is the padded key array: a size the meta device can plan.
#pragma once

#include <cstdint>
#include <vector>

#include "hr_host_device.h"

namespace hr::cuda {

// Keys one block sorts or merges in shared memory (two per thread).
constexpr int64_t kBitonicChunk = 2048;

// The padded length of n keys: a power of two, at least 2.
inline int64_t bitonic_length(int64_t n) {
  int64_t p = 2;
  while (p < n) p *= 2;
  return p;
}

// The keys a shared-memory pass holds: the whole array when it is shorter than a chunk.
inline int64_t bitonic_chunk(int64_t length) {
  return length < kBitonicChunk ? length : kBitonicChunk;
}

// Thread t's pair at step (size, stride) among keys that start at global index `base`: positions i and j = i +
// stride (from base), ordered ascending where the global index's `size` bit is clear, descending where it is set.
struct BitonicPair {
  int64_t i, j;
  bool ascending;
};
HR_HOST_DEVICE inline BitonicPair bitonic_pair(int64_t t, int64_t size, int64_t stride, int64_t base) {
  const int64_t i = 2 * t - (t & (stride - 1));
  return {i, i + stride, ((base + i) & size) == 0};
}

// The steps of a shared-memory pass over one chunk, in order: sizes first_size .. last_size, each with its strides
// below the chunk (the larger ones are global steps). `step(size, stride)` runs one of them.
// The kernel's step (a device lambda with its barrier) runs on the device only.
HR_EXEC_CHECK_DISABLE
template <typename Step>
HR_HOST_DEVICE inline void bitonic_chunk_steps(int64_t first_size, int64_t last_size, int64_t chunk, Step step) {
  for (int64_t size = first_size; size <= last_size; size *= 2)
    for (int64_t stride = (size < chunk ? size : chunk) / 2; stride > 0; stride /= 2) step(size, stride);
}

// One launch of the network over `length` keys:
// - Sort: each chunk runs sizes 2 .. chunk, all their strides, in shared memory;
// - Global: one step (size, stride) with stride >= chunk, over the whole array, one thread per pair;
// - Finish: size `size`'s strides below the chunk, in shared memory per chunk.
enum class BitonicKind : uint8_t { Sort, Global, Finish };
struct BitonicStep {
  BitonicKind kind;
  int64_t size, stride;
};

inline std::vector<BitonicStep> bitonic_schedule(int64_t length) {
  const int64_t chunk = bitonic_chunk(length);
  std::vector<BitonicStep> steps = {{BitonicKind::Sort, chunk, 0}};
  for (int64_t size = 2 * chunk; size <= length; size *= 2) {
    for (int64_t stride = size / 2; stride >= chunk; stride /= 2) steps.push_back({BitonicKind::Global, size, stride});
    steps.push_back({BitonicKind::Finish, size, 0});
  }
  return steps;
}

}  // namespace hr::cuda
