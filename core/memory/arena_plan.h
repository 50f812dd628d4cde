// A static memory plan of one recorded stretch (a training step's requests from its dry run), the way
// ggml-alloc, TFLite's arena planner and XLA's buffer assignment place buffers: every request freed within the
// stretch gets an offset in one arena so that no two buffers alive at the same time overlap; what stays
// allocated at its end (new persistent states) keeps a block of its own. The arena's size against the peak of
// the live bytes says how much a planned allocator would waste where the caching allocator keeps
// cached and split blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/memory/replay.h"

namespace hr::core {

// A buffer's size and lifetime: alive from request `first` to request `last` (inclusive). A periodic buffer (the
// same request in every other repetition of an accumulated micro-batch) lives `count` times, each `period`
// requests after the one before, at one offset.
struct Lifetime {
  std::size_t bytes = 0, first = 0, last = 0;
  std::size_t period = 0, count = 1;
};

// Whether two buffers are ever alive at the same time.
bool live_together(const Lifetime& a, const Lifetime& b);

// Offsets for `buffers` in one arena, no two overlapping in both address and lifetime: greedy in a few orders
// (by size, largest first and earlier first among equals, and two more), each buffer at the lowest best-fitting
// or the lowest fitting gap between the buffers already placed that it is ever alive with, else above them; the
// smallest arena of those is kept. `arena` receives the arena's size.
std::vector<std::size_t> pack_buffers(const std::vector<Lifetime>& buffers, std::size_t* arena);

// The most bytes alive at one time: no arena can be smaller.
std::size_t live_peak(const std::vector<Lifetime>& buffers);

// Where each request of a recorded stretch goes when the stretch runs with `memory.allocator: planned`: an offset
// in the arena for every request the stretch frees, `kPersistent` for what it leaves allocated (its own
// segment). A repeated sub-stretch (accumulated micro-batches) runs `times` more copies than were recorded; its
// even and odd copies take the offsets of the first and second recorded copy (a buffer lives at most into the
// next copy), and the last copy's buffers that live past the repetitions have offsets of their own.
struct ArenaLayout {
  static constexpr std::size_t kPersistent = SIZE_MAX;
  struct Entry {
    bool alloc = true;
    std::size_t bytes = 0;   // rounded (allocations)
    std::size_t offset = 0;  // in the arena, or kPersistent (allocations)
  };
  struct Body {
    std::size_t prev = 0, begin = 0, end = 0, times = 0;  // as RequestTrace::Repeat; prev = begin - (end - begin)
    std::vector<std::size_t> last;  // per request of a copy: the last copy's offset where it differs, else kNone
  };
  static constexpr std::size_t kNone = SIZE_MAX - 1;
  std::size_t arena = 0;
  std::vector<Entry> recorded;  // per recorded request
  std::vector<Body> bodies;
  std::size_t requests = 0;  // in a run: the recorded requests and every repetition
  // Request `r` of a run of the stretch (counting allocations and frees from its start).
  Entry at(std::size_t r) const;
};

ArenaLayout layout_arena(const RequestTrace& trace);

// The layouts of a run's stretches, kept for the stretches after them. A padding-free step makes the requests of
// the steps before it (the same ops, the same frees, in the same order) on other token counts, and packing its
// buffers anew is most of its dry run (~2% of a small model's CPU step). A stretch whose every request is no larger
// than the same request of a kept stretch takes that one's offsets (its buffers each lie inside the earlier one's
// and live as long: none meets another) with its own sizes; the kept one's arena was laid out before, so an
// allocator that has held it holds this one without growing.
class ArenaLayouts {
 public:
  explicit ArenaLayouts(std::size_t kept = 16) : kept_(kept) {}
  // The layout of `trace`: of the kept layouts whose requests it fits, the one with the smallest arena of at most
  // `within` bytes (the arena its allocator holds already), else its own, packed and kept (the oldest dropped).
  std::shared_ptr<const ArenaLayout> layout_of(const RequestTrace& trace, std::size_t within);
  std::size_t packed() const { return packed_; }
  std::size_t reused() const { return reused_; }

 private:
  struct Kept {
    std::vector<std::size_t> pairs;  // per request: the alloc a free frees, kNotFree for an alloc
    std::vector<RequestTrace::Repeat> repeats;
    std::shared_ptr<const ArenaLayout> layout;
  };
  static constexpr std::size_t kNotFree = SIZE_MAX;
  std::size_t kept_;
  std::vector<Kept> layouts_;  // the oldest first
  std::size_t packed_ = 0, reused_ = 0;
};

struct ArenaPlan {
  std::size_t arena = 0;       // the packed arena (transient requests)
  std::size_t live_peak = 0;   // the most transient bytes alive at once (a lower bound of `arena`)
  std::size_t persistent = 0;  // requests the stretch leaves allocated (their own blocks)
  std::size_t buffers = 0;     // transient requests placed (of the unrolled stretch)
  // The most bytes the stretch's requests hold at once, those it leaves allocated included (from their request
  // on): what any allocator must hold above the states from before the stretch.
  std::size_t requested_peak = 0;
};

// The plan of a recorded stretch (layout_arena's), with the live peak and the persistent bytes beside it. Sizes
// are rounded to the allocator's 512-byte granularity. `layout`: layout_arena(trace) already made (not packed again).
ArenaPlan plan_arena(const RequestTrace& trace, const ArenaLayout* layout = nullptr);

}  // namespace hr::core
