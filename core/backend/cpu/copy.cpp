// CPU fill and strided copy with dtype conversion (all pairs of dtypes).
#include <cmath>
#include <cstring>

#include "core/backend/cpu/cpu_common.h"
#include "core/backend/cpu/cpu_kernels.h"

namespace hr::cpu {

namespace {

template <typename D, typename S>
inline D convert(S s) {
  if constexpr (std::is_same_v<D, S>) {
    return s;
  } else if constexpr (std::is_same_v<S, bf16> || std::is_same_v<S, f16>) {
    float v = core::to_f32(s);
    if constexpr (std::is_same_v<D, float>)
      return v;
    else if constexpr (std::is_same_v<D, bf16>)
      return core::to_bf16(v);
    else if constexpr (std::is_same_v<D, f16>)
      return core::to_f16(v);
    else
      return D(v);
  } else if constexpr (std::is_same_v<D, bf16>) {
    return core::to_bf16(float(s));
  } else if constexpr (std::is_same_v<D, f16>) {
    return core::to_f16(float(s));
  } else {
    return D(s);
  }
}

template <typename F>
void dispatch_any(DType t, F&& f) {
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
    case DType::I32:
      f(int32_t{});
      return;
    case DType::I64:
      f(int64_t{});
      return;
    case DType::U8:
      f(uint8_t{});
      return;
  }
}

// Offset (in elements) of the row `row` of a tensor viewed as (numel / last, last).
inline int64_t row_offset(const Tensor& t, int64_t row) {
  int64_t off = 0;
  for (int d = t.dim() - 2; d >= 0; --d) {
    int64_t n = t.shape()[d];
    off += (row % n) * t.strides()[d];
    row /= n;
  }
  return off;
}

template <typename D, typename S>
void copy_typed(const Tensor& dst, const Tensor& src) {
  D* dp = dst.data<D>();
  const S* sp = src.data<S>();
  const int64_t n = dst.numel();
  if (dst.is_contiguous() && src.is_contiguous()) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) dp[i] = convert<D>(sp[i]);
    return;
  }
  const int64_t last = dst.dim() ? dst.shape().back() : 1;
  const int64_t ds = dst.dim() ? dst.strides().back() : 1, ss = src.dim() ? src.strides().back() : 1;
  const int64_t rows = last ? n / last : 0;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    D* d = dp + row_offset(dst, r);
    const S* s = sp + row_offset(src, r);
    for (int64_t i = 0; i < last; ++i) d[i * ds] = convert<D>(s[i * ss]);
  }
}

}  // namespace

void fill(const Tensor& out, float value) {
  dispatch_any(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T v;
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>)
      v = convert<T>(value);
    else
      v = T(value);
    if (out.is_contiguous()) {
      T* p = out.data<T>();
      const int64_t n = out.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
      for (int64_t i = 0; i < n; ++i) p[i] = v;
    } else {
      T* base = out.data<T>();
      const int64_t last = out.shape().back(), st = out.strides().back();
      const int64_t rows = last ? out.numel() / last : 0;
      for (int64_t r = 0; r < rows; ++r) {
        T* d = base + row_offset(out, r);
        for (int64_t i = 0; i < last; ++i) d[i * st] = v;
      }
    }
  });
}

void copy(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    if (dst.data_ptr() != src.data_ptr()) std::memcpy(dst.data_ptr(), src.data_ptr(), dst.nbytes());
    return;
  }
  dispatch_any(dst.dtype(), [&](auto dtag) {
    dispatch_any(src.dtype(), [&](auto stag) { copy_typed<decltype(dtag), decltype(stag)>(dst, src); });
  });
}

}  // namespace hr::cpu
