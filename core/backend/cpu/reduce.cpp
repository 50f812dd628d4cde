// CPU reductions: whole-tensor sum / sum of squares, and sums over leading dims, in a fixed order.
#include <cmath>

#include "core/backend/cpu/cpu_common.h"
#include "core/backend/cpu/cpu_kernels.h"

namespace hr::cpu {

void reduce_all(ReduceOp op, const Tensor& x, const Tensor& out) {
  const int64_t n = x.numel();
  ChunkSums partial{};
  dispatch_float(x.dtype(), "reduce", [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data<T>();
    sum_fixed_chunks(n, partial, [&](int64_t i) {
      const double v = load(p, i);
      return op == ReduceOp::SumSquares ? v * v : v;
    });
  });
  out.data<float>()[0] = float(total(partial));
}

std::size_t column_sums_workspace_bytes(int64_t, int64_t) {
  return 0;
}

void sum_leading(const Tensor& x, const Tensor& out, Accumulate accumulate, const Tensor&) {
  const int64_t cols = out.size(0), rows = cols ? x.numel() / cols : 0;
  dispatch_float(x.dtype(), "sum_leading", [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data<T>();
    dispatch_float(out.dtype(), "sum_leading", [&](auto otag) {
      using O = decltype(otag);
      O* o = out.data<O>();
#pragma omp parallel for schedule(static)
      for (int64_t c = 0; c < cols; ++c) {
        double s = 0.0;
        for (int64_t r = 0; r < rows; ++r) s += load(p, r * cols + c);
        store(o, c, (accumulate == Accumulate::Yes ? load(o, c) : 0.f) + float(s));
      }
    });
  });
}

}  // namespace hr::cpu
