// A static memory plan of one recorded stretch (a training step's requests from its dry run), the way
// ggml-alloc, TFLite's arena planner and XLA's buffer assignment place buffers: every request freed within the
// stretch gets an offset in one arena so that no two buffers alive at the same time overlap; what stays
// allocated at its end (new persistent states) keeps a block of its own. The arena's size against the peak of
// the live bytes says how much a planned allocator would waste where the caching allocator keeps
// cached and split blocks.
#pragma once

#include <cstddef>
#include <vector>

#include "core/memory/replay.h"

namespace hr::core {

// A buffer's size and lifetime: alive from request `first` to request `last` (inclusive).
struct Lifetime {
  std::size_t bytes = 0, first = 0, last = 0;
};

// Offsets for `buffers` in one arena, no two overlapping in both address and lifetime: greedy by size (largest
// first, earlier first among equals), each at the lowest best-fitting gap between the buffers already placed
// that it overlaps in time, else above them. `arena` receives the arena's size.
std::vector<std::size_t> pack_buffers(const std::vector<Lifetime>& buffers, std::size_t* arena);

// The most bytes alive at one time: no arena can be smaller.
std::size_t live_peak(const std::vector<Lifetime>& buffers);

struct ArenaPlan {
  std::size_t arena = 0;       // the packed arena (transient requests)
  std::size_t live_peak = 0;   // the most transient bytes alive at once (a lower bound of `arena`)
  std::size_t persistent = 0;  // requests the stretch leaves allocated (their own blocks)
  std::size_t buffers = 0;     // transient requests placed (of the unrolled stretch)
  // The most bytes the stretch's requests hold at once, those it leaves allocated included (from their request
  // on): what any allocator must hold above the states from before the stretch.
  std::size_t requested_peak = 0;
};

// The plan of a recorded stretch, its repeated sub-stretches (accumulated micro-batches) unrolled (two
// repetitions: later ones need no more room). Sizes are rounded to the allocator's 512-byte granularity.
ArenaPlan plan_arena(const RequestTrace& trace);

}  // namespace hr::core
