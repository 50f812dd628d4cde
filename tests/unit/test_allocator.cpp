// CachingAllocator: PyTorch's rounding, pools, split/merge, fragmentation, retry-then-OOM, exact stats,
// per-category and per-owner accounting, and the OOM message of a capped device.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>

#include "core/memory/arena_plan.h"
#include "core/memory/caching_allocator.h"
#include "core/memory/device_memory.h"
#include "core/memory/replay.h"
#include "core/tensor.h"
#include "train/memory_log.h"

using namespace hr;
using namespace hr::core;

namespace {
using Block = CachingAllocator::Block;

CachingAllocator capped(std::size_t cap) {
  return CachingAllocator(make_capped_host_allocator(cap), "test");
}
char* ptr(Block* b) {
  return static_cast<char*>(CachingAllocator::data(b));
}
}  // namespace

TEST(CachingAllocator, RoundingAndSegmentSizes) {
  EXPECT_EQ(round_size(0), 512u);
  EXPECT_EQ(round_size(1), 512u);
  EXPECT_EQ(round_size(512), 512u);
  EXPECT_EQ(round_size(513), 1024u);
  EXPECT_EQ(segment_size_for(512), 2_MiB);
  EXPECT_EQ(segment_size_for(1_MiB), 2_MiB);
  EXPECT_EQ(segment_size_for(1_MiB + 512), 20_MiB);
  EXPECT_EQ(segment_size_for(10_MiB - 512), 20_MiB);
  EXPECT_EQ(segment_size_for(10_MiB), 10_MiB);
  EXPECT_EQ(segment_size_for(11_MiB + 512), 12_MiB);
}

// A segment the host allocator frees gives its pages back to the OS, however many segments it freed before: glibc's
// malloc raises its mmap threshold to each mapped block it frees (up to 32 MiB) and keeps smaller freed blocks in
// its heap, so a segment under 24 MiB freed after a 24 MiB one stayed resident when segments came from malloc.
TEST(HostAllocator, AFreedSegmentLeavesTheResidentSet) {
  ASSERT_GT(train::host_rss_bytes(), 0);
  auto raw = make_host_allocator();
  auto touch_and_free = [&](std::size_t bytes) {
    auto* p = static_cast<char*>(raw->allocate(bytes));
    ASSERT_NE(p, nullptr);
    std::memset(p, 1, bytes);  // every page resident
    raw->deallocate(p, bytes);
  };
  touch_and_free(24_MiB);
  const int64_t before = train::host_rss_bytes();
  for (int i = 0; i < 3; ++i) touch_and_free(16_MiB);
  EXPECT_LT(train::host_rss_bytes() - before, int64_t(4_MiB)) << "a freed 16 MiB segment stayed in the process";
  EXPECT_EQ(raw->used(), 0u);
}

TEST(CachingAllocator, SmallRequestsShareASmallSegment) {
  CachingAllocator a(make_host_allocator(), "test");
  Block* x = a.allocate(1000);
  Block* y = a.allocate(1000);
  MemoryStats s = a.stats();
  EXPECT_EQ(s.reserved_bytes.current, int64_t(2_MiB));
  EXPECT_EQ(s.segment.current, 1);
  EXPECT_EQ(s.allocated_bytes.current, 2048);
  EXPECT_EQ(s.requested_bytes.current, 2000);
  EXPECT_EQ(ptr(y), ptr(x) + 1024);  // best fit takes the split remainder right after x
  EXPECT_EQ(s.inactive_split_bytes.current, int64_t(2_MiB - 2048));
  a.free(x);
  a.free(y);
  s = a.stats();
  EXPECT_EQ(s.allocated_bytes.current, 0);
  EXPECT_EQ(s.inactive_split_bytes.current, 0);  // merged back into one whole free segment
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes.current, 0);
}

TEST(CachingAllocator, LargeBlocksSplitOnlyWhenMoreThanOneMiBRemains) {
  CachingAllocator a(make_host_allocator(), "test");
  const std::size_t req = 9_MiB + 512_KiB;  // 1-10 MiB: from a 20 MiB segment
  Block* x = a.allocate(req);
  EXPECT_EQ(a.stats().reserved_bytes.current, int64_t(20_MiB));
  EXPECT_EQ(a.stats().allocated_bytes.current, int64_t(req));  // split: 10.5 MiB remain
  Block* y = a.allocate(req);  // best fit is the 10.5 MiB remainder; 1 MiB would remain: no split
  EXPECT_EQ(ptr(y), ptr(x) + req);
  EXPECT_EQ(CachingAllocator::block_size(y), 10_MiB + 512_KiB);
  EXPECT_EQ(a.stats().allocated_bytes.current, int64_t(20_MiB));
  EXPECT_EQ(a.stats().segment.current, 1);
  char* base = ptr(x);  // block handles die with free (merged blocks are deleted)
  a.free(x);
  EXPECT_EQ(a.stats().inactive_split_bytes.current, int64_t(req));
  a.free(y);
  EXPECT_EQ(a.stats().inactive_split_bytes.current, 0);
  // The merged 20 MiB block serves a new request from the cache: no new segment.
  Block* z = a.allocate(5_MiB);
  EXPECT_EQ(ptr(z), base);
  EXPECT_EQ(a.stats().segment.current, 1);
  a.free(z);
}

TEST(CachingAllocator, EmptyCacheReleasesOnlyWholeFreeSegments) {
  CachingAllocator a(make_host_allocator(), "test");
  Block* big = a.allocate(12_MiB);  // own 12 MiB segment
  Block* s1 = a.allocate(4096);     // small segment, stays in use
  a.free(big);
  a.empty_cache();
  MemoryStats s = a.stats();
  EXPECT_EQ(s.reserved_bytes.current, int64_t(2_MiB));
  EXPECT_EQ(s.segment.current, 1);
  a.free(s1);
}

// pytorch/pytorch#35901: a big freed block is split by later, smaller tensors, so the next big request finds
// no block large enough although enough bytes are free in total. On a capped device that is an OOM after a
// retry, and the stats show the stranded bytes as inactive split.
TEST(CachingAllocator, FragmentationFromSplittingAFreedBigBlock) {
  CachingAllocator a = capped(24_MiB);
  Block* big = a.allocate(16_MiB);
  char* base = ptr(big);
  a.free(big);
  Block* mid = a.allocate(4_MiB);  // 1-10 MiB request: best fit is the cached 16 MiB block, split
  EXPECT_EQ(ptr(mid), base);
  MemoryStats s = a.stats();
  EXPECT_EQ(s.reserved_bytes.current, int64_t(16_MiB));
  EXPECT_EQ(s.inactive_split_bytes.current, int64_t(12_MiB));
  EXPECT_NEAR(s.fragmentation(), 0.75, 1e-12);
  EXPECT_THROW(a.allocate(16_MiB), OutOfMemory);  // 12 MiB free but split; 16 + 16 > 24 capacity
  s = a.stats();
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_ooms, 1);
  EXPECT_EQ(s.reserved_bytes.current, int64_t(16_MiB));  // the split segment could not be released
  a.free(mid);
  // Now the segment is whole again and can be reused without any new memory.
  Block* again = a.allocate(16_MiB);
  EXPECT_EQ(a.stats().num_ooms, 1);
  a.free(again);
}

TEST(CachingAllocator, RetryAfterFreeingCachedBlocksSucceeds) {
  CachingAllocator a = capped(30_MiB);
  Block* x = a.allocate(12_MiB);
  a.free(x);  // cached, not returned
  EXPECT_EQ(a.stats().reserved_bytes.current, int64_t(12_MiB));
  Block* y = a.allocate(20_MiB);  // 12 + 20 > 30: release the cache, then retry
  MemoryStats s = a.stats();
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(s.reserved_bytes.current, int64_t(20_MiB));
  a.free(y);
}

TEST(CachingAllocator, ExactStatsAfterAScriptedSequence) {
  CachingAllocator a(make_meta_allocator(0), "meta");
  Block* p1 = a.allocate(100);         // 512 B, small segment #1
  Block* p2 = a.allocate(3_MiB);       // 3 MiB from a 20 MiB segment
  Block* p3 = a.allocate(30_MiB + 1);  // 30 MiB + 512 rounded -> 32 MiB own segment
  a.free(p2);
  Block* p4 = a.allocate(2_MiB);  // reuses the 20 MiB segment
  a.free(p1);
  MemoryStats s = a.stats();
  EXPECT_EQ(s.allocated_bytes.current, int64_t(30_MiB + 512 + 2_MiB));
  EXPECT_EQ(s.allocated_bytes.peak, int64_t(512 + 3_MiB + 30_MiB + 512));
  EXPECT_EQ(s.reserved_bytes.current, int64_t(2_MiB + 20_MiB + 32_MiB));
  EXPECT_EQ(s.reserved_bytes.peak, s.reserved_bytes.current);
  EXPECT_EQ(s.requested_bytes.current, int64_t(30_MiB + 1 + 2_MiB));
  EXPECT_EQ(s.allocation.current, 2);
  EXPECT_EQ(s.allocation.peak, 3);
  EXPECT_EQ(s.segment.current, 3);
  EXPECT_EQ(s.allocated_bytes.allocated, int64_t(512 + 3_MiB + 30_MiB + 512 + 2_MiB));
  EXPECT_EQ(s.allocated_bytes.freed, int64_t(512 + 3_MiB));
  // Free blocks inside split segments: 18 MiB in the 20 MiB segment, (32 MiB - 30 MiB - 512) in the big one.
  EXPECT_EQ(s.inactive_split_bytes.current, int64_t(18_MiB + (2_MiB - 512)));
  a.reset_peak_stats();
  EXPECT_EQ(a.stats().allocated_bytes.peak, s.allocated_bytes.current);
  a.free(p3);
  a.free(p4);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes.current, 0);
}

TEST(CachingAllocator, CategoriesAndOwners) {
  CachingAllocator a(make_meta_allocator(0), "meta");
  Block *w, *g, *act;
  {
    MemoryScope p(Category::Params, "llm.layers.0.mlp");
    w = a.allocate(4_MiB);
    MemoryScope gr(Category::Grads);  // keeps the owner
    g = a.allocate(4_MiB);
  }
  act = a.allocate(1000);  // outside any scope: activations, unscoped
  MemoryStats s = a.stats();
  EXPECT_EQ(s.category(Category::Params).current, int64_t(4_MiB));
  EXPECT_EQ(s.category(Category::Grads).current, int64_t(4_MiB));
  EXPECT_EQ(s.category(Category::Activations).current, 1024);
  auto owners = a.owner_stats();
  EXPECT_EQ(owners["llm.layers.0.mlp"].current, int64_t(8_MiB));
  EXPECT_EQ(owners[""].current, 1024);
  a.free(g);
  EXPECT_EQ(a.stats().category(Category::Grads).current, 0);
  EXPECT_EQ(a.stats().category(Category::Grads).peak, int64_t(4_MiB));
  std::string summary = a.memory_summary();
  EXPECT_NE(summary.find("params"), std::string::npos);
  EXPECT_NE(summary.find("llm.layers.0.mlp"), std::string::npos);
  EXPECT_NE(summary.find("fragmentation"), std::string::npos);
  a.free(w);
  a.free(act);
}

TEST(CachingAllocator, TraceRecordsEveryEvent) {
  CachingAllocator a(make_meta_allocator(0), "meta");
  std::vector<TraceEvent::Kind> kinds;
  a.set_trace([&](const TraceEvent& e) { kinds.push_back(e.kind); });
  Block* x = a.allocate(10);
  a.free(x);
  a.empty_cache();
  a.set_trace({});
  using K = TraceEvent::Kind;
  EXPECT_EQ(kinds, (std::vector<K>{K::SegmentAlloc, K::Alloc, K::Free, K::SegmentFree}));
}

TEST(CappedDevice, OutOfMemoryMessageNamesCategoriesAndOwners) {
  configure_device(Device::cpu(), {64_MiB});
  {
    Tensor embed, act;
    {
      MemoryScope s(Category::Params, "language_model.model.embed_tokens");
      embed = Tensor::empty({40 * 1024 * 1024 / 4}, DType::F32, Device::cpu());
    }
    {
      MemoryScope s(Category::Activations, "language_model.model.layers.3.mlp");
      act = Tensor::empty({12 * 1024 * 1024 / 4}, DType::F32, Device::cpu());
    }
    std::string msg;
    try {
      MemoryScope s(Category::Activations, "language_model.model.layers.4.self_attn");
      Tensor t = Tensor::empty({16 * 1024 * 1024 / 4}, DType::F32, Device::cpu());
      FAIL() << "expected OutOfMemory";
    } catch (const OutOfMemory& e) {
      msg = e.what();
      EXPECT_EQ(e.requested(), 16_MiB);
    }
    for (const char* part :
         {"out of memory", "Tried to allocate 16.00 MiB", "total capacity of 64.00 MiB", "12.00 MiB is free",
          "52.00 MiB is allocated", "reserved by headroom but unallocated", "params", "40.00 MiB", "activations",
          "12.00 MiB", "optimizer", "language_model.model.embed_tokens", "language_model.model.layers.3.mlp",
          "language_model.model.layers.4.self_attn"})
      EXPECT_NE(msg.find(part), std::string::npos) << "missing '" << part << "' in:\n" << msg;
    EXPECT_EQ(allocator_for(Device::cpu())->stats().num_ooms, 1);
  }
  configure_device(Device::cpu(), {});
}

TEST(CappedDevice, CannotReconfigureWithLiveTensors) {
  Tensor t = Tensor::empty({10}, DType::F32, Device::cpu());
  EXPECT_THROW(configure_device(Device::cpu(), {1_MiB}), Error);
}

namespace {

bool same_layout(const AllocatorSnapshot& a, const AllocatorSnapshot& b) {
  if (a.segments_made != b.segments_made || a.segments.size() != b.segments.size()) return false;
  for (std::size_t i = 0; i < a.segments.size(); ++i) {
    const auto &x = a.segments[i], &y = b.segments[i];
    if (x.id != y.id || x.small != y.small || x.size != y.size || x.blocks.size() != y.blocks.size()) return false;
    for (std::size_t j = 0; j < x.blocks.size(); ++j) {
      const auto &p = x.blocks[j], &q = y.blocks[j];
      if (p.offset != q.offset || p.size != q.size || p.requested != q.requested || p.allocated != q.allocated ||
          p.category != q.category || p.owner != q.owner)
        return false;
    }
  }
  return true;
}

// A history: small and large blocks, some freed (cached, split), tagged with categories and owners.
std::vector<Block*> make_history(CachingAllocator& a) {
  std::vector<Block*> kept;
  std::vector<Block*> gone;
  {
    MemoryScope s(Category::Params, "layers.0");
    kept.push_back(a.allocate(3000));
    gone.push_back(a.allocate(700000));
    kept.push_back(a.allocate(5_MiB));
  }
  {
    MemoryScope s(Category::Activations, "layers.1");
    gone.push_back(a.allocate(12_MiB));
    kept.push_back(a.allocate(40000));
    gone.push_back(a.allocate(3_MiB));
    gone.push_back(a.allocate(30_MiB));  // its own segment, cached once freed
  }
  for (Block* b : gone) a.free(b);
  return kept;
}

}  // namespace

TEST(CachingAllocator, AReplicaOfASnapshotIsTheSameAllocator) {
  CachingAllocator a(make_host_allocator(), "test");
  std::vector<Block*> kept = make_history(a);
  const AllocatorSnapshot s = a.snapshot();
  ASSERT_EQ(s.segments.size(), 3u);  // the small segment, a 20 MiB one (split), the cached 30 MiB one
  ASSERT_GT(a.stats().inactive_split_bytes.current, 0);
  CachingAllocator r(s, make_meta_allocator(0), "replica");
  EXPECT_TRUE(same_layout(s, r.snapshot()));
  const MemoryStats sa = a.stats(), sr = r.stats();
  EXPECT_EQ(sr.allocated_bytes.current, sa.allocated_bytes.current);
  EXPECT_EQ(sr.reserved_bytes.current, sa.reserved_bytes.current);
  EXPECT_EQ(sr.inactive_split_bytes.current, sa.inactive_split_bytes.current);
  EXPECT_EQ(sr.requested_bytes.current, sa.requested_bytes.current);
  for (Category c : kAllCategories) EXPECT_EQ(sr.category(c).current, sa.category(c).current) << category_name(c);
  // The same next decisions: a request lands at the same place in both.
  Block* x = a.allocate(2_MiB);
  Block* y = r.allocate(2_MiB);
  EXPECT_EQ(CachingAllocator::position(x), CachingAllocator::position(y));
  a.free(x);
  for (Block* b : kept) a.free(b);
}

TEST(CachingAllocator, ReplayedRequestsReachTheRealAllocatorsPeaksFromItsState) {
  // The requests of a "step", recorded on a fresh meta allocator (a dry run).
  auto step = [](CachingAllocator& a) {
    Block* a1 = a.allocate(1_MiB + 4096);
    Block* a2 = a.allocate(600000);
    a.free(a1);
    Block* a3 = a.allocate(8_MiB);
    a.free(a2);
    a.free(a3);
  };
  RequestTrace trace;
  {
    CachingAllocator dry(make_meta_allocator(0), "meta");
    dry.set_trace([&](const TraceEvent& e) { trace.record(e); });
    step(dry);
    dry.set_trace({});
  }
  trace.check();
  EXPECT_EQ(trace.unfreed(), 0u);
  // A real allocator whose cache holds what earlier steps left: its reserved peak for the same requests is
  // not the fresh dry run's, and replaying the requests from its snapshot gives exactly its peaks.
  CachingAllocator real(make_host_allocator(), "real");
  std::vector<Block*> kept = make_history(real);
  const AllocatorSnapshot start = real.snapshot();
  real.reset_peak_stats();
  step(real);
  const ReplayPeaks p = replay(start, trace, 0);
  EXPECT_EQ(p.peak_allocated, real.stats().allocated_bytes.peak);
  EXPECT_EQ(p.peak_reserved, real.stats().reserved_bytes.peak);
  CachingAllocator fresh(make_meta_allocator(0), "fresh");
  const ReplayPeaks from_nothing = replay(fresh.snapshot(), trace, 0);
  EXPECT_NE(from_nothing.peak_reserved, p.peak_reserved);
  for (Block* b : kept) real.free(b);
}

TEST(CachingAllocator, TheAllocatedPeakDependsOnTheCacheAStepStartsFromAndItsReplayKnowsIt) {
  // A large-pool block is split only when more than 1 MiB would remain (PyTorch's rule), and an allocation counts
  // its whole block: 11 MiB from nothing gets a 12 MiB segment whole (12 MiB allocated), but from a cache holding
  // a free 20 MiB segment it splits that one (11 MiB allocated). A step of an H100 run peaked 47,104 B under its
  // fresh dry run this way, from its second step on: its allocated peak is the replay's from the step's start.
  auto step = [](CachingAllocator& a) { a.free(a.allocate(11_MiB)); };
  RequestTrace trace;
  {
    CachingAllocator dry(make_meta_allocator(0), "meta");
    dry.set_trace([&](const TraceEvent& e) { trace.record(e); });
    step(dry);
    dry.set_trace({});
    EXPECT_EQ(dry.stats().allocated_bytes.peak, int64_t(12_MiB));
  }
  CachingAllocator real(make_host_allocator(), "real");
  real.free(real.allocate(5_MiB));  // an earlier step's: a 20 MiB segment, cached
  const AllocatorSnapshot start = real.snapshot();
  real.reset_peak_stats();
  step(real);
  EXPECT_EQ(real.stats().allocated_bytes.peak, int64_t(11_MiB));
  EXPECT_EQ(replay(start, trace, 0).peak_allocated, real.stats().allocated_bytes.peak);
  real.empty_cache();
}

TEST(CachingAllocator, ARepeatedStretchReplaysAsEveryRepetitionWould) {
  // A step of `n` micro-batches: the first creates the accumulated gradient, every later one makes the same
  // requests, replacing the gradient out of place (a free of the micro-batch before's block), and the update
  // frees the last gradient.
  struct Step {
    Block* grad = nullptr;
    void micro(CachingAllocator& a) {
      Block* act = a.allocate(3_MiB + 1000);
      Block* wide = a.allocate(5_MiB);
      Block* g = a.allocate(2_MiB);
      a.free(wide);
      if (grad) a.free(grad);
      grad = g;
      Block* tmp = a.allocate(700000);
      a.free(tmp);
      a.free(act);
    }
    void update(CachingAllocator& a) {
      Block* state = a.allocate(4_MiB);
      a.free(grad);
      a.free(state);
    }
  };
  const int n = 9;
  auto record = [&](bool repeat) {
    auto trace = std::make_shared<RequestTrace>();
    CachingAllocator dry(make_meta_allocator(0), "meta");
    dry.set_trace([&](const TraceEvent& e) { trace->record(e); });
    Step s;
    std::vector<std::size_t> begins;
    for (int k = 0; k < n; ++k) {
      begins.push_back(trace->requests().size());
      s.micro(dry);
      // The first micro-batch differs, and the second frees a block of the first: the third is the first
      // to repeat the one before it.
      if (repeat && k >= 1 &&
          trace->periodic(begins[std::size_t(k - 1)], begins[std::size_t(k)], trace->requests().size())) {
        EXPECT_EQ(k, 3);
        trace->repeat_last(begins[std::size_t(k)], std::size_t(n - 1 - k));
        break;
      }
    }
    s.update(dry);
    dry.set_trace({});
    trace->check();
    return trace;
  };
  const auto full = record(false), compact = record(true);
  EXPECT_LT(compact->requests().size(), full->requests().size());
  ASSERT_EQ(compact->repeats().size(), 1u);
  // From a fresh allocator and from one whose cache holds an earlier history (where the first repetitions
  // are not yet alike), the compact trace gives the full one's peaks, and those of a real run.
  CachingAllocator fresh(make_meta_allocator(0), "fresh");
  CachingAllocator real(make_host_allocator(), "real");
  std::vector<Block*> kept = make_history(real);
  for (const AllocatorSnapshot& start : {fresh.snapshot(), real.snapshot()}) {
    const ReplayPeaks a = replay(start, *full, 0), b = replay(start, *compact, 0);
    EXPECT_EQ(a.peak_allocated, b.peak_allocated);
    EXPECT_EQ(a.peak_reserved, b.peak_reserved);
  }
  real.reset_peak_stats();
  const AllocatorSnapshot start = real.snapshot();
  Step s;
  for (int k = 0; k < n; ++k) s.micro(real);
  s.update(real);
  const ReplayPeaks p = replay(start, *compact, 0);
  EXPECT_EQ(p.peak_allocated, real.stats().allocated_bytes.peak);
  EXPECT_EQ(p.peak_reserved, real.stats().reserved_bytes.peak);
  for (Block* b : kept) real.free(b);
  // Not a repetition: a stretch of other sizes, or one freeing a block from two stretches back.
  RequestTrace t;
  CachingAllocator m(make_meta_allocator(0), "meta");
  m.set_trace([&](const TraceEvent& e) { t.record(e); });
  Block* x = m.allocate(1000);
  Block* y = m.allocate(1000);
  m.free(x);
  Block* z = m.allocate(2000);
  m.free(y);
  m.free(z);
  m.set_trace({});
  EXPECT_FALSE(t.periodic(0, 2, 4));  // (alloc, alloc) then (free, alloc 2000)
  EXPECT_FALSE(t.periodic(0, 3, 6));  // (alloc 1000, alloc 1000, free) then (alloc 2000, free, free)
}

TEST(CachingAllocator, ARecordedStretchThatFreesAnOlderBlockIsRefused) {
  CachingAllocator a(make_meta_allocator(0), "meta");
  Block* before = a.allocate(1000);
  RequestTrace trace;
  a.set_trace([&](const TraceEvent& e) { trace.record(e); });
  a.free(before);
  a.set_trace({});
  EXPECT_THROW(trace.check(), Error);
}

// The planned arena (arena_plan.h): a packing whose optimum is known, the invariants on random lifetimes,
// and a recorded step whose repeated micro-batches unroll to what recording every one of them gives.
TEST(ArenaPlan, PacksAKnownOptimumAndNeverOverlapsLiveBuffers) {
  // Two phases of 200 bytes each: A and B together, then C and D together. The optimum is 200.
  const std::vector<Lifetime> known = {{100, 0, 3}, {100, 1, 2}, {50, 4, 6}, {150, 4, 5}};
  std::size_t arena = 0;
  const std::vector<std::size_t> at = pack_buffers(known, &arena);
  EXPECT_EQ(arena, 200u);
  EXPECT_EQ(live_peak(known), 200u);
  EXPECT_EQ(at[3], 0u);    // the largest first, at the bottom
  EXPECT_EQ(at[0], 0u);    // A never lives with D: the same place
  EXPECT_EQ(at[1], 100u);  // B above A
  EXPECT_EQ(at[2], 150u);  // C above D
  // Z takes Y's addresses once Y is dead; V fits the gap Y leaves below W while both live. Optimum: 700.
  const std::vector<Lifetime> gaps = {{300, 0, 9}, {200, 0, 4}, {300, 5, 9}, {100, 0, 9}, {100, 0, 4}};
  const std::vector<std::size_t> g = pack_buffers(gaps, &arena);
  EXPECT_EQ(g, (std::vector<std::size_t>{0, 300, 300, 600, 500}));
  EXPECT_EQ(arena, 700u);
  EXPECT_EQ(live_peak(gaps), 700u);
  uint64_t seed = 7;
  auto next = [&] { return (seed = seed * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
  std::vector<Lifetime> random;
  for (int i = 0; i < 400; ++i) {
    const std::size_t first = next() % 1000;
    random.push_back({512 * (1 + next() % 64), first, first + next() % 200});
  }
  const std::vector<std::size_t> o = pack_buffers(random, &arena);
  EXPECT_GE(arena, live_peak(random));
  for (std::size_t i = 0; i < random.size(); ++i)
    for (std::size_t j = i + 1; j < random.size(); ++j) {
      const bool together = random[i].first <= random[j].last && random[j].first <= random[i].last;
      const bool overlap = o[i] < o[j] + random[j].bytes && o[j] < o[i] + random[i].bytes;
      ASSERT_FALSE(together && overlap) << i << " and " << j;
    }
  std::printf("random lifetimes: arena %zu B, live peak %zu B (%.1f%% above)\n", arena, live_peak(random),
              100.0 * double(arena - live_peak(random)) / double(live_peak(random)));
}

namespace {

// pack_buffers as a scan over every placed buffer for each one placed (quadratic): the placement pack_buffers must
// reproduce with its index of lifetimes.
std::vector<std::size_t> quadratic_pack(const std::vector<Lifetime>& buffers, std::size_t* arena) {
  auto end_of = [](const Lifetime& b) { return b.last + (b.count > 1 ? (b.count - 1) * b.period : 0); };
  auto span = [&](std::size_t i) { return double(end_of(buffers[i]) - buffers[i].first + 1); };
  const std::vector<std::function<double(std::size_t)>> keys = {
      [&](std::size_t i) { return double(buffers[i].bytes); },
      [&](std::size_t i) { return double(buffers[i].bytes) * span(i); },
      [&](std::size_t i) { return span(i); },
  };
  std::vector<std::size_t> best;
  std::size_t best_arena = SIZE_MAX;
  for (const auto& key : keys) {
    std::vector<std::size_t> order(buffers.size());
    std::iota(order.begin(), order.end(), std::size_t(0));
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      if (key(a) != key(b)) return key(a) > key(b);
      if (buffers[a].bytes != buffers[b].bytes) return buffers[a].bytes > buffers[b].bytes;
      return buffers[a].first < buffers[b].first;
    });
    for (bool first_fit : {false, true}) {
      std::vector<std::size_t> offset(buffers.size(), 0), placed;
      std::size_t top = 0;
      for (std::size_t i : order) {
        const Lifetime& b = buffers[i];
        std::size_t at = 0, best_gap = SIZE_MAX, end = 0;
        bool found = false;
        for (std::size_t j : placed) {
          if (!live_together(buffers[j], b)) continue;
          if (offset[j] >= end && offset[j] - end >= b.bytes && offset[j] - end < best_gap && !(first_fit && found))
            at = end, best_gap = offset[j] - end, found = true;
          end = std::max(end, offset[j] + buffers[j].bytes);
        }
        offset[i] = found ? at : end;
        top = std::max(top, offset[i] + b.bytes);
        placed.insert(std::upper_bound(placed.begin(), placed.end(), i,
                                       [&](std::size_t x, std::size_t y) { return offset[x] < offset[y]; }),
                      i);
      }
      if (top < best_arena) best = offset, best_arena = top;
    }
  }
  *arena = buffers.empty() ? 0 : best_arena;
  return best;
}

}  // namespace

// The index that finds the buffers a buffer may be alive with, and the gaps read off a sort of those it meets or a
// scan of every placed buffer kept by offset in runs, change no offset: random steps of plain buffers, periodic ones
// of one period (accumulated micro-batches; their copies indexed one by one) and of two periods (indexed by their
// whole spans), with equal sizes and zero-byte buffers to test the ties; the last three of 1,500 buffers, whose
// placed buffers fill several runs. The six placements pack_buffers tries share the threads: on 1, 2 and 3 threads
// it keeps the same one, the first of the smallest arenas as the scan in order does.
TEST(ArenaPlan, TheLifetimeIndexPlacesEveryBufferWhereTheQuadraticScanDoes) {
  const int threads = omp_get_max_threads();
  uint64_t seed = 11;
  auto next = [&] { return (seed = seed * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
  for (int trial = 0; trial < 36; ++trial) {
    const int periods = trial % 3;  // 0: none, 1: one period, 2: two
    const int n = trial < 12 ? 3 + trial : trial < 33 ? 300 : 1500, times = trial < 12 ? 40 : 2000;
    std::vector<Lifetime> buffers;
    for (int i = 0; i < n; ++i) {
      const std::size_t first = next() % std::size_t(times), bytes = next() % 8 == 0 ? 0 : 512 * (1 + next() % 16);
      Lifetime l{bytes, first, first + next() % (next() % 4 == 0 ? std::size_t(times) : 60)};
      if (periods > 0 && next() % 3 == 0) {
        l.period = 100 * (1 + (periods == 2 ? next() % 2 : 0));
        l.last = l.first + next() % l.period;
        l.count = 2 + next() % (next() % 4 == 0 ? 20 : 4);  // past 8: the copies between the first and last 4
      }
      buffers.push_back(l);
    }
    std::size_t arena = 0, expected_arena = 0;
    omp_set_num_threads(1 + trial / 3 % 3);  // every kind of period on each thread count
    const std::vector<std::size_t> got = pack_buffers(buffers, &arena);
    omp_set_num_threads(threads);
    const std::vector<std::size_t> expected = quadratic_pack(buffers, &expected_arena);
    EXPECT_EQ(arena, expected_arena) << "trial " << trial << ", " << 1 + trial / 3 % 3 << " threads";
    EXPECT_EQ(got, expected) << "trial " << trial << ", " << 1 + trial / 3 % 3 << " threads";
    for (std::size_t i = 0; i < buffers.size(); ++i)
      for (std::size_t j = i + 1; j < buffers.size(); ++j)
        ASSERT_FALSE(live_together(buffers[i], buffers[j]) && got[i] < got[j] + buffers[j].bytes &&
                     got[j] < got[i] + buffers[i].bytes)
            << "trial " << trial << ": " << i << " and " << j;
  }
}

TEST(ArenaPlan, RepeatedMicroBatchesUnrollAsIfRecorded) {
  // One "micro-batch": an activation kept across the next one (freed there), two temporaries; a gradient
  // allocated before them stays (persistent).
  auto run = [](int micro, bool repeat) {
    CachingAllocator a(make_meta_allocator(0), "meta");
    RequestTrace trace;
    a.set_trace([&](const TraceEvent& e) { trace.record(e); });
    Block* grad = a.allocate(3000);
    Block* carried = a.allocate(5000);  // as if the micro-batch before the first had left it
    std::vector<std::size_t> begins;
    for (int m = 0; m < micro; ++m) {
      begins.push_back(trace.requests().size());
      Block* act = a.allocate(5000);
      Block* t1 = a.allocate(1000);
      a.free(carried);
      a.free(t1);
      Block* t2 = a.allocate(700);
      a.free(t2);
      carried = act;
      if (repeat && m == 2) {
        EXPECT_TRUE(trace.periodic(begins[1], begins[2], trace.requests().size()));
        trace.repeat_last(begins[2], std::size_t(micro - 3));
        break;
      }
    }
    a.free(carried);  // repeated: the recorded pass's block stands for the last copy
    a.set_trace({});
    a.free(grad);  // after the recording: the stretch leaves it allocated
    const ArenaPlan planned = plan_arena(trace);
    // With the layout already made, the same plan without packing again.
    const ArenaLayout layout = layout_arena(trace);
    const ArenaPlan reused = plan_arena(trace, &layout);
    EXPECT_EQ(reused.arena, planned.arena);
    EXPECT_EQ(reused.live_peak, planned.live_peak);
    EXPECT_EQ(reused.persistent, planned.persistent);
    EXPECT_EQ(reused.buffers, planned.buffers);
    EXPECT_EQ(reused.requested_peak, planned.requested_peak);
    return planned;
  };
  for (int micro : {3, 4, 8}) {
    const ArenaPlan recorded = run(micro, false), repeated = run(micro, true);
    if (micro <= 5) {  // two repetitions are unrolled
      EXPECT_EQ(repeated.buffers, recorded.buffers) << micro;
    }
    EXPECT_EQ(repeated.arena, recorded.arena) << micro;
    EXPECT_EQ(repeated.live_peak, recorded.live_peak) << micro;
    EXPECT_EQ(repeated.persistent, recorded.persistent) << micro;
    EXPECT_EQ(recorded.persistent, 3072u);
    EXPECT_EQ(recorded.live_peak, 2 * 5120u + 1024u);  // two activations and a temporary at once
  }
}
