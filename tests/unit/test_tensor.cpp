// Tensor views (reshape, transpose, slice, select), contiguous copies, casts and device moves.
#include <gtest/gtest.h>

#include "core/ops/copy.h"
#include "core/tensor.h"

using namespace hr;
using namespace hr::core;

namespace {
std::vector<float> iota(int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = float(i);
  return v;
}
}  // namespace

TEST(Tensor, ShapesAndViews) {
  Tensor t = Tensor::from_floats(iota(24), {2, 3, 4}, DType::F32, Device::cpu());
  EXPECT_EQ(t.numel(), 24);
  EXPECT_TRUE(t.is_contiguous());
  Tensor v = t.view({6, -1});
  EXPECT_EQ(v.shape(), (Shape{6, 4}));
  EXPECT_TRUE(v.same_storage(t));
  EXPECT_THROW(t.view({5, 5}), Error);
  Tensor tr = t.transpose(1, 2);
  EXPECT_EQ(tr.shape(), (Shape{2, 4, 3}));
  EXPECT_FALSE(tr.is_contiguous());
  Tensor c = tr.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  // c[0][1][2] = t[0][2][1] = 2*4 + 1 = 9
  EXPECT_EQ(c.to_floats()[1 * 3 + 2], 9.f);
}

TEST(Tensor, SliceAndSelect) {
  Tensor t = Tensor::from_floats(iota(12), {3, 4}, DType::F32, Device::cpu());
  Tensor s = t.slice(1, 1, 3);
  EXPECT_EQ(s.shape(), (Shape{3, 2}));
  EXPECT_EQ(s.to_floats(), (std::vector<float>{1, 2, 5, 6, 9, 10}));
  Tensor row = t.select(0, 2);
  EXPECT_EQ(row.to_floats(), (std::vector<float>{8, 9, 10, 11}));
  EXPECT_THROW(t.slice(0, 2, 5), Error);
  // Writing through a view changes the base.
  fill_(t.slice(0, 1, 2), -1.f);
  EXPECT_EQ(t.to_floats()[5], -1.f);
  EXPECT_EQ(t.to_floats()[8], 8.f);
}

TEST(Tensor, CastsRoundTrip) {
  Tensor t = Tensor::from_floats({1.f, -2.5f, 3.140625f, 65504.f}, {4}, DType::F32, Device::cpu());
  EXPECT_EQ(t.to(DType::BF16).to(DType::F32).to_floats(), (std::vector<float>{1.f, -2.5f, 3.140625f, 65536.f}));
  EXPECT_EQ(t.to(DType::F16).to_floats(), (std::vector<float>{1.f, -2.5f, 3.140625f, 65504.f}));
  Tensor i = Tensor::from_ints({1, -7, 1 << 20}, {3}, DType::I32, Device::cpu());
  EXPECT_EQ(i.to(DType::I64).to_ints(), (std::vector<int64_t>{1, -7, 1 << 20}));
  EXPECT_EQ(i.to_floats(), (std::vector<float>{1.f, -7.f, float(1 << 20)}));
}

TEST(Tensor, DeviceMovesAndMeta) {
  Tensor t = Tensor::from_floats(iota(6), {2, 3}, DType::F32, Device::cpu());
  Tensor h = t.to(Device::host());
  EXPECT_EQ(h.device(), Device::host());
  EXPECT_EQ(h.to_floats(), t.to_floats());
  Tensor m = t.to(Device::meta());
  EXPECT_EQ(m.device(), Device::meta());
  EXPECT_EQ(m.shape(), t.shape());
  EXPECT_EQ(m.to_floats(), std::vector<float>(6, 0.f));  // meta holds no values
}

TEST(Tensor, ZeroSizedAndScalar) {
  Tensor z = Tensor::zeros({0, 4}, DType::F32, Device::cpu());
  EXPECT_EQ(z.numel(), 0);
  Tensor s = Tensor::full({}, 3.f, DType::F32, Device::cpu());
  EXPECT_EQ(s.item(), 3.f);
  EXPECT_THROW(Tensor::zeros({2}, DType::F32, Device::cpu()).item(), Error);
}

TEST(Device, Parse) {
  EXPECT_EQ(Device::parse("cuda:3"), Device::cuda(3));
  EXPECT_EQ(Device::parse("meta"), Device::meta());
  EXPECT_THROW(Device::parse("tpu"), Error);
  EXPECT_THROW(Device::parse("cuda:x"), Error);
}
