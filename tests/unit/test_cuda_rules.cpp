// The plain-C++ rules the CUDA kernels share with their sizing (core/backend/cuda/sizing_rules.h, bitonic.h), held
// on any machine: the bitonic network sorts every padded length, the column sums' stretches cover every row once,
// the workspaces the meta device plans for a GPU follow its architecture, and a KV cache's attention never makes
// cuDNN build a graph.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "core/backend/cuda/attention_path.h"
#include "core/backend/cuda/bitonic.h"
#include "core/backend/cuda/sizing_rules.h"
#include "core/backend/kernels.h"
#include "core/memory/device_memory.h"
#include "core/ops/attention.h"
#include "core/ops/embedding.h"
#include "core/ops/linear.h"
#include "core/ops/reduce.h"

using namespace hr;
using namespace hr::core;
using namespace hr::cuda;

namespace {

// The schedule run on the host as the kernels run it: the pairs of one step are disjoint, so taking them one after
// another does what the step's threads do at once.
void host_sort(std::vector<uint64_t>& keys) {
  const int64_t length = int64_t(keys.size()), chunk = bitonic_chunk(length);
  auto compare = [&](int64_t base, const BitonicPair& p) {
    uint64_t &a = keys[std::size_t(base + p.i)], &b = keys[std::size_t(base + p.j)];
    if ((a > b) == p.ascending) std::swap(a, b);
  };
  for (const BitonicStep& s : bitonic_schedule(length)) {
    if (s.kind == BitonicKind::Global) {
      for (int64_t t = 0; t < length / 2; ++t) compare(0, bitonic_pair(t, s.size, s.stride, 0));
      continue;
    }
    const int64_t first = s.kind == BitonicKind::Sort ? 2 : s.size;
    for (int64_t base = 0; base < length; base += chunk)
      bitonic_chunk_steps(first, s.size, chunk, [&](int64_t size, int64_t stride) {
        for (int64_t t = 0; t < chunk / 2; ++t) compare(base, bitonic_pair(t, size, stride, base));
      });
  }
}

// The workspace allocations (requested bytes) a function makes on a meta device that mirrors `target`.
std::vector<std::size_t> workspaces_on_meta(SizingTarget target, const std::function<void()>& f) {
  MemoryContext context;
  MemoryContext::Use use(context);
  configure_device(Device::meta(), {0, target});
  std::vector<std::size_t> sizes;
  allocator_for(Device::meta())->set_trace([&](const TraceEvent& e) {
    if (e.kind == TraceEvent::Kind::Alloc && e.category == Category::Workspace) sizes.push_back(e.requested);
  });
  f();
  allocator_for(Device::meta())->set_trace({});
  return sizes;
}

}  // namespace

TEST(CudaRules, TheBitonicScheduleSortsEveryPaddedLength) {
  std::mt19937_64 rng(3);
  for (int64_t n : {1, 2, 3, 5, 31, 64, 100, 1000, 2047, 2048, 2049, 4097, 10000, 70000}) {
    const int64_t length = bitonic_length(n);
    ASSERT_TRUE(length >= n && length >= 2 && (length & (length - 1)) == 0) << n;
    // The embedding backward's keys: id * n + position over a few ids (long runs of one id), padded with the largest.
    std::vector<uint64_t> keys(std::size_t(length), ~0ull);
    for (int64_t i = 0; i < n; ++i) keys[std::size_t(i)] = (rng() % 7) * uint64_t(n) + uint64_t(i);
    std::vector<uint64_t> want = keys;
    std::sort(want.begin(), want.end());
    host_sort(keys);
    EXPECT_EQ(keys, want) << n << " keys";
  }
}

TEST(CudaRules, ColumnSumStretchesCoverEveryRowOnce) {
  for (int64_t rows : {0, 1, 63, 64, 65, 1000, 1300, 100000, 3000000})
    for (int64_t cols : {1, 24, 40, 1024, 4096, 152064}) {
      const ColumnSplit s = column_split(rows, cols);
      EXPECT_EQ(s.col_tiles, std::max<int64_t>(1, (cols + kColumnTile - 1) / kColumnTile));
      EXPECT_GE(s.partials * s.rows_per_partial, rows) << rows << " x " << cols;
      EXPECT_LT((s.partials - 1) * s.rows_per_partial, std::max<int64_t>(rows, 1)) << "an empty stretch";
      if (rows >= kMinRowsPerPartial) {
        EXPECT_GE(s.rows_per_partial, kMinRowsPerPartial) << rows << " x " << cols;
      }
      // About kColumnSumBlocks blocks where the rows allow it, never many more.
      EXPECT_LE(s.col_tiles * s.partials, std::max(kColumnSumBlocks, s.col_tiles) + s.col_tiles);
      EXPECT_EQ(column_sums_workspace_bytes(rows, cols, 2),
                align_workspace(std::size_t(s.partials * 2 * cols) * sizeof(double)));
    }
  // Wide enough to spread over blocks: a bias gradient over 16k tokens of 4096 columns takes 8 stretches.
  EXPECT_EQ(column_split(16384, 4096).partials, 8);
  EXPECT_EQ(column_split(16384, 64).partials, 256);
}

// cuBLASLt's workspace per GEMM follows the GPU: 32 MiB from Hopper on, 4 MiB before (NVIDIA's recommendation).
TEST(CudaRules, AGemmPlannedForAGpuGetsItsArchitecturesCuBlasWorkspace) {
  for (auto [arch, bytes] : {std::pair<int, std::size_t>{70, std::size_t(4) << 20},
                             {80, std::size_t(4) << 20},
                             {89, std::size_t(4) << 20},
                             {90, std::size_t(32) << 20},
                             {100, std::size_t(32) << 20}}) {
    const std::vector<std::size_t> ws = workspaces_on_meta({Backend::CUDA, arch}, [] {
      Tensor x = Tensor::empty({64, 128}, DType::BF16, Device::meta());
      Tensor w = Tensor::empty({32, 128}, DType::BF16, Device::meta());
      linear_forward(x, w, Tensor());
    });
    EXPECT_NE(std::find(ws.begin(), ws.end(), bytes), ws.end())
        << "sm " << arch << ": no " << bytes << "-byte workspace";
  }
}

// The embedding backward's sort and the column sums are planned: the meta device allocates the CUDA kernels'
// workspaces (the padded keys; the partials), and nothing on the CPU.
TEST(CudaRules, TheEmbeddingSortAndTheColumnSumsArePlannedWorkspaces) {
  const std::vector<std::size_t> gpu = workspaces_on_meta({Backend::CUDA, 90}, [] {
    Tensor ids = Tensor::empty({3000}, DType::I64, Device::meta());
    Tensor dy = Tensor::empty({3000, 16}, DType::F32, Device::meta());
    embedding_backward(ids, dy, {100, 16}, DType::F32);
    sum_leading(dy, Tensor::empty({16}, DType::F32, Device::meta()), Accumulate::No);
  });
  ASSERT_EQ(gpu.size(), 2u);
  EXPECT_EQ(gpu[0], std::size_t(4096) * 8) << "3,000 keys padded to 4,096";
  EXPECT_EQ(gpu[1], column_sums_workspace_bytes(3000, 16, 1));
  const std::vector<std::size_t> cpu = workspaces_on_meta({Backend::CPU}, [] {
    Tensor ids = Tensor::empty({3000}, DType::I64, Device::meta());
    Tensor dy = Tensor::empty({3000, 16}, DType::F32, Device::meta());
    embedding_backward(ids, dy, {100, 16}, DType::F32);
    sum_leading(dy, Tensor::empty({16}, DType::F32, Device::meta()), Accumulate::No);
  });
  EXPECT_TRUE(cpu.empty());
}

// Generation's queries against a KV cache take the own kernel on a GPU: sizing them must not make cuDNN build a
// graph (on a GPU, graphs that never run, and NVRTC compiles for them).
TEST(CudaRules, AKvCacheAttentionNeverAsksCuDnnForAGraph) {
  static int asked = 0;
  asked = 0;
  const CudnnAttentionQuery saved = cudnn_attention_query();
  set_cudnn_attention_query([](const AttentionDesc&, AttentionPass, std::size_t* ws) {
    ++asked;
    *ws = 0;
    return true;
  });
  workspaces_on_meta({Backend::CUDA, 90}, [] {
    Tensor q = Tensor::empty({2, 1, 8, 64}, DType::BF16, Device::meta());
    Tensor cache = Tensor::empty({2, 256, 2, 64}, DType::BF16, Device::meta());
    Tensor past = Tensor::empty({2}, DType::I64, Device::meta());
    attention_cached(q, cache, cache, past, 0.125f);
  });
  EXPECT_EQ(asked, 0) << "a KV cache's attention asked cuDNN for a graph";
  workspaces_on_meta({Backend::CUDA, 90}, [] {
    Tensor q = Tensor::empty({2, 16, 8, 64}, DType::BF16, Device::meta());
    Tensor kv = Tensor::empty({2, 16, 2, 64}, DType::BF16, Device::meta());
    attention_forward(q, kv, kv, Mask::Causal, 0.125f);
  });
  EXPECT_EQ(asked, 1) << "a training shape cuDNN admits is sized by its graph";
  // A sliding window that hides keys takes the own kernels; one that covers every key is plain causal attention.
  workspaces_on_meta({Backend::CUDA, 90}, [] {
    Tensor q = Tensor::empty({2, 16, 8, 64}, DType::BF16, Device::meta());
    Tensor kv = Tensor::empty({2, 16, 2, 64}, DType::BF16, Device::meta());
    attention_forward(q, kv, kv, Mask::Causal, 0.125f, 15);
  });
  EXPECT_EQ(asked, 1) << "a windowed attention asked cuDNN for a graph";
  AttentionDesc d{2, 16, 16, 8, 2, 64, DType::BF16, Mask::Causal, 15};
  EXPECT_FALSE(cudnn_attention_admits(d, AttentionPass::Forward));
  d.window = 16;
  EXPECT_TRUE(cudnn_attention_admits(d, AttentionPass::Forward));
  d.window = 15;
  d.mask = Mask::None;  // a window belongs to the causal mask: the kernels' bounds ignore it elsewhere
  EXPECT_FALSE(d.windowed());
  set_cudnn_attention_query(saved);
}
