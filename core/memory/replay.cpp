// Recording allocation requests and replaying them on a replica of an allocator's state.
#include "core/memory/replay.h"

#include <algorithm>

namespace hr::core {

void RequestTrace::record(const TraceEvent& e) {
  if (e.kind == TraceEvent::Kind::Alloc) {
    live_.push_back({e.block, requests_.size()});
    requests_.push_back({true, e.requested, e.category, e.owner ? *e.owner : "", 0});
  } else if (e.kind == TraceEvent::Kind::Free) {
    auto it = std::find_if(live_.rbegin(), live_.rend(), [&](const auto& l) { return l.first == e.block; });
    if (it == live_.rend()) {
      if (problem_.empty())
        problem_ = str("a recorded stretch frees a block allocated before it (", e.size, " B, ",
                       category_name(e.category), ", owner '", e.owner ? *e.owner : "", "')");
      return;
    }
    requests_.push_back({false, 0, e.category, "", it->second});
    live_.erase(std::next(it).base());
  }
}

std::size_t RequestTrace::unfreed() const { return live_.size(); }

void RequestTrace::check() const { HR_ASSERT(problem_.empty(), problem_); }

ReplayPeaks replay(const AllocatorSnapshot& start, const RequestTrace& trace, std::size_t capacity) {
  CachingAllocator a(start, make_meta_allocator(capacity), "replay");
  const std::vector<AllocRequest>& reqs = trace.requests();
  std::vector<CachingAllocator::Block*> blocks(reqs.size(), nullptr);
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    const AllocRequest& r = reqs[i];
    if (r.alloc) {
      MemoryScope scope(r.category, r.owner);
      blocks[i] = a.allocate(r.bytes);
    } else {
      a.free(blocks[r.pairs]);
      blocks[r.pairs] = nullptr;
    }
  }
  const MemoryStats s = a.stats();
  return {s.allocated_bytes.peak, s.reserved_bytes.peak};
}

}  // namespace hr::core
