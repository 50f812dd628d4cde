// Recording allocation requests and replaying them on a replica of an allocator's state.
#include "core/memory/replay.h"

#include <algorithm>

#include "core/memory/arena_plan.h"

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

std::size_t RequestTrace::unfreed() const {
  return live_.size();
}

namespace {
// Request b repeats request a one stretch of `len` later: the same allocation, or the free of the allocation one
// stretch after a's (which lies inside the repeating stretches, from `prev` on).
bool repeats_request(const AllocRequest& a, const AllocRequest& b, std::size_t len, std::size_t prev) {
  const bool same = a.alloc == b.alloc && a.bytes == b.bytes && a.category == b.category && a.owner == b.owner;
  return same && (b.alloc || (b.pairs == a.pairs + len && b.pairs >= prev));
}
}  // namespace

bool RequestTrace::periodic(std::size_t prev, std::size_t begin, std::size_t end) const {
  const std::size_t len = end - begin;
  if (prev > begin || begin > end || end > requests_.size() || begin - prev != len || len == 0) return false;
  if (!repeats_.empty() && prev < repeats_.back().end) return false;
  for (std::size_t j = 0; j < len; ++j)
    if (!repeats_request(requests_[prev + j], requests_[begin + j], len, prev)) return false;
  return true;
}

void RequestTrace::repeat_last(std::size_t begin, std::size_t times) {
  const std::size_t len = requests_.size() - begin;
  HR_ASSERT(begin >= len && periodic(begin - len, begin, requests_.size()), "requests ", begin, "..", requests_.size(),
            " do not repeat the stretch before them");
  if (times > 0) repeats_.push_back({begin, requests_.size(), times});
}

void RequestTrace::check() const {
  HR_ASSERT(problem_.empty(), problem_);
}

namespace {

using Block = CachingAllocator::Block;

Block* allocate(CachingAllocator& a, const AllocRequest& r) {
  MemoryScope scope(r.category, r.owner);
  return a.allocate(r.bytes);
}

// The repetitions of requests [r.begin, r.end) after their recorded pass. `blocks` holds the recorded
// passes' blocks on entry and the last two repetitions' on return, where later requests look for them.
void repeat(CachingAllocator& a, const std::vector<AllocRequest>& reqs, std::vector<Block*>& blocks,
            const RequestTrace::Repeat& r) {
  const std::size_t len = r.end - r.begin, prev = r.begin - len;
  std::vector<Block*> before(blocks.begin() + std::ptrdiff_t(prev), blocks.begin() + std::ptrdiff_t(r.begin));
  std::vector<Block*> last(blocks.begin() + std::ptrdiff_t(r.begin), blocks.begin() + std::ptrdiff_t(r.end));
  AllocatorSnapshot was = a.snapshot();  // where the next repetition starts
  for (std::size_t t = 0; t < r.times; ++t) {
    std::vector<Block*> now(len, nullptr);
    for (std::size_t j = 0; j < len; ++j) {
      const AllocRequest& q = reqs[r.begin + j];
      if (q.alloc) {
        now[j] = allocate(a, q);
        continue;
      }
      Block*& freed = q.pairs >= r.begin ? now[q.pairs - r.begin] : last[q.pairs - prev];
      a.free(freed);
      freed = nullptr;
    }
    before = std::move(last);
    last = std::move(now);
    AllocatorSnapshot after = a.snapshot();
    if (after == was) {  // back where this repetition started: every further one is this one again
      if (a.kind() == AllocatorKind::Planned) a.skip_requests((r.times - t - 1) * len);
      break;
    }
    was = std::move(after);
  }
  std::copy(before.begin(), before.end(), blocks.begin() + std::ptrdiff_t(prev));
  std::copy(last.begin(), last.end(), blocks.begin() + std::ptrdiff_t(r.begin));
}

}  // namespace

ReplayPeaks replay(const AllocatorSnapshot& start, const RequestTrace& trace, std::size_t capacity,
                   std::shared_ptr<const ArenaLayout> layout) {
  CachingAllocator a(start, make_meta_allocator(capacity), "replay");
  // A planned allocator without a layout serves requests outside a stretch (an evaluation), as it does there.
  const bool planned = start.kind == AllocatorKind::Planned && layout;
  if (planned) a.begin_stretch(std::move(layout));
  const std::vector<AllocRequest>& reqs = trace.requests();
  std::vector<Block*> blocks(reqs.size(), nullptr);
  auto next_repeat = trace.repeats().begin();
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    const AllocRequest& r = reqs[i];
    if (r.alloc) {
      blocks[i] = allocate(a, r);
    } else {
      a.free(blocks[r.pairs]);
      blocks[r.pairs] = nullptr;
    }
    if (next_repeat != trace.repeats().end() && next_repeat->end == i + 1) repeat(a, reqs, blocks, *next_repeat++);
  }
  if (planned) a.end_stretch();
  const MemoryStats s = a.stats();
  return {s.allocated_bytes.peak, s.reserved_bytes.peak};
}

}  // namespace hr::core
