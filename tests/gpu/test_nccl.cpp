// NcclComm on device tensors (label gpu: needs a GPU; CI builds it and does not run it). Run with
// `mpirun -np 2 test_nccl` on a machine with two GPUs to exercise more than one rank.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

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

// Exposed communication is the compute stream's stalls: a started collective waited for at once stalls it for the
// collective's time; one waited for after enough compute work has been queued stalls it for about nothing; a
// blocking one counts from where the compute stream's queue ends, not the queued work before it.
TEST(Nccl, ExposedSecondsAreTheComputeStreamsStalls) {
  auto boot = parallel::make_default();
  auto nccl = parallel::make_nccl(*boot, boot->local_rank());
  const int w = nccl->world();
  const Device gpu = Device::cuda(nccl->local_rank());
  const int64_t n = int64_t(1) << 27;  // 512 MiB of f32 a rank: the collective takes a measurable time
  Tensor mine = Tensor::full({n}, 1.f, DType::F32, gpu);
  Tensor whole = Tensor::empty({n * w}, DType::F32, gpu);
  Tensor busy = Tensor::empty({n}, DType::F32, gpu);
  nccl->all_gather(mine, whole);  // warm-up: NCCL's first collective sets up its channels
  const double t0 = nccl->exposed_seconds();
  nccl->all_gather_start(mine, whole)->wait();
  const double at_once = nccl->exposed_seconds() - t0;

  auto hidden = nccl->all_gather_start(mine, whole);
  for (int i = 0; i < 40; ++i) fill_(busy, float(i));  // tens of milliseconds of compute queued after the start
  hidden->wait();
  const double t1 = nccl->exposed_seconds();
  const double under_compute = t1 - (t0 + at_once);

  const auto h0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 40; ++i) fill_(busy, float(i));
  nccl->all_gather(mine, whole);  // blocking: the host waits for it
  const double blocking = nccl->exposed_seconds() - t1;
  const double host = std::chrono::duration<double>(std::chrono::steady_clock::now() - h0).count();

  std::printf(
      "all_gather of %lld MiB a rank over %d rank(s): stall waited at once %.3f ms, under compute %.3f ms, "
      "blocking %.3f ms of %.3f ms on the host\n",
      (long long)(n * 4 >> 20), w, at_once * 1e3, under_compute * 1e3, blocking * 1e3, host * 1e3);
  EXPECT_GT(at_once, 0.0);
  EXPECT_LT(under_compute, at_once / 2 + 20e-6);
  EXPECT_GT(blocking, 0.0);
  EXPECT_LT(blocking, host / 2);  // the fills before it are not communication
}
