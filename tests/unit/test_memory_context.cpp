// Memory contexts: each has its own allocators and meta target, the current one serves allocation, and two
// predictors (two dry runs at different capacities and targets) live at once without touching each other.
#include <gtest/gtest.h>

#include "core/backend/cuda/attention_path.h"
#include "core/backend/kernels.h"
#include "core/memory/device_memory.h"
#include "core/ops/copy.h"
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

// Only the host device can be pinned (the GPU run's loader buffers and offloaded states); asking for it elsewhere
// names the device. Off a GPU, copy_async_ and copy_side_ are plain copies and side_copies_done waits for nothing.
TEST(MemoryContext, OnlyTheHostDeviceIsPinnedAndCopyAsyncIsACopyOnTheCpu) {
  MemoryContext context;
  MemoryContext::Use use(context);
  try {
    configure_device(Device::cpu(), {0, Backend::CPU, AllocatorKind::Caching, 0});
    FAIL() << "a pinned cpu device was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("only the host device can be pinned; got cpu"), std::string::npos) << e.what();
  }
  const std::vector<float> values = {1.f, -2.f, 3.5f, 4.f, 5.f, 6.f};
  const Tensor host = Tensor::from_floats(values, {2, 3}, DType::F32, Device::host());
  const Tensor cpu = Tensor::empty({2, 3}, DType::F32, Device::cpu());
  copy_async_(cpu, host);
  EXPECT_EQ(cpu.to_floats(), values);
  const Tensor back = Tensor::zeros({2, 3}, DType::F32, Device::host());
  copy_side_(back, cpu);
  EXPECT_EQ(back.to_floats(), values);
  side_copies_done(Device::cpu());
  side_copies_done(Device::meta());
}

// The CUDA attention sizing, as the meta device plans a GPU run: a shape cuDNN's fused attention admits gets room
// for it or for the own kernel, whichever needs more; the rest (f32, large head dims) the own kernel's delta; and
// a GPU's query (registered by the CUDA back-end there) decides where one answers.
TEST(MemoryContext, CudaAttentionSizingCoversTheKernelEachShapeTakes) {
  const Kernels& k = cuda_sizing_kernels();
  AttentionDesc d;
  d.batch = 2, d.q_len = 128, d.kv_len = 128, d.q_heads = 8, d.kv_heads = 2, d.head_dim = 64;
  d.dtype = DType::BF16, d.mask = Mask::Causal;
  const std::size_t rows = 2 * 8 * 128, delta = rows * 4;
  ASSERT_TRUE(cudnn_attention_admits(d, AttentionPass::Forward));
  EXPECT_FALSE(cudnn_attention_admits(d, AttentionPass::Cached)) << "a KV cache takes the own kernel";
  EXPECT_EQ(k.attention_workspace_bytes(d, AttentionPass::Forward), 0u);
  EXPECT_EQ(k.attention_workspace_bytes(d, AttentionPass::Backward),
            rows * 64 * 4 + delta);  // dQ's f32 accumulator and row sums
  AttentionDesc f32 = d;
  f32.dtype = DType::F32;
  EXPECT_FALSE(cudnn_attention_admits(f32, AttentionPass::Forward));
  EXPECT_EQ(k.attention_workspace_bytes(f32, AttentionPass::Backward), delta);
  AttentionDesc wide = d;
  wide.head_dim = 256;
  EXPECT_FALSE(cudnn_attention_admits(wide, AttentionPass::Forward));
  EXPECT_EQ(k.attention_workspace_bytes(wide, AttentionPass::Backward), delta);

  // A GPU where cuDNN's graph builds for multi-head shapes only, with a 1 MiB backward workspace.
  const CudnnAttentionQuery saved = cudnn_attention_query();
  set_cudnn_attention_query([](const AttentionDesc& a, AttentionPass pass, std::size_t* ws) {
    *ws = pass == AttentionPass::Backward ? std::size_t(1) << 20 : 0;
    return a.kv_heads == a.q_heads;
  });
  AttentionDesc mha = d;
  mha.kv_heads = 8;
  EXPECT_EQ(k.attention_workspace_bytes(mha, AttentionPass::Backward), std::size_t(1) << 20);
  EXPECT_EQ(k.attention_workspace_bytes(mha, AttentionPass::Forward), 0u);
  EXPECT_EQ(k.attention_workspace_bytes(d, AttentionPass::Backward), delta)
      << "the graph did not build: the own kernel's need";
  set_cudnn_attention_query(saved);
}
