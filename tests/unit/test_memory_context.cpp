// Memory contexts: each has its own allocators and meta target, the current one serves allocation, and two
// predictors (two dry runs at different capacities and targets) live at once without touching each other.
#include <gtest/gtest.h>

#include "core/memory/device_memory.h"
#include "train/config.h"
#include "train/planner.h"

using namespace hr;
using namespace hr::core;

TEST(MemoryContext, EachContextHasItsOwnAllocatorsAndMetaTarget) {
  MemoryContext a, b;
  const int64_t outside = allocator_for(Device::meta())->stats().allocated_bytes.peak;
  {
    MemoryContext::Use in_a(a);
    configure_device(Device::meta(), {64_MiB, Backend::CUDA});
    Tensor t = Tensor::empty({1000}, DType::F32, Device::meta());
    EXPECT_EQ(allocator_for(Device::meta())->stats().allocated_bytes.current, 4096);
    EXPECT_EQ(allocator_for(Device::meta())->capacity(), 64_MiB);
    EXPECT_EQ(workspace_backend(Device::meta()), Backend::CUDA);
    {
      MemoryContext::Use in_b(b);
      EXPECT_EQ(allocator_for(Device::meta())->stats().allocated_bytes.current, 0);
      EXPECT_EQ(workspace_backend(Device::meta()), Backend::CPU);
    }
    EXPECT_EQ(allocator_for(Device::meta())->stats().allocated_bytes.current, 4096);
    t = Tensor();
    EXPECT_EQ(a.allocator(Device::meta())->stats().allocated_bytes.current, 0);
    EXPECT_EQ(b.allocator(Device::meta())->stats().allocated_bytes.current, 0);
  }
  // The context that was current before (the process's default) saw none of it.
  EXPECT_EQ(allocator_for(Device::meta())->stats().allocated_bytes.peak, outside);
  EXPECT_EQ(a.allocator(Device::meta())->stats().allocated_bytes.peak, 4096);
}

TEST(MemoryContext, TwoPredictorsLiveAtOnceAndPredictAsEachWouldAlone) {
  const train::RunConfig c = train::load_config(
      "", {"model.preset=tiny", "model.vision.image_size=8", "model.vision.patch_size=4", "model.llm.vocab_size=300",
           "model.image_token_index=299", "data.max_seq_len=24", "train.micro_batch_size=2"});
  train::Prediction alone_cpu, alone_cuda;
  {
    train::Predictor p(c, 1, 0, Backend::CPU);
    alone_cpu = p.step(p.worst_case());
  }
  {
    train::Predictor p(c, 1, 0, Backend::CUDA, std::size_t(64_MiB));
    alone_cuda = p.step(p.worst_case());
  }
  // A CUDA plan sizes cuBLAS's scratchpad: the two targets predict different peaks.
  EXPECT_NE(alone_cpu.peak_allocated, alone_cuda.peak_allocated);
  train::Predictor cpu(c, 1, 0, Backend::CPU);
  train::Predictor cuda(c, 1, 0, Backend::CUDA, std::size_t(64_MiB));
  for (int i = 0; i < 2; ++i) {  // interleaved steps: each keeps its own allocator state
    const train::Prediction a = cpu.step(cpu.worst_case()), b = cuda.step(cuda.worst_case());
    EXPECT_EQ(a.peak_allocated, alone_cpu.peak_allocated);
    EXPECT_EQ(a.peak_reserved, alone_cpu.peak_reserved);
    EXPECT_EQ(b.peak_allocated, alone_cuda.peak_allocated);
    EXPECT_EQ(b.peak_reserved, alone_cuda.peak_reserved);
  }
}
