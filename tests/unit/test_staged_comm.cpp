// StagedComm (parallel.backend: mpi on GPUs) under `mpirun -np 2` (label mpi): collectives on tensors of a device
// MPI does not read directly go through host tensors of the host allocator (category comm) and give MPI's own
// results, in place or not. On the CPU the CPU device's tensors are staged the same way a GPU's are, which is how
// this runs without a GPU.
#include <gtest/gtest.h>

#include "core/memory/device_memory.h"
#include "core/ops/copy.h"
#include "parallel/comm.h"

using namespace hr;
using namespace hr::core;

TEST(StagedComm, DeviceTensorsGoThroughHostTensorsOfTheHostAllocator) {
  auto mpi = parallel::make_default();
  auto staged = parallel::make_staged(*mpi);
  const int w = staged->world(), r = staged->rank();
  ASSERT_EQ(w, 2) << "run under mpirun -np 2";
  EXPECT_STREQ(staged->name(), "staged");
  const Device dev = Device::cpu();
  auto host = allocator_for(Device::host());
  host->reset_peak_stats();
  const int64_t comm_before = host->stats().category(Category::Comm).peak;

  Tensor t = Tensor::full({1000}, float(r + 1), DType::F32, dev);
  staged->all_reduce(t);
  for (float v : t.to_floats()) ASSERT_EQ(v, float(w * (w + 1) / 2));
  EXPECT_GE(host->stats().category(Category::Comm).peak - comm_before, int64_t(1000 * sizeof(float)));

  // all_gather in place: this rank's block of `whole` is its input.
  Tensor whole = Tensor::full({256 * w}, -1.f, DType::BF16, dev);
  Tensor mine = whole.slice(0, 256 * r, 256 * (r + 1));
  fill_(mine, float(r + 1));
  staged->all_gather(mine, whole);
  const auto g = whole.to_floats();
  for (int q = 0; q < w; ++q) {
    ASSERT_EQ(g[std::size_t(q * 256)], float(q + 1));
    ASSERT_EQ(g[std::size_t(q * 256 + 255)], float(q + 1));
  }
  // reduce_scatter: block q of every rank's `whole` is q + 1; rank r receives w copies of r + 1.
  Tensor back = Tensor::empty({256}, DType::BF16, dev);
  staged->reduce_scatter(whole, back);
  for (float v : back.to_floats()) ASSERT_EQ(v, float(w * (r + 1)));

  Tensor b = Tensor::full({16}, float(10 * (r + 1)), DType::F32, dev);
  staged->broadcast(b, 1);
  for (float v : b.to_floats()) ASSERT_EQ(v, 20.f);
  // Host tensors and host values go straight to MPI.
  Tensor flags = Tensor::full({4}, 1.f, DType::F32, Device::host());
  staged->all_reduce(flags);
  for (float v : flags.to_floats()) ASSERT_EQ(v, float(w));
  EXPECT_EQ(staged->sum(double(r)), 1.0);
  EXPECT_GE(staged->exposed_seconds(), 0.0);
  staged->barrier();
}
