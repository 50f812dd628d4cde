// Reductions: shape rules, allocation, dispatch.
#include "core/ops/reduce.h"

#include <cmath>

#include "core/ops/copy.h"
#include "core/ops/dispatch.h"
#include "core/ops/elementwise.h"

namespace hr::core {

namespace {
Tensor reduce(const char* op, ReduceOp r, const Tensor& x) {
  Tensor out = Tensor::empty({}, DType::F32, x.device());
  Tensor xc = x.contiguous();
  launch(op, x.device(), &Kernels::reduce_all, r, xc, out);
  return out;
}

Tensor broadcast(const char* op, const Tensor& dy, const Tensor& x, float s) {
  HR_CHECK(dy.numel() == 1, "[", op, "] dy must be a scalar; got ", dy.describe());
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  launch(op, x.device(), &Kernels::broadcast_scalar, dx, dy, s);
  return dx;
}
}  // namespace

Tensor sum(const Tensor& x) {
  return reduce("sum", ReduceOp::Sum, x);
}

Tensor mean(const Tensor& x) {
  HR_CHECK(x.numel() > 0, "[mean] of an empty tensor ", x.describe());
  Tensor s = reduce("mean", ReduceOp::Sum, x);
  launch("mean", x.device(), &Kernels::axpby, s, 1.f / float(x.numel()), s, 0.f, s);
  return s;
}

Tensor sum_backward(const Tensor& dy, const Tensor& x) {
  return broadcast("sum_backward", dy, x, 1.f);
}
Tensor mean_backward(const Tensor& dy, const Tensor& x) {
  return broadcast("mean_backward", dy, x, 1.f / float(std::max<int64_t>(x.numel(), 1)));
}

void sum_leading(const Tensor& x, const Tensor& out, Accumulate accumulate) {
  HR_CHECK(out.is_contiguous() && out.dim() == 1 && x.dim() >= 1 && x.size(-1) == out.size(0), "[sum_leading] ",
           x.describe(), " cannot be summed into ", out.describe());
  check_same_device("sum_leading", x, out);
  Tensor xc = x.contiguous();
  const int64_t cols = out.size(0), rows = cols ? x.numel() / cols : 0;
  Tensor workspace = allocate_workspace(sizing_kernels(x.device()).column_sums_workspace_bytes(rows, cols), x.device());
  launch("sum_leading", x.device(), &Kernels::sum_leading, xc, out, accumulate, workspace);
}

Tensor global_norm(const std::vector<Tensor>& xs) {
  HR_CHECK(!xs.empty(), "[global_norm] no tensors");
  Device dev = xs[0].device();
  Tensor total = Tensor::zeros({}, DType::F32, dev);
  for (const Tensor& x : xs) {
    check_same_device("global_norm", x, xs[0]);
    Tensor sq = reduce("global_norm", ReduceOp::SumSquares, x);
    add_(total, sq);
  }
  // sqrt in place through the scalar broadcast of a single element would need a kernel; a scalar read is cheap.
  if (dev.type == DeviceType::Meta) return total;
  float v = std::sqrt(total.item());
  fill_(total, v);
  return total;
}

std::vector<Tensor> global_norm_backward(const Tensor& dy, const std::vector<Tensor>& xs, const Tensor& norm) {
  const bool meta = norm.device().type == DeviceType::Meta;
  const float n = meta ? 1.f : norm.item();
  const float factor = meta || n == 0.f ? 0.f : dy.item() / n;
  std::vector<Tensor> grads;
  for (const Tensor& x : xs) grads.push_back(scale(x, factor));
  return grads;
}

}  // namespace hr::core
