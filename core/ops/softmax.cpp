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
// positions (batch, seq) i32/i64 on x's device: as it rotates x (batch, seq, heads, head_dim).
void check_positions(const char* op, const Tensor& positions, int64_t batch, int64_t seq, const Tensor& x) {
  HR_CHECK(positions.dtype() == DType::I32 || positions.dtype() == DType::I64, "[", op,
           "] positions must be i32 or i64; got ", positions.describe());
  check_shape(op, "positions", positions, {batch, seq});
  check_same_device(op, x, positions);
}

void check_rotated(const char* op, const Tensor& x) {
  check_float(op, "x", x);
  HR_CHECK(x.dim() == 4 && x.size(-1) % 2 == 0, "[", op, "] x must be (batch, seq, heads, even head_dim); got ",
           x.describe());
}

Tensor rope(const char* op, const Tensor& x, const Tensor& positions, float theta, bool inverse) {
  check_rotated(op, x);
  check_positions(op, positions, x.size(0), x.size(1), x);
  RopeArgs a;
  a.x = x.contiguous();
  a.positions = positions.contiguous();
  a.out = Tensor::empty(x.shape(), x.dtype(), x.device());
  a.theta = theta;
  a.inverse = inverse;
  launch(op, x.device(), &Kernels::rope, a);
  return a.out;
}

Tensor rope_tabled(const char* op, const Tensor& x, const Tensor& table, bool inverse) {
  check_rotated(op, x);
  HR_CHECK(table.dtype() == DType::F32, "[", op, "] table must be f32 (rope_table's); got ", table.describe());
  check_shape(op, "table", table, {x.size(0), x.size(1), 2, x.size(3) / 2});
  check_same_device(op, x, table);
  RopeArgs a;
  a.x = x.contiguous();
  a.out = Tensor::empty(x.shape(), x.dtype(), x.device());
  a.inverse = inverse;
  a.table = table.contiguous();
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

Tensor rope_table(const Tensor& positions, int64_t head_dim, float theta) {
  HR_CHECK(head_dim > 0 && head_dim % 2 == 0, "[rope_table] head_dim must be positive and even; got ", head_dim);
  HR_CHECK(positions.dim() == 2, "[rope_table] positions must be (batch, seq); got ", positions.describe());
  check_positions("rope_table", positions, positions.size(0), positions.size(1), positions);
  RopeArgs a;
  a.positions = positions.contiguous();
  a.theta = theta;
  a.out = Tensor::empty({positions.size(0), positions.size(1), 2, head_dim / 2}, DType::F32, positions.device());
  launch("rope_table", positions.device(), &Kernels::rope_table, a);
  return a.out;
}
Tensor rope_forward(const Tensor& x, const Tensor& table) {
  return rope_tabled("rope", x, table, false);
}
Tensor rope_backward(const Tensor& dy, const Tensor& table) {
  return rope_tabled("rope_backward", dy, table, true);
}

Tensor Rotary::rotate(const Tensor& x) const {
  return table.defined() ? rope_forward(x, table) : rope_forward(x, positions, theta);
}
Tensor Rotary::unrotate(const Tensor& dy) const {
  return table.defined() ? rope_backward(dy, table) : rope_backward(dy, positions, theta);
}

}  // namespace hr::core
