// Softmax and rotary embedding: shape rules, allocation, dispatch.
#include "core/ops/softmax.h"

#include "core/ops/dispatch.h"

namespace hr::core {

Tensor softmax_forward(const Tensor& x) {
  check_float("softmax", "x", x);
  Tensor xc = x.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  launch("softmax", x.device(), &Kernels::softmax_forward, xc, y);
  return y;
}

Tensor softmax_backward(const Tensor& y, const Tensor& dy) {
  check_shape("softmax_backward", "dy", dy, y.shape());
  Tensor yc = y.contiguous(), dyc = dy.contiguous();
  Tensor dx = Tensor::empty(y.shape(), y.dtype(), y.device());
  launch("softmax_backward", y.device(), &Kernels::softmax_backward, yc, dyc, dx);
  return dx;
}

namespace {
Tensor rope(const char* op, const Tensor& x, const Tensor& positions, float theta, bool inverse) {
  check_float(op, "x", x);
  HR_CHECK(x.dim() == 4 && x.size(-1) % 2 == 0, "[", op, "] x must be (batch, seq, heads, even head_dim); got ",
           x.describe());
  HR_CHECK(positions.dtype() == DType::I32 || positions.dtype() == DType::I64, "[", op,
           "] positions must be i32 or i64; got ", positions.describe());
  check_shape(op, "positions", positions, {x.size(0), x.size(1)});
  check_same_device(op, x, positions);
  RopeArgs a{x.contiguous(), positions.contiguous(), Tensor::empty(x.shape(), x.dtype(), x.device()), theta, inverse};
  launch(op, x.device(), &Kernels::rope, a);
  return a.out;
}
}  // namespace

Tensor rope_forward(const Tensor& x, const Tensor& positions, float theta) {
  return rope("rope", x, positions, theta, false);
}
Tensor rope_backward(const Tensor& dy, const Tensor& positions, float theta) {
  return rope("rope_backward", dy, positions, theta, true);
}

}  // namespace hr::core
