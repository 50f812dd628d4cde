// CPU dequantization of a tile of a quantized weight (core/quant.h's formats), into f32, bf16 or f16.
#include <cstring>

#include "core/backend/cpu/cpu_common.h"
#include "core/backend/cpu/cpu_kernels.h"

namespace hr::cpu {

namespace {
float f32_at(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}
}  // namespace

void dequantize(const DequantArgs& a) {
  const QuantLayout& l = a.layout;
  const uint8_t* blob = a.blob.data<uint8_t>();
  const int64_t rows = a.out.size(0), cols = a.out.size(1);
  const bool int8 = l.format.type == QuantType::Int8, dq = l.format.double_quant;
  const float offset = f32_at(blob + 12);
  const float* code = int8 ? nullptr : core::code4(l.format.type).data();
  const float* dyn = core::dynamic_code8().data();
  const int64_t block = l.format.block;
  dispatch_float(a.out.dtype(), "dequantize", [&](auto tag) {
    using T = decltype(tag);
    T* out = a.out.data<T>();
#pragma omp parallel for schedule(static) if (rows * cols >= (1 << 14))
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t base = (a.row0 + r) * l.cols + a.col0;
      T* o = out + r * cols;
      if (int8) {
        const float s = f32_at(blob + l.absmax + 4 * (a.row0 + r));
        const int8_t* q = reinterpret_cast<const int8_t*>(blob + l.codes) + base;
        for (int64_t c = 0; c < cols; ++c) store(o, c, float(q[c]) * s / 127.f);
        continue;
      }
      int64_t b = -1;
      float am = 0.f;
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t i = base + c;
        if (i / block != b) {
          b = i / block;
          am = dq ? dyn[blob[l.absmax + b]] * f32_at(blob + l.absmax2 + 4 * (b / kDoubleQuantBlock)) + offset
                  : f32_at(blob + l.absmax + 4 * b);
        }
        const uint8_t byte = blob[l.codes + i / 2];
        store(o, c, code[i % 2 ? byte & 0x0F : byte >> 4] * am);
      }
    }
  });
}

}  // namespace hr::cpu
