// Device-side reductions in a fixed order: a warp's lanes by butterfly shuffles, a block's warps in warp order.
// The same launch shape gives the same bits every run (no atomics), which is what the CPU twins promise too.
#pragma once

namespace hr::cuda::device {

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;

template <typename F>
__device__ __forceinline__ F warp_sum(F v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// The sum over the block of one value per thread; every thread gets it. blockDim.x is a multiple of 32 (at most
// 1024); `scratch` is 32 values of shared memory, free to reuse once this returns.
template <typename F>
__device__ __forceinline__ F block_sum(F v, F* scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  v = warp_sum(v);
  __syncthreads();  // an earlier call's readers are done with scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return warp_sum(lane < warps ? scratch[lane] : F(0));
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return warp_max(lane < warps ? scratch[lane] : -INFINITY);
}

}  // namespace hr::cuda::device
