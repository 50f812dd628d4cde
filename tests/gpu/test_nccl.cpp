// NcclComm on device tensors (label gpu: needs a GPU; CI builds it and does not run it). Run with
// `mpirun -np 2 test_nccl` on a machine with two GPUs to exercise more than one rank.
#include <gtest/gtest.h>

#include "core/ops/copy.h"
#include "parallel/comm.h"

using namespace hr;
using namespace hr::core;

TEST(Nccl, CollectivesOverTheRanksOfTheBootstrap) {
  auto boot = parallel::make_default();
  auto nccl = parallel::make_nccl(*boot, boot->local_rank());
  const int w = nccl->world(), r = nccl->rank();
  const Device gpu = Device::cuda(nccl->local_rank());
  // all_reduce: every rank holds its rank + 1; the sum is w (w + 1) / 2.
  Tensor t = Tensor::full({1000}, float(r + 1), DType::F32, gpu);
  nccl->all_reduce(t);
  for (float v : t.to(Device::cpu()).to_floats()) ASSERT_EQ(v, float(w * (w + 1) / 2));
  // all_gather then reduce_scatter: block q of the gathered tensor is q + 1; scattering it back sums w copies.
  Tensor mine = Tensor::full({256}, float(r + 1), DType::BF16, gpu);
  Tensor whole = Tensor::empty({256 * w}, DType::BF16, gpu);
  nccl->all_gather(mine, whole);
  const auto g = whole.to(Device::cpu()).to_floats();
  for (int q = 0; q < w; ++q) ASSERT_EQ(g[std::size_t(q * 256)], float(q + 1));
  Tensor back = Tensor::empty({256}, DType::BF16, gpu);
  nccl->reduce_scatter(whole, back);
  for (float v : back.to(Device::cpu()).to_floats()) ASSERT_EQ(v, float(w * (r + 1)));
  nccl->barrier();
}
