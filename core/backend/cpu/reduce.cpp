// CPU reductions: whole-tensor sum / sum of squares, and sums over leading dims, in a fixed order.
#include <cmath>

#include "core/backend/cpu/cpu_common.h"
#include "core/backend/cpu/cpu_kernels.h"

namespace hr::cpu {

namespace {
constexpr int64_t kReduceBlock = 4096;  // elements per partial sum: fixed, so the order is thread-independent
}

void reduce_all(ReduceOp op, const Tensor& x, const Tensor& out) {
  const int64_t n = x.numel(), blocks = (n + kReduceBlock - 1) / kReduceBlock;
  std::vector<double> partial(std::size_t(std::max<int64_t>(blocks, 1)), 0.0);
  dispatch_float(x.dtype(), "reduce", [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data<T>();
#pragma omp parallel for schedule(static) if (blocks > 1)
    for (int64_t b = 0; b < blocks; ++b) {
      double s = 0.0;
      const int64_t e = std::min(n, (b + 1) * kReduceBlock);
      for (int64_t i = b * kReduceBlock; i < e; ++i) {
        double v = load(p, i);
        s += op == ReduceOp::SumSquares ? v * v : v;
      }
      partial[b] = s;
    }
  });
  double total = 0.0;
  for (double s : partial) total += s;
  out.data<float>()[0] = float(total);
}

void sum_leading(const Tensor& x, const Tensor& out, bool accumulate) {
  const int64_t cols = out.size(0), rows = cols ? x.numel() / cols : 0;
  std::vector<float> acc = accumulate ? to_float_vector(out) : std::vector<float>(std::size_t(cols), 0.f);
  dispatch_float(x.dtype(), "sum_leading", [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data<T>();
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < cols; ++c) {
      double s = 0.0;
      for (int64_t r = 0; r < rows; ++r) s += load(p, r * cols + c);
      acc[c] += float(s);
    }
  });
  copy(out, Tensor::wrap(acc.data(), {cols}, DType::F32, core::Device::host(), nullptr));
}

}  // namespace hr::cpu
