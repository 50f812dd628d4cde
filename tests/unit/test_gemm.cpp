// GEMM paths: f32 linear shapes run oneDNN's fast kernel with no workspace; broadcast batches and
// transposed views give the same numbers as contiguous copies.
#include <gtest/gtest.h>

#include "core/backend/kernels.h"
#include "core/ops/linear.h"

using namespace hr::core;

TEST(Gemm, F32LinearShapesNeedNoConversionWorkspace) {
  // A workspace here would mean oneDNN fell back to its reference kernel and we convert operands instead.
  Tensor x = Tensor::zeros({1, 300, 64}, DType::F32, Device::cpu()), w = Tensor::zeros({1, 32, 64}, DType::F32, Device::cpu());
  Tensor wt = w.transpose(1, 2);
  GemmDesc d;
  d.m = 300, d.n = 32, d.k = 64;
  for (int i = 0; i < 3; ++i) d.a_strides[i] = x.strides()[i], d.b_strides[i] = wt.strides()[i];
  d.a_strides[0] = d.b_strides[0] = 0;
  EXPECT_EQ(cpu_kernels().gemm_workspace_bytes(d), 0u);
}

TEST(Gemm, BroadcastBatchAndTransposedViews) {
  std::vector<float> av(2 * 3 * 4), bv(4 * 5);
  for (std::size_t i = 0; i < av.size(); ++i) av[i] = float(i % 7) - 3.f;
  for (std::size_t i = 0; i < bv.size(); ++i) bv[i] = float(i % 5) * 0.5f;
  Tensor a = Tensor::from_floats(av, {2, 3, 4}, DType::F32, Device::cpu());
  Tensor b = Tensor::from_floats(bv, {1, 4, 5}, DType::F32, Device::cpu());
  Tensor c = Tensor::empty({2, 3, 5}, DType::F32, Device::cpu());
  gemm(a, b, c);  // b broadcast over the batch
  Tensor bt = b.transpose(1, 2).contiguous().transpose(1, 2);  // same values, transposed storage
  Tensor c2 = Tensor::empty({2, 3, 5}, DType::F32, Device::cpu());
  gemm(a, bt, c2);
  std::vector<float> r1 = c.to_floats(), r2 = c2.to_floats();
  for (int bi = 0; bi < 2; ++bi)
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 5; ++j) {
        float want = 0;
        for (int k = 0; k < 4; ++k) want += av[(bi * 3 + i) * 4 + k] * bv[k * 5 + j];
        EXPECT_FLOAT_EQ(r1[(bi * 3 + i) * 5 + j], want);
        EXPECT_FLOAT_EQ(r2[(bi * 3 + i) * 5 + j], want);
      }
}
