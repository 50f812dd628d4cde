// Allocation requests recorded from one run (a dry run on the meta device) and replayed on a replica of an
// allocator's state: the peaks a real allocator reaches when it runs the same requests from where it is.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/memory/caching_allocator.h"

namespace hr::core {

struct AllocRequest {
  bool alloc = true;      // false: a free of an earlier request
  std::size_t bytes = 0;  // requested (alloc)
  Category category = Category::Activations;
  std::string owner;
  std::size_t pairs = 0;  // free: the index of the alloc it frees
};

// The requests of one recorded stretch (a training step), in order. Frees of blocks allocated before the
// recording started are not requests of the stretch and are refused: a step frees only what it allocated.
class RequestTrace {
 public:
  void record(const TraceEvent& e);
  const std::vector<AllocRequest>& requests() const { return requests_; }
  std::size_t unfreed() const;  // allocations still live at the end (what the stretch leaves behind)
  // Throws if the stretch freed a block it had not allocated (recording runs inside the allocator, where a
  // free may not throw, so the first such free is kept until this is called).
  void check() const;

  // A run of identical sub-stretches (the micro-batches of a step with gradient accumulation) is recorded
  // once and repeated on replay. periodic: whether requests [begin, end) repeat [prev, begin) exactly (as
  // long, the same sizes and tags, every free freeing the request one sub-stretch later than its counterpart
  // did, none reaching back past the sub-stretch before). repeat_last: requests [begin, size()), which
  // periodic accepted, happen `times` more times after themselves.
  bool periodic(std::size_t prev, std::size_t begin, std::size_t end) const;
  void repeat_last(std::size_t begin, std::size_t times);
  struct Repeat {
    std::size_t begin = 0, end = 0, times = 0;
  };
  const std::vector<Repeat>& repeats() const { return repeats_; }

 private:
  std::string problem_;
  std::vector<AllocRequest> requests_;
  std::vector<Repeat> repeats_;
  std::vector<std::pair<const void*, std::size_t>> live_;  // block identity -> its alloc request
};

struct ReplayPeaks {
  int64_t peak_allocated = 0, peak_reserved = 0;
};

// Replays `trace` on a replica of `start` (capacity as the real device's; 0: none), with the allocator kind
// `start` was taken from; a planned one runs the trace as a stretch following `layout` (without one: outside a
// stretch, as an evaluation runs). Throws
// OutOfMemory when the requests do not fit from that state, as the real allocator would. A repeated sub-stretch
// is replayed until the replica comes back to the state it started it in: from there every further repetition
// is the same again, so the peaks are those of all of them.
ReplayPeaks replay(const AllocatorSnapshot& start, const RequestTrace& trace, std::size_t capacity,
                   std::shared_ptr<const ArenaLayout> layout = nullptr);

}  // namespace hr::core
