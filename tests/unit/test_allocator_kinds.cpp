// memory.allocator: expandable and planned on scripted requests. Expandable segments map and unmap 2 MiB pages
// (real mmap on a capped host, counted on meta) and never strand a split remainder; a planned stretch takes its
// requests from an arena at the offsets its recording worked out, no two live buffers overlapping (checked by
// writing every buffer and reading it back), with the meta device's recording, the real run and a replay
// agreeing on every peak; a plan the run departs from falls back without losing a byte.
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "core/memory/arena_plan.h"
#include "core/memory/caching_allocator.h"
#include "core/memory/replay.h"

using namespace hr;
using namespace hr::core;

namespace {
using Block = CachingAllocator::Block;

char* ptr(Block* b) {
  return static_cast<char*>(CachingAllocator::data(b));
}

// Fills a block with a pattern of its own and checks it later: two live blocks sharing bytes fail the check.
struct Painter {
  std::map<Block*, unsigned char> tags;
  unsigned char next = 1;
  void paint(Block* b, std::size_t bytes) {
    tags[b] = next;
    std::memset(ptr(b), next, bytes);
    next = next == 255 ? 1 : next + 1;
  }
  bool intact(Block* b, std::size_t bytes) const {
    const unsigned char t = tags.at(b);
    for (std::size_t i = 0; i < bytes; ++i)
      if (static_cast<unsigned char>(ptr(b)[i]) != t) return false;
    return true;
  }
};

}  // namespace

TEST(Expandable, MapsPagesOnDemandAndUnmapsFreePagesOnEmptyCache) {
  CachingAllocator a(make_capped_host_allocator(64_MiB), "test", AllocatorKind::Expandable);
  Block* x = a.allocate(3_MiB);
  EXPECT_EQ(a.stats().reserved_bytes.current, int64_t(4_MiB));  // two pages
  std::memset(ptr(x), 1, 3_MiB);                                // the pages are really there
  Block* y = a.allocate(1_MiB + 512_KiB);                       // right after x: page 1 again, and page 2
  EXPECT_EQ(ptr(y), ptr(x) + 3_MiB);
  EXPECT_EQ(a.stats().reserved_bytes.current, int64_t(6_MiB));
  std::memset(ptr(y), 2, 1_MiB + 512_KiB);
  a.free(x);
  EXPECT_EQ(a.stats().reserved_bytes.current, int64_t(6_MiB));  // cached, as PyTorch keeps them
  EXPECT_EQ(a.stats().inactive_split_bytes.current, int64_t(6_MiB - (1_MiB + 512_KiB)));
  a.empty_cache();  // page 0 holds nothing; pages 1 and 2 hold y
  EXPECT_EQ(a.stats().reserved_bytes.current, int64_t(4_MiB));
  EXPECT_EQ(a.raw().used(), 4_MiB);
  EXPECT_EQ(static_cast<unsigned char>(ptr(y)[0]), 2);
  Block* z = a.allocate(2_MiB);  // fits page 0 again, after mapping it
  EXPECT_EQ(ptr(z), ptr(y) - 3_MiB);
  EXPECT_EQ(a.stats().reserved_bytes.current, int64_t(6_MiB));
  a.free(y);
  a.free(z);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes.current, 0);
  EXPECT_EQ(a.raw().used(), 0u);
}

TEST(Expandable, ALargeBlockStrandsNoRemainder) {
  // A freed 11 MiB block reused for 10.5 MiB: the caching allocator keeps the 12 MiB segment and a 1.5 MiB
  // split block that only a small enough request can use; an expandable segment maps just what blocks need.
  auto run = [](AllocatorKind kind) {
    CachingAllocator a(make_meta_allocator(0), "meta", kind);
    Block* big = a.allocate(11_MiB);
    a.free(big);
    Block* b = a.allocate(10_MiB + 512_KiB);
    Block* c = a.allocate(3_MiB);
    const MemoryStats s = a.stats();
    a.free(b);
    a.free(c);
    return s;
  };
  const MemoryStats caching = run(AllocatorKind::Caching), expandable = run(AllocatorKind::Expandable);
  EXPECT_EQ(caching.reserved_bytes.current, int64_t(12_MiB + 20_MiB));
  EXPECT_EQ(expandable.reserved_bytes.current, int64_t(14_MiB));  // 13.5 MiB in 2 MiB pages
  EXPECT_EQ(expandable.allocated_bytes.current, int64_t(13_MiB + 512_KiB));
}

TEST(Expandable, RetryUnmapsCachedPagesOfTheOtherPool) {
  CachingAllocator a(make_capped_host_allocator(4_MiB), "test", AllocatorKind::Expandable);
  std::vector<Block*> small;
  for (int i = 0; i < 4; ++i) small.push_back(a.allocate(512_KiB));
  for (Block* b : small) a.free(b);
  EXPECT_EQ(a.stats().reserved_bytes.current, int64_t(2_MiB));  // the small pool's page, cached
  Block* big = a.allocate(3_MiB);                               // needs two pages: only after unmapping it
  EXPECT_EQ(a.stats().num_alloc_retries, 1);
  EXPECT_EQ(a.stats().reserved_bytes.current, int64_t(4_MiB));
  EXPECT_THROW(a.allocate(2_MiB), OutOfMemory);
  a.free(big);
}

// A capacity under one 2 MiB page holds no page at all: every request is out of memory (what the planner turns into
// "does not fit"), not an error about address space.
TEST(Expandable, ACapacityUnderOnePageIsOutOfMemory) {
  CachingAllocator a(make_capped_host_allocator(1_MiB + 512_KiB), "test", AllocatorKind::Expandable);
  EXPECT_THROW(a.allocate(512), OutOfMemory);
  EXPECT_EQ(a.stats().num_ooms, 1);
  EXPECT_EQ(a.stats().reserved_bytes.current, 0);
}

TEST(Expandable, MetaMirrorsTheHostAndAReplicaReplaysItsPeaks) {
  uint64_t seed = 11;
  auto next = [&] { return (seed = seed * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
  std::vector<std::pair<bool, std::size_t>> script;  // (alloc, bytes) or (free, which live block)
  for (int i = 0; i < 400; ++i) {
    if (next() % 3)
      script.push_back({true, std::size_t(512 + next() % (6 << 20))});
    else
      script.push_back({false, std::size_t(next())});
  }
  auto run = [&](CachingAllocator& a, std::size_t from, std::size_t to, std::vector<Block*>& live) {
    for (std::size_t i = from; i < to; ++i) {
      const auto& [alloc, n] = script[i];
      if (alloc) {
        live.push_back(a.allocate(n));
      } else if (!live.empty()) {
        const std::size_t k = n % live.size();
        a.free(live[k]);
        live.erase(live.begin() + std::ptrdiff_t(k));
      }
    }
  };
  CachingAllocator host(make_capped_host_allocator(1_GiB), "host", AllocatorKind::Expandable);
  CachingAllocator meta(make_meta_allocator(1_GiB), "meta", AllocatorKind::Expandable);
  std::vector<Block*> lh, lm;
  run(host, 0, 200, lh);
  run(meta, 0, 200, lm);
  EXPECT_EQ(host.snapshot(), meta.snapshot());
  // The second half recorded on the host and replayed on a replica of where it started.
  const AllocatorSnapshot start = host.snapshot();
  host.reset_peak_stats();
  RequestTrace trace;
  host.set_trace([&](const TraceEvent& e) { trace.record(e); });
  std::vector<Block*> fresh;
  for (std::size_t i = 200; i < script.size(); ++i) {
    const auto& [alloc, n] = script[i];
    if (alloc)
      fresh.push_back(host.allocate(n));
    else if (!fresh.empty()) {
      const std::size_t k = n % fresh.size();
      host.free(fresh[k]);
      fresh.erase(fresh.begin() + std::ptrdiff_t(k));
    }
  }
  host.set_trace({});
  const ReplayPeaks r = replay(start, trace, 1_GiB);
  EXPECT_EQ(r.peak_allocated, host.stats().allocated_bytes.peak);
  EXPECT_EQ(r.peak_reserved, host.stats().reserved_bytes.peak);
  EXPECT_GT(host.stats().reserved_bytes.peak, host.stats().allocated_bytes.peak);
  EXPECT_EQ(CachingAllocator(start, make_meta_allocator(0), "replica").snapshot(), start);
  for (Block* b : fresh) host.free(b);
  for (Block* b : lh) host.free(b);
  for (Block* b : lm) meta.free(b);
}

namespace {

// A training step in miniature: gradients allocated by the first micro-batch and kept; per micro-batch an
// activation that lives into the next, temporaries, and an optimizer temporary at the end.
struct MiniStep {
  int micro = 4;
  bool repeat = false;  // record micro-batches from the fourth on as repetitions (as the planner does)
  std::vector<std::size_t> begins;

  std::vector<Block*> run(CachingAllocator& a, RequestTrace* trace, Painter* paint) {
    std::vector<Block*> kept;
    auto alloc = [&](std::size_t n) {
      Block* b = a.allocate(n);
      if (paint) paint->paint(b, n);
      return b;
    };
    std::map<Block*, std::size_t> sizes;
    auto check_free = [&](Block* b, std::size_t n) {
      if (paint) {
        EXPECT_TRUE(paint->intact(b, n)) << "a live buffer was overwritten";
      }
      a.free(b);
    };
    Block* carried = alloc(5000);
    for (int m = 0; m < micro; ++m) {
      if (trace) begins.push_back(trace->requests().size());
      Block* act = alloc(70000);
      Block* t1 = alloc(12000);
      if (m == 0) kept.push_back(alloc(30000));  // a gradient: the stretch leaves it allocated
      check_free(carried, m == 0 ? 5000 : 70000);
      Block* t2 = alloc(9000);
      check_free(t1, 12000);
      check_free(t2, 9000);
      carried = act;
      if (repeat && trace && m == 3 && micro > 4) {
        EXPECT_TRUE(trace->periodic(begins[2], begins[3], trace->requests().size()));
        trace->repeat_last(begins[3], std::size_t(micro - 4));
        break;
      }
    }
    Block* opt = alloc(40000);
    check_free(opt, 40000);
    check_free(carried, 70000);
    return kept;
  }
};

}  // namespace

TEST(Planned, TheRecordingTheRealRunAndTheReplayAgree) {
  for (int micro : {1, 4, 9}) {
    // The meta device records the stretch (with repetitions) and works out the layout from it.
    CachingAllocator meta(make_meta_allocator(0), "meta", AllocatorKind::Planned);
    RequestTrace trace;
    MiniStep recorded{micro, true, {}};
    meta.begin_stretch(nullptr);
    meta.set_trace([&](const TraceEvent& e) { trace.record(e); });
    std::vector<Block*> kept_meta = recorded.run(meta, &trace, nullptr);
    meta.set_trace({});
    trace.check();
    auto layout = std::make_shared<const ArenaLayout>(layout_arena(trace));
    meta.end_stretch(layout);
    const AllocatorSnapshot after_meta = meta.snapshot();

    // The real run follows it, every micro-batch of it, on a host device.
    CachingAllocator host(make_capped_host_allocator(64_MiB), "host", AllocatorKind::Planned);
    const AllocatorSnapshot start = host.snapshot();
    Painter paint;
    std::vector<int> segment_events;
    host.set_trace([&](const TraceEvent& e) {
      if (e.kind == TraceEvent::Kind::SegmentAlloc) segment_events.push_back(int(e.size));
    });
    host.begin_stretch(layout);
    MiniStep real{micro, false, {}};
    std::vector<Block*> kept_host = real.run(host, nullptr, &paint);
    host.end_stretch();
    host.set_trace({});
    EXPECT_FALSE(host.stretch_broken()) << micro;
    // No device malloc during the step but the arena and the gradient's own segment.
    ASSERT_EQ(segment_events.size(), 2u) << micro;
    EXPECT_EQ(std::size_t(segment_events[0]), layout->arena);
    EXPECT_EQ(segment_events[1], 30208);
    const MemoryStats hs = host.stats(), ms = meta.stats();
    EXPECT_EQ(hs.allocated_bytes.peak, ms.allocated_bytes.peak) << micro;
    EXPECT_EQ(hs.reserved_bytes.peak, ms.reserved_bytes.peak) << micro;
    EXPECT_EQ(hs.reserved_bytes.current, int64_t(layout->arena + 30208)) << micro;
    EXPECT_EQ(host.snapshot(), after_meta) << micro;
    const ReplayPeaks r = replay(start, trace, 64_MiB, layout);
    EXPECT_EQ(r.peak_allocated, hs.allocated_bytes.peak) << micro;
    EXPECT_EQ(r.peak_reserved, hs.reserved_bytes.peak) << micro;
    // Two activations, a temporary and the gradient at once at most: the arena holds the transient ones.
    const ArenaPlan plan = plan_arena(trace);
    EXPECT_EQ(plan.arena, layout->arena);
    EXPECT_GE(plan.arena, plan.live_peak);
    EXPECT_EQ(plan.persistent, 30208u);
    // The step again reuses the arena: nothing new is reserved.
    host.reset_peak_stats();
    host.begin_stretch(layout);
    std::vector<Block*> again = MiniStep{micro, false, {}}.run(host, nullptr, &paint);
    host.end_stretch();
    EXPECT_EQ(host.stats().reserved_bytes.peak, int64_t(layout->arena + 2 * 30208)) << micro;
    for (Block* b : again) host.free(b);
    for (Block* b : kept_host) host.free(b);
    for (Block* b : kept_meta) meta.free(b);
  }
}

namespace {

// A padding-free step in miniature: every buffer's size follows the step's token count, the requests do not.
// `micro` micro-batches, each an activation kept into the next and two temporaries; a gradient made by the first
// and kept; an optimizer temporary at the end. The trace recorded on a meta device (`trace`), or a real run.
std::vector<Block*> token_step(CachingAllocator& a, std::size_t tokens, int micro, Painter* paint,
                               RequestTrace* trace = nullptr) {
  std::vector<Block*> kept;
  auto alloc = [&](std::size_t n) {
    Block* b = a.allocate(n);
    if (paint) paint->paint(b, n);
    return b;
  };
  auto done = [&](Block* b, std::size_t n) {
    if (paint) {
      EXPECT_TRUE(paint->intact(b, n)) << "a live buffer was overwritten";
    }
    a.free(b);
  };
  if (trace) a.set_trace([&](const TraceEvent& e) { trace->record(e); });
  const std::size_t act = 700 * tokens, t1 = 130 * tokens, t2 = 90 * tokens;
  Block* carried = alloc(4000);
  std::size_t carried_bytes = 4000;
  for (int m = 0; m < micro; ++m) {
    Block* x = alloc(act);
    Block* y = alloc(t1);
    if (m == 0) kept.push_back(alloc(30000));
    done(carried, carried_bytes);
    Block* z = alloc(t2);
    done(y, t1);
    done(z, t2);
    carried = x, carried_bytes = act;
  }
  Block* opt = alloc(40000);
  done(opt, 40000);
  done(carried, carried_bytes);
  if (trace) a.set_trace({});
  return kept;
}

// The requests of a token_step, as the meta device records them in a planned stretch.
std::shared_ptr<RequestTrace> record_token_step(std::size_t tokens, int micro) {
  auto trace = std::make_shared<RequestTrace>();
  CachingAllocator meta(make_meta_allocator(0), "meta", AllocatorKind::Planned);
  meta.begin_stretch(nullptr);
  std::vector<Block*> kept = token_step(meta, tokens, micro, nullptr, trace.get());
  trace->check();
  meta.end_stretch(std::make_shared<const ArenaLayout>(layout_arena(*trace)));
  for (Block* b : kept) meta.free(b);
  return trace;
}

}  // namespace

// A step whose every request is no larger than a kept step's runs in that step's layout, with its own sizes: its
// buffers where the kept step's were, no two live ones overlapping, the arena already held not grown, and its
// replay from the real allocator's state the real run's peaks. A larger request, another sequence of requests, or
// a kept arena larger than the allocator holds gets a layout packed anew.
TEST(Planned, AStepNoLargerThanAKeptOneRunsInItsLayout) {
  ArenaLayouts layouts;
  const auto t100 = record_token_step(100, 3), t110 = record_token_step(110, 3), t90 = record_token_step(90, 3);
  const auto l100 = layouts.layout_of(*t100, 0);
  EXPECT_EQ(layouts.packed(), 1u);
  const auto l110 = layouts.layout_of(*t110, SIZE_MAX);  // larger: packed anew
  EXPECT_EQ(layouts.packed(), 2u);
  ASSERT_LT(l100->arena, l110->arena);
  EXPECT_EQ(layouts.layout_of(*t90, l100->arena - 1)->arena, layout_arena(*t90).arena);  // held too little: packed
  EXPECT_EQ(layouts.packed(), 3u);
  EXPECT_EQ(layouts.reused(), 0u);

  ArenaLayouts two;  // without the 90-token step's own layout kept: the smallest kept arena it fits, 100's
  two.layout_of(*t110, 0);
  two.layout_of(*t100, 0);
  const auto l90 = two.layout_of(*t90, l110->arena);
  EXPECT_EQ(two.reused(), 1u);
  EXPECT_EQ(two.packed(), 2u);
  EXPECT_EQ(l90->arena, l100->arena);
  ASSERT_EQ(l90->recorded.size(), t90->requests().size());
  for (std::size_t i = 0; i < t90->requests().size(); ++i) {
    const AllocRequest& r = t90->requests()[i];
    EXPECT_EQ(l90->recorded[i].alloc, r.alloc) << i;
    EXPECT_EQ(l90->recorded[i].offset, l100->recorded[i].offset) << i;
    EXPECT_EQ(l90->recorded[i].bytes, r.alloc ? round_size(r.bytes) : 0) << i;
  }

  // The real 90-token step in that layout, after the 100-token step has grown the arena.
  CachingAllocator host(make_capped_host_allocator(64_MiB), "host", AllocatorKind::Planned);
  Painter paint;
  host.begin_stretch(l100);
  std::vector<Block*> kept = token_step(host, 100, 3, &paint);
  host.end_stretch();
  EXPECT_FALSE(host.stretch_broken());
  EXPECT_EQ(host.arena_bytes(), l100->arena);
  host.reset_peak_stats();
  const AllocatorSnapshot start = host.snapshot();
  host.begin_stretch(l90);
  std::vector<Block*> again = token_step(host, 90, 3, &paint);
  host.end_stretch();
  EXPECT_FALSE(host.stretch_broken()) << "a request of the 90-token step left the layout";
  EXPECT_EQ(host.arena_bytes(), l100->arena);
  const ReplayPeaks r = replay(start, *t90, 64_MiB, l90);
  EXPECT_EQ(r.peak_allocated, host.stats().allocated_bytes.peak);
  EXPECT_EQ(r.peak_reserved, host.stats().reserved_bytes.peak);
  for (Block* b : again) host.free(b);
  for (Block* b : kept) host.free(b);

  // Another sequence of requests (a micro-batch more), smaller sizes or not: its own layout.
  const auto other = record_token_step(50, 4);
  EXPECT_EQ(two.layout_of(*other, SIZE_MAX)->arena, layout_arena(*other).arena);
  EXPECT_EQ(two.packed(), 3u);
  // Two kept at most, the oldest dropped: 110's is gone when a 105-token step comes (packed anew, and kept in
  // place of 100's), which a 90-token step then takes.
  ArenaLayouts kept_two(2);
  kept_two.layout_of(*t110, 0);
  kept_two.layout_of(*t100, 0);
  kept_two.layout_of(*other, 0);
  const auto t105 = record_token_step(105, 3);
  const auto l105 = kept_two.layout_of(*t105, SIZE_MAX);
  EXPECT_EQ(l105->arena, layout_arena(*t105).arena);
  EXPECT_EQ(kept_two.reused(), 0u);
  EXPECT_EQ(kept_two.layout_of(*t90, SIZE_MAX)->arena, l105->arena);
  EXPECT_EQ(kept_two.reused(), 1u);
}

TEST(Planned, ARunThatDepartsFromThePlanFallsBackAndKeepsItsBlocks) {
  CachingAllocator meta(make_meta_allocator(0), "meta", AllocatorKind::Planned);
  RequestTrace trace;
  meta.begin_stretch(nullptr);
  meta.set_trace([&](const TraceEvent& e) { trace.record(e); });
  Block* a = meta.allocate(4096);
  Block* b = meta.allocate(8192);
  meta.free(a);
  meta.free(b);
  meta.set_trace({});
  auto layout = std::make_shared<const ArenaLayout>(layout_arena(trace));
  meta.end_stretch(layout);
  EXPECT_EQ(layout->arena, 12288u);

  CachingAllocator host(make_capped_host_allocator(1_MiB), "host", AllocatorKind::Planned);
  host.begin_stretch(layout);
  Block* x = host.allocate(4096);  // as planned: in the arena
  std::memset(ptr(x), 7, 4096);
  Block* y = host.allocate(100);  // not the plan's 8192: the plan is broken, y gets a segment
  EXPECT_TRUE(host.stretch_broken());
  host.end_stretch();  // x is still allocated: the arena becomes an ordinary segment holding it
  EXPECT_EQ(static_cast<unsigned char>(ptr(x)[4095]), 7);
  EXPECT_EQ(host.arena_size(), 0u);
  EXPECT_EQ(host.stats().allocated_bytes.current, int64_t(4096 + 512));
  EXPECT_EQ(host.stats().reserved_bytes.current, int64_t(12288 + 512));
  Block* w = host.allocate(8192);  // the arena's free rest serves it: where the plan had b, below x
  EXPECT_EQ(ptr(w) + 8192, ptr(x));
  host.free(x);
  host.free(y);
  host.free(w);
  host.empty_cache();
  EXPECT_EQ(host.stats().reserved_bytes.current, 0);
  EXPECT_EQ(host.raw().used(), 0u);
  EXPECT_THROW(host.begin_stretch(nullptr), Error);  // only the meta device records
}

TEST(Planned, AnArenaThatDoesNotFitRetriesThenRunsOutOfMemory) {
  RequestTrace trace;
  CachingAllocator meta(make_meta_allocator(0), "meta", AllocatorKind::Planned);
  meta.begin_stretch(nullptr);
  meta.set_trace([&](const TraceEvent& e) { trace.record(e); });
  meta.free(meta.allocate(3_MiB));
  meta.set_trace({});
  auto layout = std::make_shared<const ArenaLayout>(layout_arena(trace));
  meta.end_stretch(layout);
  CachingAllocator host(make_capped_host_allocator(4_MiB), "host", AllocatorKind::Planned);
  host.free(host.allocate(2_MiB));  // cached outside a stretch: released by the retry
  host.begin_stretch(layout);
  EXPECT_EQ(host.stats().num_alloc_retries, 1);
  host.free(host.allocate(3_MiB));
  host.end_stretch();
  Block* keep = host.allocate(1_MiB + 512);
  host.empty_cache();  // outside a stretch the arena goes back too
  EXPECT_EQ(host.stats().reserved_bytes.current, int64_t(1_MiB + 512));
  auto bigger = std::make_shared<ArenaLayout>(*layout);
  bigger->arena = 3_MiB + 512;
  EXPECT_THROW(host.begin_stretch(bigger), OutOfMemory);
  EXPECT_EQ(host.stats().num_ooms, 1);
  host.free(keep);
}

TEST(ArenaPlan, PeriodicBuffersMeetTheirNeighboursOnly) {
  // Period 10: copies at [0,4], [10,14], ... A copy living [5,12] meets the next copy of itself.
  const Lifetime a{100, 0, 4, 10, 5}, b{100, 5, 9, 10, 5}, c{100, 5, 12, 10, 5};
  EXPECT_FALSE(live_together(a, b));
  EXPECT_TRUE(live_together(a, c));  // c's copy 0 [5,12] meets a's copy 1 [10,14]
  EXPECT_TRUE(live_together(c, c));
  EXPECT_FALSE(live_together(a, Lifetime{1, 50, 60}));  // after the last copy [40,44]
  EXPECT_TRUE(live_together(a, Lifetime{1, 44, 60}));
  EXPECT_FALSE(live_together(b, Lifetime{1, 10, 14}));
  std::size_t arena = 0;
  pack_buffers({a, b, c}, &arena);
  EXPECT_EQ(arena, 200u);  // a and b share; c needs its own
  EXPECT_EQ(live_peak({a, b, c}), 200u);
}
