// Linear and matmul as GEMMs over strided views; transposes are strides, never copies.
#include "core/ops/linear.h"

#include <algorithm>

#include "core/ops/dispatch.h"
#include "core/ops/elementwise.h"
#include "core/ops/reduce.h"

namespace hr::core {

namespace {

// (batch, rows, cols) view of the last two dims with leading dims folded into batch.
Tensor as_3d(const char* op, const Tensor& t) {
  HR_CHECK(t.dim() >= 2, "[", op, "] expects at least 2 dims; got ", t.describe());
  if (t.dim() == 3) return t;
  Tensor c = t.contiguous();
  return c.view({-1, t.size(-2), t.size(-1)});
}

// The GEMM of a @ b -> c, checked.
GemmDesc gemm_desc(const Tensor& a, const Tensor& b, const Tensor& c, float alpha, float beta) {
  HR_CHECK(a.dim() == 3 && b.dim() == 3 && c.dim() == 3, "[gemm] expects 3-D views; got ", a.describe(), ", ",
           b.describe(), ", ", c.describe());
  check_float("gemm", "a", a);
  check_float("gemm", "b", b);
  check_float("gemm", "c", c);
  check_same_device("gemm", a, b);
  check_same_device("gemm", a, c);
  HR_CHECK(c.is_contiguous(), "[gemm] output must be contiguous; got ", c.describe());
  GemmDesc d;
  d.batch = c.size(0);
  d.m = c.size(1);
  d.n = c.size(2);
  d.k = a.size(2);
  HR_CHECK(a.size(1) == d.m && b.size(1) == d.k && b.size(2) == d.n && (a.size(0) == d.batch || a.size(0) == 1) &&
               (b.size(0) == d.batch || b.size(0) == 1),
           "[gemm] shapes do not chain: a ", shape_str(a.shape()), " @ b ", shape_str(b.shape()), " -> c ",
           shape_str(c.shape()));
  d.a_dtype = a.dtype();
  d.b_dtype = b.dtype();
  d.c_dtype = c.dtype();
  for (int i = 0; i < 3; ++i) {
    d.a_strides[i] = a.strides()[i];
    d.b_strides[i] = b.strides()[i];
  }
  if (a.size(0) == 1) d.a_strides[0] = 0;
  if (b.size(0) == 1) d.b_strides[0] = 0;
  d.alpha = alpha;
  d.beta = beta;
  return d;
}

double gemm_flops(const GemmDesc& d) {
  return 2.0 * double(d.batch) * double(d.m) * double(d.n) * double(d.k);
}

// The kernel's arguments for the product `d` over a, b, c, with the workspace and scratchpad the product `sized`
// asks for (d itself, or the whole that d is a part of): made in this order, freed in the reverse (GemmArgs'
// members), by every GEMM and by gemm_allocations alike.
GemmArgs gemm_args(const GemmDesc& d, const Tensor& a, const Tensor& b, const Tensor& c, const GemmDesc& sized) {
  const Kernels& sizing = sizing_kernels(c.device());
  return GemmArgs{d,
                  a,
                  b,
                  c,
                  allocate_workspace(sizing.gemm_workspace_bytes(sized), c.device()),
                  allocate_workspace(sizing.gemm_scratchpad_bytes(sized), c.device())};
}

}  // namespace

void gemm(const Tensor& a, const Tensor& b, const Tensor& c, float alpha, float beta) {
  const GemmDesc d = gemm_desc(a, b, c, alpha, beta);
  if (c.numel() == 0) return;
  launch("gemm", c.device(), &Kernels::gemm, gemm_args(d, a, b, c, d));
  add_matmul_flops(c.device(), gemm_flops(d));
}

void gemm_allocations(const Tensor& a, const Tensor& b, const Tensor& c, float alpha, float beta) {
  const GemmDesc d = gemm_desc(a, b, c, alpha, beta);
  if (c.numel() == 0) return;
  gemm_args(d, a, b, c, d);
}

bool gemm_fits_within(const GemmOperands& part, const GemmOperands& whole, float alpha, float beta) {
  const GemmDesc d = gemm_desc(part.a, part.b, part.c, alpha, beta),
                 w = gemm_desc(whole.a, whole.b, whole.c, alpha, beta);
  const Kernels& sizing = sizing_kernels(whole.c.device());
  return sizing.gemm_workspace_bytes(d) <= sizing.gemm_workspace_bytes(w) &&
         sizing.gemm_scratchpad_bytes(d) <= sizing.gemm_scratchpad_bytes(w);
}

void gemm_within(const GemmOperands& part, const GemmOperands& whole, float alpha, float beta) {
  const GemmDesc d = gemm_desc(part.a, part.b, part.c, alpha, beta),
                 w = gemm_desc(whole.a, whole.b, whole.c, alpha, beta);
  HR_CHECK(part.c.device() == whole.c.device() && d.batch == w.batch && d.m <= w.m && d.n <= w.n && d.k <= w.k,
           "[gemm_within] the part ", shape_str(part.a.shape()), " @ ", shape_str(part.b.shape()),
           " is not within the product ", shape_str(whole.a.shape()), " @ ", shape_str(whole.b.shape()));
  if (whole.c.numel() == 0) return;
  const bool same = d.m == w.m && d.n == w.n && d.k == w.k && std::equal(d.a_strides, d.a_strides + 3, w.a_strides) &&
                    std::equal(d.b_strides, d.b_strides + 3, w.b_strides);  // the whole itself: gemm
  HR_CHECK(same || gemm_fits_within(part, whole, alpha, beta), "[gemm_within] the part ", shape_str(part.a.shape()),
           " @ ", shape_str(part.b.shape()), " needs more workspace than the product ", shape_str(whole.a.shape()),
           " @ ", shape_str(whole.b.shape()));
  const GemmArgs args = gemm_args(d, part.a, part.b, part.c, w);  // the whole's allocations; the part's kernel
  if (part.c.numel() == 0) return;
  launch("gemm", part.c.device(), &Kernels::gemm, args);
  add_matmul_flops(part.c.device(), gemm_flops(d));
}

Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias) {
  HR_CHECK(w.dim() == 2 && x.dim() >= 1 && x.size(-1) == w.size(1), "[linear] input ", x.describe(),
           " does not match weight ", w.describe());
  check_same_device("linear", x, w);
  Shape out_shape = x.shape();
  out_shape.back() = w.size(0);
  Tensor y = Tensor::empty(out_shape, x.dtype(), x.device());
  Tensor x3 = x.reshape({1, -1, x.size(-1)});
  gemm(x3, w.view({1, w.size(0), w.size(1)}).transpose(1, 2), y.view({1, -1, w.size(0)}));
  if (bias.defined()) {
    check_shape("linear", "bias", bias, {w.size(0)});
    add_rows_(y, bias);
  }
  return y;
}

LinearGrads linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Bias bias,
                            const LinearBackwardOptions& o) {
  const int64_t out = w.size(0), in = w.size(1);
  HR_CHECK(dy.size(-1) == out && x.size(-1) == in, "[linear_backward] dy ", dy.describe(), " / x ", x.describe(),
           " do not match weight ", w.describe());
  LinearGrads g;
  Tensor dy3 = dy.reshape({1, -1, out});
  if (o.need_dx) {
    g.dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    gemm(dy3, w.view({1, out, in}), g.dx.view({1, -1, in}));
  }
  if (!o.weight_grads) return g;
  const bool accumulate = o.dw_into.defined() && o.accumulate == Accumulate::Yes;
  g.dw = o.dw_into.defined() ? o.dw_into : Tensor::empty(w.shape(), w.dtype(), w.device());
  check_shape("linear_backward", "dw", g.dw, w.shape());
  Tensor x3 = x.reshape({1, -1, in});
  gemm(dy3.transpose(1, 2), x3, g.dw.view({1, out, in}), 1.f, accumulate ? 1.f : 0.f);
  if (bias == Bias::Yes) {
    g.dbias = o.dbias_into.defined() ? o.dbias_into : Tensor::empty({out}, w.dtype(), w.device());
    sum_leading(dy, g.dbias, o.dbias_into.defined() ? o.accumulate : Accumulate::No);
  }
  return g;
}

Tensor matmul_forward(const Tensor& a, const Tensor& b) {
  HR_CHECK(a.dim() >= 2 && a.dim() == b.dim(), "[matmul] expects equal-rank inputs of at least 2 dims; got ",
           a.describe(), " and ", b.describe());
  for (int d = 0; d < a.dim() - 2; ++d)
    HR_CHECK(a.size(d) == b.size(d), "[matmul] batch dims differ: ", a.describe(), " vs ", b.describe());
  HR_CHECK(a.size(-1) == b.size(-2), "[matmul] last dim of first input ", shape_str(a.shape()),
           " must equal second-last dim of second input ", shape_str(b.shape()));
  Shape shape = a.shape();
  shape.back() = b.size(-1);
  Tensor c = Tensor::empty(shape, a.dtype(), a.device());
  gemm(as_3d("matmul", a), as_3d("matmul", b), c.view({-1, a.size(-2), b.size(-1)}));
  return c;
}

MatmulGrads matmul_backward(const Tensor& dc, const Tensor& a, const Tensor& b) {
  MatmulGrads g;
  g.da = Tensor::empty(a.shape(), a.dtype(), a.device());
  g.db = Tensor::empty(b.shape(), b.dtype(), b.device());
  Tensor dc3 = as_3d("matmul_backward", dc), a3 = as_3d("matmul_backward", a), b3 = as_3d("matmul_backward", b);
  gemm(dc3, b3.transpose(1, 2), g.da.view(a3.shape()));
  gemm(a3.transpose(1, 2), dc3, g.db.view(b3.shape()));
  return g;
}

}  // namespace hr::core
