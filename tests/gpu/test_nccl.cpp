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

// Started collectives: the compute stream's writes before the start are what NCCL reads (its stream waits for
// them), and work queued after wait() sees the result, with no host synchronisation in between. Host tensors go
// through the bootstrap.
TEST(Nccl, StartedCollectivesAreOrderedWithTheComputeStreamAndHostTensorsUseTheBootstrap) {
  auto boot = parallel::make_default();
  auto nccl = parallel::make_nccl(*boot, boot->local_rank());
  const int w = nccl->world(), r = nccl->rank();
  const Device gpu = Device::cuda(nccl->local_rank());
  const int64_t n = 1 << 22;  // large enough that an unordered read would see the fill half done
  Tensor mine = Tensor::empty({n}, DType::F32, gpu);
  fill_(mine, float(r + 1));  // queued on the compute stream, not waited for
  Tensor whole = Tensor::empty({n * w}, DType::F32, gpu);
  auto gather = nccl->all_gather_start(mine, whole);
  gather->wait();
  Tensor copy = whole.clone();  // compute-stream work after wait()
  const auto g = copy.to(Device::cpu()).to_floats();
  for (int q = 0; q < w; ++q) {
    ASSERT_EQ(g[std::size_t(q * n)], float(q + 1));
    ASSERT_EQ(g[std::size_t(q * n + n - 1)], float(q + 1));
  }
  Tensor back = Tensor::empty({n}, DType::F32, gpu);
  auto reduce = nccl->reduce_scatter_start(whole, back);
  reduce->wait();
  for (float v : back.to(Device::cpu()).to_floats()) ASSERT_EQ(v, float(w * (r + 1)));

  Tensor flags = Tensor::full({4}, 1.f, DType::F32, Device::host());
  nccl->all_reduce(flags);  // a host tensor: MPI (or the single process) sums it
  for (float v : flags.to_floats()) ASSERT_EQ(v, float(w));
}
