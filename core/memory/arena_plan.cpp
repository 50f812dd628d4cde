// Greedy-by-size interval packing of a step's buffers (arena_plan.h).
#include "core/memory/arena_plan.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"
#include "core/memory/caching_allocator.h"

namespace hr::core {

std::vector<std::size_t> pack_buffers(const std::vector<Lifetime>& buffers, std::size_t* arena) {
  std::vector<std::size_t> order(buffers.size());
  std::iota(order.begin(), order.end(), std::size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return buffers[a].bytes != buffers[b].bytes ? buffers[a].bytes > buffers[b].bytes : buffers[a].first < buffers[b].first;
  });
  std::vector<std::size_t> offset(buffers.size(), 0);
  std::vector<std::size_t> placed;  // indices, kept sorted by offset
  std::size_t top = 0;
  for (std::size_t i : order) {
    const Lifetime& b = buffers[i];
    std::size_t best = 0, best_gap = SIZE_MAX, end = 0;
    bool found = false;
    for (std::size_t j : placed) {
      const Lifetime& o = buffers[j];
      if (o.first > b.last || b.first > o.last) continue;  // never alive together
      if (offset[j] >= end && offset[j] - end >= b.bytes && offset[j] - end < best_gap) {
        best = end, best_gap = offset[j] - end, found = true;
      }
      end = std::max(end, offset[j] + o.bytes);
    }
    offset[i] = found ? best : end;
    top = std::max(top, offset[i] + b.bytes);
    placed.insert(std::upper_bound(placed.begin(), placed.end(), i,
                                   [&](std::size_t x, std::size_t y) { return offset[x] < offset[y]; }),
                  i);
  }
  if (arena) *arena = top;
  return offset;
}

std::size_t live_peak(const std::vector<Lifetime>& buffers) {
  std::vector<std::pair<std::size_t, std::ptrdiff_t>> events;  // (time, +bytes at first / -bytes after last)
  for (const Lifetime& b : buffers) {
    events.push_back({2 * b.first, std::ptrdiff_t(b.bytes)});
    events.push_back({2 * b.last + 1, -std::ptrdiff_t(b.bytes)});
  }
  std::sort(events.begin(), events.end());
  std::ptrdiff_t live = 0, peak = 0;
  for (const auto& [t, d] : events) peak = std::max(peak, live += d);
  return std::size_t(peak);
}

ArenaPlan plan_arena(const RequestTrace& trace) {
  // Unroll the repeats as replay() runs them: each repetition of [begin, end) follows the recorded requests; a
  // free in it of a request of the sub-stretch before frees that one's copy in the previous repetition. After
  // the repetitions, [prev, begin) and [begin, end) stand for the last two copies. Two repetitions are enough:
  // every later one holds the same buffers for the same spans again, alive with its neighbours only, so it
  // needs no more room (an accumulation of 100,000 costs what one of 4 does).
  const std::vector<AllocRequest>& reqs = trace.requests();
  std::vector<AllocRequest> all;
  std::vector<std::size_t> where(reqs.size());  // original index -> the index of its latest copy in `all`
  auto next_repeat = trace.repeats().begin();
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    AllocRequest r = reqs[i];
    if (!r.alloc) r.pairs = where[r.pairs];
    where[i] = all.size();
    all.push_back(r);
    if (next_repeat == trace.repeats().end() || next_repeat->end != i + 1) continue;
    const RequestTrace::Repeat& rep = *next_repeat++;
    const std::size_t len = rep.end - rep.begin, prev = rep.begin - len;
    std::vector<std::size_t> before(where.begin() + std::ptrdiff_t(prev), where.begin() + std::ptrdiff_t(rep.begin));
    std::vector<std::size_t> last(where.begin() + std::ptrdiff_t(rep.begin), where.begin() + std::ptrdiff_t(rep.end));
    for (std::size_t t = 0; t < std::min<std::size_t>(rep.times, 2); ++t) {
      std::vector<std::size_t> now(len, SIZE_MAX);
      for (std::size_t j = 0; j < len; ++j) {
        AllocRequest q = reqs[rep.begin + j];
        if (!q.alloc) q.pairs = q.pairs >= rep.begin ? now[q.pairs - rep.begin] : last[q.pairs - prev];
        now[j] = all.size();
        all.push_back(q);
      }
      before = std::move(last);
      last = std::move(now);
    }
    std::copy(before.begin(), before.end(), where.begin() + std::ptrdiff_t(prev));
    std::copy(last.begin(), last.end(), where.begin() + std::ptrdiff_t(rep.begin));
  }
  auto rounded = [](std::size_t bytes) {
    return std::max<std::size_t>(kMinBlockSize, (bytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize);
  };
  std::vector<Lifetime> buffers;
  ArenaPlan p;
  std::vector<bool> freed(all.size(), false);
  for (std::size_t i = 0; i < all.size(); ++i) {
    const AllocRequest& r = all[i];
    if (r.alloc) continue;
    HR_ASSERT(r.pairs < i && all[r.pairs].alloc && !freed[r.pairs], "a free of a request that is not allocated");
    freed[r.pairs] = true;
    buffers.push_back({rounded(all[r.pairs].bytes), r.pairs, i});
  }
  std::vector<Lifetime> everything = buffers;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i].alloc && !freed[i]) {
      p.persistent += rounded(all[i].bytes);
      everything.push_back({rounded(all[i].bytes), i, all.size()});
    }
  p.requested_peak = live_peak(everything);
  pack_buffers(buffers, &p.arena);
  p.live_peak = live_peak(buffers);
  p.buffers = buffers.size();
  return p;
}

}  // namespace hr::core
