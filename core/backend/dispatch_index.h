// The index dtypes every back-end takes for ids, labels and positions: dispatch on them, in one place.
#pragma once

#include <cstdint>

#include "core/check.h"
#include "core/dtype.h"

namespace hr::core {

// Calls f(I{}) with I the C++ type of an index dtype (i32 or i64); any other dtype is refused naming `op`.
template <typename F>
void dispatch_index(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::I32:
      f(int32_t{});
      return;
    case DType::I64:
      f(int64_t{});
      return;
    default:
      throw Error(str("[", op, "] indices must be i32 or i64; got ", dtype_name(t)));
  }
}

}  // namespace hr::core
