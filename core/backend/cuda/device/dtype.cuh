// Device-side loads and stores of f32/bf16/f16 as float (round to nearest even, as the host conversions).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace hr::cuda::device {

template <typename T>
__device__ __forceinline__ float load(const T* p, long long i);
template <>
__device__ __forceinline__ float load<float>(const float* p, long long i) {
  return p[i];
}
template <>
__device__ __forceinline__ float load<__nv_bfloat16>(const __nv_bfloat16* p, long long i) {
  return __bfloat162float(p[i]);
}
template <>
__device__ __forceinline__ float load<__half>(const __half* p, long long i) {
  return __half2float(p[i]);
}

__device__ __forceinline__ void store(float* p, long long i, float v) {
  p[i] = v;
}
__device__ __forceinline__ void store(__nv_bfloat16* p, long long i, float v) {
  p[i] = __float2bfloat16_rn(v);
}
__device__ __forceinline__ void store(__half* p, long long i, float v) {
  p[i] = __float2half_rn(v);
}

// v as a value of T holds it (round to nearest even), back as float: an add that rounds to T at every step.
template <typename T>
__device__ __forceinline__ float round_as(float v);
template <>
__device__ __forceinline__ float round_as<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float round_as<__nv_bfloat16>(float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}
template <>
__device__ __forceinline__ float round_as<__half>(float v) {
  return __half2float(__float2half_rn(v));
}

}  // namespace hr::cuda::device
