// CUDA dequantization of a tile of a quantized weight: the twin of backend/cpu/quant.cpp, one thread per element.
#include "core/backend/cuda/cuda_common.h"
#include "core/backend/cuda/cuda_kernels.h"
#include "core/backend/cuda/device/dtype.cuh"
#include "core/backend/cuda/launch.cuh"

namespace hr::cuda {

namespace {

using device::store;

struct Codes {
  float code4[16];
  float dyn[256];
};

__device__ __forceinline__ float f32_at(const unsigned char* p) {
  float v;
  memcpy(&v, p, 4);
  return v;
}

template <typename T>
__global__ void dequantize_kernel(T* out, const unsigned char* blob, Codes codes, QuantLayout l, long long row0,
                                  long long col0, long long rows, long long cols) {
  const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= rows * cols) return;
  const long long r = t / cols, c = t % cols;
  const long long i = (row0 + r) * l.cols + col0 + c;
  float v;
  if (l.format.type == QuantType::Int8) {
    const signed char q = (signed char)blob[l.codes + i];
    v = float(q) * f32_at(blob + l.absmax + 4 * (row0 + r)) / 127.f;
  } else {
    const long long b = i / l.format.block;
    const float am =
        l.format.double_quant
            ? codes.dyn[blob[l.absmax + b]] * f32_at(blob + l.absmax2 + 4 * (b / kDoubleQuantBlock)) + f32_at(blob + 12)
            : f32_at(blob + l.absmax + 4 * b);
    const unsigned char byte = blob[l.codes + i / 2];
    v = codes.code4[i % 2 ? byte & 0x0F : byte >> 4] * am;
  }
  store(out, t, v);
}

}  // namespace

void dequantize(const DequantArgs& a) {
  Codes codes{};
  if (a.layout.format.type != QuantType::Int8)
    for (int i = 0; i < 16; ++i) codes.code4[i] = core::code4(a.layout.format.type)[std::size_t(i)];
  for (int i = 0; i < 256; ++i) codes.dyn[i] = core::dynamic_code8()[std::size_t(i)];
  const long long rows = a.out.size(0), cols = a.out.size(1);
  dispatch_float(a.out.dtype(), "dequantize", [&](auto tag) {
    using T = decltype(tag);
    launch_elements("dequantize", rows * cols, dequantize_kernel<T>, a.out.data<T>(), a.blob.data<uint8_t>(), codes,
                    a.layout, a.row0, a.col0, rows, cols);
  });
}

}  // namespace hr::cuda
