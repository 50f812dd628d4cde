// Names and sizes of element types.
#include "core/dtype.h"

#include "core/check.h"

namespace hr::core {

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::BF16:
      return 2;
    case DType::F16:
      return 2;
    case DType::I32:
      return 4;
    case DType::I64:
      return 8;
    case DType::U8:
      return 1;
  }
  HR_ASSERT(false, "bad dtype ", int(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "f16";
    case DType::I32:
      return "i32";
    case DType::I64:
      return "i64";
    case DType::U8:
      return "u8";
  }
  return "?";
}

DType parse_dtype(const std::string& name) {
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U8})
    if (name == dtype_name(t)) return t;
  if (name == "float32" || name == "fp32") return DType::F32;
  if (name == "bfloat16") return DType::BF16;
  if (name == "float16" || name == "fp16") return DType::F16;
  throw Error(str("[dtype] unknown dtype '", name, "'; allowed: f32, bf16, f16, i32, i64, u8"));
}

}  // namespace hr::core
