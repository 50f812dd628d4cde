// CUDA kernels against their CPU twins (label gpu: needs a GPU; CI builds it and does not run it).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/ops/copy.h"
#include "core/ops/elementwise.h"
#include "core/ops/linear.h"
#include "core/ops/norm.h"

using namespace hr;
using namespace hr::core;

namespace {
Tensor random(const Shape& s, DType dt, Device dev, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(std::size_t(shape_numel(s)));
  for (float& e : v) e = u(rng);
  return Tensor::from_floats(v, s, dt, dev);
}

void expect_close(const Tensor& gpu, const Tensor& cpu, double tol, const char* what) {
  std::vector<float> a = gpu.to(Device::cpu()).to_floats(), b = cpu.to_floats();
  ASSERT_EQ(a.size(), b.size()) << what;
  double worst = 0, scale = 1e-6;
  for (std::size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  EXPECT_LE(worst, tol * scale) << what;
}
}  // namespace

class CudaOps : public testing::TestWithParam<DType> {};

TEST_P(CudaOps, LinearForwardBackwardMatchCpu) {
  const DType dt = GetParam();
  const double tol = dt == DType::F32 ? 1e-4 : 2e-2;
  Tensor x = random({3, 17, 32}, dt, Device::cpu(), 1), w = random({24, 32}, dt, Device::cpu(), 2),
         b = random({24}, dt, Device::cpu(), 3), dy = random({3, 17, 24}, dt, Device::cpu(), 4);
  Tensor gx = x.to(Device::cuda()), gw = w.to(Device::cuda()), gb = b.to(Device::cuda()), gdy = dy.to(Device::cuda());
  expect_close(linear_forward(gx, gw, gb), linear_forward(x, w, b), tol, "linear");
  LinearGrads c = linear_backward(dy, x, w, false), g = linear_backward(gdy, gx, gw, false);
  expect_close(g.dx, c.dx, tol, "dx");
  expect_close(g.dw, c.dw, tol, "dw");
}

TEST_P(CudaOps, ElementwiseMatchCpu) {
  const DType dt = GetParam();
  const double tol = dt == DType::F32 ? 1e-5 : 1e-2;
  Tensor x = random({1000}, dt, Device::cpu(), 5), y = random({1000}, dt, Device::cpu(), 6);
  Tensor gx = x.to(Device::cuda()), gy = y.to(Device::cuda());
  expect_close(add(gx, gy), add(x, y), tol, "add");
  expect_close(mul(gx, gy), mul(x, y), tol, "mul");
  for (UnaryOp op : {UnaryOp::Gelu, UnaryOp::GeluTanh, UnaryOp::QuickGelu, UnaryOp::Silu}) {
    expect_close(unary_forward(op, gx), unary_forward(op, x), tol, unary_name(op));
    expect_close(unary_backward(op, gx, gy), unary_backward(op, x, y), tol, unary_name(op));
  }
  expect_close(swiglu_forward(gx, gy), swiglu_forward(x, y), tol, "swiglu");
  expect_close(x.view({10, 100}).transpose(0, 1).to(Device::cuda()).contiguous(),
               x.view({10, 100}).transpose(0, 1).contiguous(), 0, "strided copy");
}

TEST(CudaOps, MissingKernelsSayTheirName) {
  Tensor x = Tensor::zeros({2, 4}, DType::F32, Device::cuda()), w = Tensor::zeros({4}, DType::F32, Device::cuda());
  try {
    layernorm_forward(x, w, Tensor(), 1e-5f);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[layernorm] has no CUDA implementation"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaOps, testing::Values(DType::F32, DType::BF16));
