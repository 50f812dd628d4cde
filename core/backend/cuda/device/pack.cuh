// Packs: 16 bytes of consecutive values (8 bf16 or f16, 4 f32) moved as floats with one 16-byte access. An
// element-wise kernel over packs gives each thread one pack; a pack that is not 16-byte aligned or runs past the end
// moves element by element. The arithmetic per element stays the scalar kernel's, so both give the same bits; what
// changes is the number of memory instructions (one 16-byte access instead of eight 2-byte ones) and the index
// arithmetic (one 64-bit division a pack instead of one an element).
#pragma once

#include <cstdint>

#include "core/backend/cuda/device/dtype.cuh"

namespace hr::cuda::device {

template <typename T>
constexpr int kPack = 16 / int(sizeof(T));

// The first element of this thread's pack in a one-dimensional grid of packs.
template <typename T>
__device__ __forceinline__ long long pack_start() {
  return ((long long)blockIdx.x * blockDim.x + threadIdx.x) * kPack<T>;
}

// Elements i .. i + kPack - 1 of p as floats: one 16-byte load when `whole` (p + i aligned, the pack inside the
// tensor), else element by element, with 0 past n.
template <typename T>
__device__ __forceinline__ void load_pack(const T* p, long long i, long long n, bool whole, float (&v)[kPack<T>]) {
  if (whole) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p + i);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int k = 0; k < kPack<T>; ++k) v[k] = load(e, k);
    return;
  }
#pragma unroll
  for (int k = 0; k < kPack<T>; ++k) v[k] = i + k < n ? load(p, i + k) : 0.f;
}

// Stores v as elements i .. i + kPack - 1 of p (rounded as store rounds), stopping at n when not `whole`.
template <typename T>
__device__ __forceinline__ void store_pack(T* p, long long i, long long n, bool whole, const float (&v)[kPack<T>]) {
  if (whole) {
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int k = 0; k < kPack<T>; ++k) store(e, k, v[k]);
    *reinterpret_cast<uint4*>(p + i) = raw;
    return;
  }
#pragma unroll
  for (int k = 0; k < kPack<T>; ++k)
    if (i + k < n) store(p, i + k, v[k]);
}

}  // namespace hr::cuda::device
