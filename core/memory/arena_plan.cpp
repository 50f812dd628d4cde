// Greedy-by-size interval packing of a step's buffers (arena_plan.h).
#include "core/memory/arena_plan.h"

#include <algorithm>
#include <array>
#include <exception>
#include <functional>
#include <numeric>

#include "core/check.h"
#include "core/memory/caching_allocator.h"

namespace hr::core {

namespace {

int64_t floor_div(int64_t a, int64_t b) {
  return a / b - ((a % b != 0) && ((a < 0) != (b < 0)));
}
int64_t ceil_div(int64_t a, int64_t b) {
  return -floor_div(-a, b);
}
bool overlap(std::size_t af, std::size_t al, std::size_t bf, std::size_t bl) {
  return af <= bl && bf <= al;
}
std::size_t end_of(const Lifetime& b) {
  return b.last + (b.count > 1 ? (b.count - 1) * b.period : 0);
}

}  // namespace

bool live_together(const Lifetime& a, const Lifetime& b) {
  const bool pa = a.period && a.count > 1, pb = b.period && b.count > 1;
  if (!pa && !pb) return overlap(a.first, a.last, b.first, b.last);
  if (pa && pb && a.period == b.period) {
    // Copy ma of a meets copy mb of b for some d = ma - mb in [-(b.count - 1), a.count - 1].
    const auto P = int64_t(a.period);
    const int64_t lo = std::max(ceil_div(int64_t(b.first) - int64_t(a.last), P), -(int64_t(b.count) - 1));
    const int64_t hi = std::min(floor_div(int64_t(b.last) - int64_t(a.first), P), int64_t(a.count) - 1);
    return lo <= hi;
  }
  if (pa != pb) {
    const Lifetime &p = pa ? a : b, &x = pa ? b : a;
    const auto P = int64_t(p.period);
    const int64_t lo = std::max<int64_t>(0, ceil_div(int64_t(x.first) - int64_t(p.last), P));
    const int64_t hi = std::min(floor_div(int64_t(x.last) - int64_t(p.first), P), int64_t(p.count) - 1);
    return lo <= hi;
  }
  return overlap(a.first, end_of(a), b.first, end_of(b));  // different periods: their spans
}

namespace {

// The buffers that may be alive with a given one, without scanning all of them: each buffer is indexed by the
// spans it can be alive in (where every periodic buffer has the same period, a periodic buffer's first and last
// kCopies copies one by one and those between them as one span; its whole span where periods differ, as
// live_together compares them), and a query returns every buffer with an indexed span that meets one of the given
// buffer's: those that contain the query span's first time (a segment tree over the spans' end points) and those
// that start inside it (sorted by start). A superset of the buffers live_together with it, each once. Read-only once
// built: each placement (they run on several threads) marks the buffers a query has visited in its own Visits.
class SpanIndex {
 public:
  // Which buffers the current query has visited: per buffer, the last query that did.
  struct Visits {
    explicit Visits(std::size_t buffers) : seen(buffers, 0) {}
    std::vector<std::size_t> seen;
    std::size_t query = 0;
  };

  explicit SpanIndex(const std::vector<Lifetime>& buffers) {
    std::size_t period = 0;
    bool one_period = true;
    for (const Lifetime& b : buffers)
      if (periodic(b)) one_period = one_period && (period == 0 || b.period == period), period = b.period;
    spans_of_.resize(buffers.size() + 1);
    for (std::size_t i = 0; i < buffers.size(); ++i) {
      spans_of_[i] = spans_.size();
      const Lifetime& b = buffers[i];
      if (periodic(b) && one_period) {
        for (std::size_t m = 0; m < b.count; ++m) {
          if (m == kCopies && b.count > 2 * kCopies) {  // a long accumulation's copies between the ends: one span
            spans_.push_back({b.first + m * b.period, b.last + (b.count - kCopies - 1) * b.period, i});
            m = b.count - kCopies;
          }
          spans_.push_back({b.first + m * b.period, b.last + m * b.period, i});
        }
      } else {
        spans_.push_back({b.first, end_of(b), i});
      }
    }
    spans_of_[buffers.size()] = spans_.size();
    for (const Span& s : spans_) times_.push_back(s.first), times_.push_back(s.last);
    std::sort(times_.begin(), times_.end());
    times_.erase(std::unique(times_.begin(), times_.end()), times_.end());
    leaves_ = 1;
    while (leaves_ < times_.size()) leaves_ *= 2;
    nodes_.resize(2 * leaves_);
    for (std::size_t k = 0; k < spans_.size(); ++k) {
      std::size_t l = at(spans_[k].first) + leaves_, r = at(spans_[k].last) + leaves_ + 1;
      for (; l < r; l /= 2, r /= 2) {
        if (l & 1) nodes_[l++].push_back(spans_[k].buffer);
        if (r & 1) nodes_[--r].push_back(spans_[k].buffer);
      }
    }
    by_first_.resize(spans_.size());
    std::iota(by_first_.begin(), by_first_.end(), std::size_t(0));
    std::stable_sort(by_first_.begin(), by_first_.end(),
                     [&](std::size_t a, std::size_t b) { return spans_[a].first < spans_[b].first; });
  }

  // Calls `f(j)` once for every other buffer j whose indexed spans meet buffer i's.
  template <typename F>
  void for_each_meeting(std::size_t i, Visits& v, F&& f) const {
    ++v.query;
    auto visit = [&](std::size_t j) {
      if (j != i && v.seen[j] != v.query) v.seen[j] = v.query, f(j);
    };
    for (std::size_t k = spans_of_[i]; k < spans_of_[i + 1]; ++k) {
      const Span& q = spans_[k];
      for (std::size_t node = at(q.first) + leaves_; node >= 1; node /= 2)
        for (std::size_t j : nodes_[node]) visit(j);
      auto it = std::upper_bound(by_first_.begin(), by_first_.end(), q.first,
                                 [&](std::size_t t, std::size_t s) { return t < spans_[s].first; });
      for (; it != by_first_.end() && spans_[*it].first <= q.last; ++it) visit(spans_[*it].buffer);
    }
  }

 private:
  struct Span {
    std::size_t first, last, buffer;
  };
  static constexpr std::size_t kCopies = 4;
  static bool periodic(const Lifetime& b) { return b.period && b.count > 1; }
  std::size_t at(std::size_t t) const {
    return std::size_t(std::lower_bound(times_.begin(), times_.end(), t) - times_.begin());
  }

  std::vector<Span> spans_;
  std::vector<std::size_t> spans_of_;  // buffer i's spans: [spans_of_[i], spans_of_[i + 1])
  std::vector<std::size_t> times_;     // every span's first and last time, sorted, once each
  std::size_t leaves_ = 1;
  std::vector<std::vector<std::size_t>> nodes_;  // per segment-tree node: the buffers whose span covers it
  std::vector<std::size_t> by_first_;            // spans by first time
};

// The placed buffers by offset, the earlier placed first among equals, for a scan in that order. Kept in runs
// of at most 2 * kRun, so that a placement moves the entries of one run, not those of every buffer placed.
class ByOffset {
 public:
  struct Placed {
    std::size_t at, to, buffer;
  };
  std::size_t size() const { return size_; }
  void insert(const Placed& p) {
    ++size_;
    if (runs_.empty()) runs_.emplace_back().reserve(2 * kRun + 1);
    // The first run holding an entry above p (p goes after every entry at or below its offset), else the last.
    auto r = std::partition_point(runs_.begin(), runs_.end() - 1,
                                  [&](const std::vector<Placed>& run) { return run.back().at <= p.at; });
    r->insert(std::upper_bound(r->begin(), r->end(), p.at, [](std::size_t at, const Placed& q) { return at < q.at; }),
              p);
    if (r->size() > 2 * kRun) {
      std::vector<Placed> upper(r->begin() + kRun, r->end());
      upper.reserve(2 * kRun + 1);
      r->resize(kRun);
      runs_.insert(r + 1, std::move(upper));
    }
  }
  template <typename F>
  void for_each(F&& f) const {
    for (const std::vector<Placed>& run : runs_)
      for (const Placed& p : run) f(p);
  }

 private:
  static constexpr std::size_t kRun = 128;
  std::vector<std::vector<Placed>> runs_;
  std::size_t size_ = 0;
};

// Places the buffers in `order`, each at the lowest best-fitting gap (with `first_fit`: the lowest gap it fits)
// between the buffers already placed that it is ever alive with, else above them. The gaps are read off the
// placed buffers it meets in order of offset (the earlier placed first among equals): where they are few, those
// are sorted; where they are many, every placed buffer is scanned in that order for them.
std::vector<std::size_t> place(const std::vector<Lifetime>& buffers, const std::vector<std::size_t>& order,
                               const SpanIndex& index, std::size_t* arena, bool first_fit) {
  SpanIndex::Visits visits(buffers.size());
  std::vector<std::size_t> offset(buffers.size(), 0);
  std::vector<std::size_t> placed(buffers.size(), SIZE_MAX);  // when each was placed
  std::vector<std::size_t> met(buffers.size(), SIZE_MAX);     // the last placing whose buffer met each
  ByOffset by_offset;
  // (offset, when placed, end) of the placed buffers alive with b
  std::vector<std::array<std::size_t, 3>> below;
  std::size_t top = 0, placing = 0;
  for (std::size_t i : order) {
    const Lifetime& b = buffers[i];
    below.clear();
    index.for_each_meeting(i, visits, [&](std::size_t j) {
      if (placed[j] != SIZE_MAX && live_together(buffers[j], b)) {
        met[j] = placing;
        below.push_back({offset[j], placed[j], offset[j] + buffers[j].bytes});
      }
    });
    std::size_t best = 0, best_gap = SIZE_MAX, end = 0;
    bool found = false;
    const auto gap_before = [&](std::size_t at, std::size_t to) {
      if (at >= end && at - end >= b.bytes && at - end < best_gap && !(first_fit && found))
        best = end, best_gap = at - end, found = true;
      end = std::max(end, to);
    };
    // A sort takes about log2(k) steps for each of the k buffers met; the scan one step for each placed buffer.
    std::size_t log2k = 1;
    while ((std::size_t(1) << log2k) < below.size()) ++log2k;
    if (below.size() * log2k < by_offset.size()) {
      std::sort(below.begin(), below.end());
      for (const auto& [at, when, to] : below) gap_before(at, to);
    } else {
      by_offset.for_each([&](const ByOffset::Placed& p) {
        if (met[p.buffer] == placing) gap_before(p.at, p.to);
      });
    }
    offset[i] = found ? best : end;
    top = std::max(top, offset[i] + b.bytes);
    placed[i] = placing++;
    by_offset.insert({offset[i], offset[i] + b.bytes, i});
  }
  *arena = top;
  return offset;
}

}  // namespace

std::vector<std::size_t> pack_buffers(const std::vector<Lifetime>& buffers, std::size_t* arena) {
  // Greedy placement depends on the order and the gap rule; three orders that each win on some steps are tried,
  // each with best fit and first fit, and the smallest arena kept: by size (TFLite's and ggml's), by size x
  // lifetime (long, large buffers first), and by lifetime. First fit keeps low what best fit scatters into gaps
  // (LoRA's steps: 1.8% above the live peak with best fit alone, 0.1% with both).
  const auto span = [&](std::size_t i) { return double(end_of(buffers[i]) - buffers[i].first + 1); };
  const std::vector<std::function<double(std::size_t)>> keys = {
      [&](std::size_t i) { return double(buffers[i].bytes); },
      [&](std::size_t i) { return double(buffers[i].bytes) * span(i); },
      [&](std::size_t i) { return span(i); },
  };
  // The six placements are independent and the step waits for them (the dry run of a step's shapes, before the
  // step it lays out): they share the threads, each placing alone, and the smallest arena is kept, the first of
  // the six in this order among equals, whichever thread finished first.
  const SpanIndex index(buffers);
  std::vector<std::vector<std::size_t>> orders(keys.size());
  for (std::size_t o = 0; o < keys.size(); ++o) {
    std::vector<double> k(buffers.size());
    for (std::size_t i = 0; i < buffers.size(); ++i) k[i] = keys[o](i);
    std::vector<std::size_t>& order = orders[o];
    order.resize(buffers.size());
    std::iota(order.begin(), order.end(), std::size_t(0));
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      if (k[a] != k[b]) return k[a] > k[b];
      if (buffers[a].bytes != buffers[b].bytes) return buffers[a].bytes > buffers[b].bytes;
      return buffers[a].first < buffers[b].first;
    });
  }
  constexpr int kPlacements = 6;  // each order with best fit, then with first fit
  std::array<std::vector<std::size_t>, kPlacements> offsets;
  std::array<std::size_t, kPlacements> sizes{};
  // An exception may not leave an OpenMP region (the process would end): a placement's (its vectors' bad_alloc) is
  // carried out of it and thrown after.
  std::array<std::exception_ptr, kPlacements> failed;
#pragma omp parallel for schedule(dynamic, 1)
  for (int c = 0; c < kPlacements; ++c) {
    try {
      offsets[c] = place(buffers, orders[std::size_t(c / 2)], index, &sizes[c], c % 2);
    } catch (...) {
      failed[c] = std::current_exception();
    }
  }
  for (const std::exception_ptr& e : failed)
    if (e) std::rethrow_exception(e);
  std::vector<std::size_t> best;
  std::size_t best_arena = SIZE_MAX;
  for (int c = 0; c < kPlacements; ++c)
    if (sizes[c] < best_arena) best = std::move(offsets[c]), best_arena = sizes[c];
  if (arena) *arena = buffers.empty() ? 0 : best_arena;
  return buffers.empty() ? std::vector<std::size_t>{} : best;
}

std::size_t live_peak(const std::vector<Lifetime>& buffers) {
  // A periodic buffer's copies in the middle of its run are alive with the same neighbours as the second copy:
  // the first three and the last four copies meet everything any copy meets (a copy lives into the next one at
  // most), so only they are counted.
  std::vector<std::pair<std::size_t, std::ptrdiff_t>> events;  // (time, +bytes at first / -bytes after last)
  for (const Lifetime& b : buffers) {
    const std::size_t n = b.period ? b.count : 1;
    for (std::size_t m = 0; m < n; ++m) {
      if (m == 3 && n > 7) m = n - 4;
      events.push_back({2 * (b.first + m * b.period), std::ptrdiff_t(b.bytes)});
      events.push_back({2 * (b.last + m * b.period) + 1, -std::ptrdiff_t(b.bytes)});
    }
  }
  std::sort(events.begin(), events.end());
  std::ptrdiff_t live = 0, peak = 0;
  for (const auto& [t, d] : events) peak = std::max(peak, live += d);
  return std::size_t(peak);
}

namespace {

constexpr std::size_t kNoFree = SIZE_MAX;

struct Built {
  ArenaLayout layout;
  std::vector<Lifetime> buffers, persistent;  // transient buffers (periodic ones once), and what stays
};

// Builds the layout of one trace: which request frees which, where each request happens in a run (after every
// repetition of the bodies that end before it), each buffer's lifetime, then the packing.
class Builder {
 public:
  explicit Builder(const RequestTrace& trace)
      : reqs_(trace.requests()), reps_(trace.repeats()), free_of_(reqs_.size(), kNoFree) {}

  // With `pack` false the buffers and their lifetimes only: the offsets stay unset and the arena 0.
  Built build(bool pack = true) {
    ArenaLayout& L = out_.layout;
    pair_frees();
    run_end_ = pos(reqs_.size());
    for (const RequestTrace::Repeat& r : reps_) {
      const std::size_t len = r.end - r.begin;
      L.bodies.push_back({r.begin - len, r.begin, r.end, r.times, std::vector<std::size_t>(len, ArenaLayout::kNone)});
    }
    std::size_t next_body = 0;
    for (std::size_t i = 0; i < reqs_.size(); ++i) {
      if (!reqs_[i].alloc) continue;
      while (next_body < L.bodies.size() && L.bodies[next_body].end <= i) ++next_body;
      if (next_body == L.bodies.size() || i < L.bodies[next_body].prev)
        place_once(i);
      else if (i < L.bodies[next_body].begin)  // the second recorded copy is placed with the first
        place_repeated(i, L.bodies[next_body]);
    }
    if (pack) {
      const std::vector<std::size_t> offsets = pack_buffers(out_.buffers, &L.arena);
      for (std::size_t k = 0; k < offsets.size(); ++k) *target_[k] = offsets[k];
    }
    L.requests = run_end_;
    return std::move(out_);
  }

 private:
  // Each free's allocation, and the recorded sizes.
  void pair_frees() {
    ArenaLayout& L = out_.layout;
    L.recorded.resize(reqs_.size());
    for (std::size_t i = 0; i < reqs_.size(); ++i) {
      const AllocRequest& r = reqs_[i];
      if (r.alloc) {
        L.recorded[i] = {true, round_size(r.bytes), ArenaLayout::kPersistent};
        continue;
      }
      HR_ASSERT(r.pairs < i && reqs_[r.pairs].alloc && free_of_[r.pairs] == kNoFree,
                "a free of a request that is not allocated");
      free_of_[r.pairs] = i;
      L.recorded[i] = {false, 0, 0};
    }
  }

  // Where recorded request i happens in a run.
  std::size_t pos(std::size_t i) const {
    std::size_t s = i;
    for (const RequestTrace::Repeat& r : reps_)
      if (r.end <= i) s += r.times * (r.end - r.begin);
    return s;
  }

  // A request outside every repeated body: one buffer, or one that stays.
  void place_once(std::size_t i) {
    const std::size_t bytes = out_.layout.recorded[i].bytes;
    if (free_of_[i] == kNoFree) {
      out_.persistent.push_back({bytes, pos(i), run_end_});
      return;
    }
    out_.buffers.push_back({bytes, pos(i), pos(free_of_[i])});
    target_.push_back(&out_.layout.recorded[i].offset);
  }

  // Request i of a repeated body's first recorded copy. Every copy c of the body allocates request j at base +
  // c len and frees it where the first copy did, one copy later for a buffer that crosses into the next; the last
  // copy's crossing buffers live into what follows.
  void place_repeated(std::size_t i, ArenaLayout::Body& b) {
    const std::size_t bytes = out_.layout.recorded[i].bytes;
    const std::size_t len = b.end - b.begin, j = i - b.prev, q = free_of_[i], copies = b.times + 2, base = pos(b.prev);
    HR_ASSERT(q != kNoFree && q < b.end, "request ", i, " of a repeated micro-batch lives past the next one");
    const bool crossing = q >= b.begin;
    const std::size_t regular = crossing ? copies - 1 : copies, rel = q - b.prev;
    out_.buffers.push_back({bytes, base + j, base + rel, 2 * len, (regular + 1) / 2});
    target_.push_back(&out_.layout.recorded[i].offset);
    out_.buffers.push_back({bytes, base + len + j, base + len + rel, 2 * len, regular / 2});
    target_.push_back(&out_.layout.recorded[b.begin + j].offset);
    if (!crossing) return;
    const std::size_t q2 = free_of_[b.begin + j], first = base + (copies - 1) * len + j;
    if (q2 == kNoFree) {
      b.last[j] = ArenaLayout::kPersistent;
      out_.persistent.push_back({bytes, first, run_end_});
      return;
    }
    out_.buffers.push_back({bytes, first, pos(q2)});
    target_.push_back(&b.last[j]);
  }

  const std::vector<AllocRequest>& reqs_;
  const std::vector<RequestTrace::Repeat>& reps_;
  std::vector<std::size_t> free_of_;
  std::size_t run_end_ = 0;
  Built out_;
  std::vector<std::size_t*> target_;  // where each buffer's offset goes
};

Built build(const RequestTrace& trace, bool pack = true) {
  return Builder(trace).build(pack);
}

}  // namespace

ArenaLayout::Entry ArenaLayout::at(std::size_t r) const {
  std::size_t shift = 0;
  for (const Body& b : bodies) {
    const std::size_t i = r - shift, len = b.end - b.begin;
    if (i < b.prev) break;
    std::size_t c = 0, j = 0;
    if (i < b.end) {
      c = i < b.begin ? 0 : 1, j = (i - b.prev) % len;
    } else if (i < b.end + b.times * len) {
      c = 2 + (i - b.end) / len, j = (i - b.end) % len;
    } else {
      shift += b.times * len;
      continue;
    }
    Entry e = recorded[b.prev + j];
    if (!e.alloc) return e;
    if (c == b.times + 1 && b.last[j] != kNone)
      e.offset = b.last[j];
    else if (c % 2 == 1)
      e.offset = recorded[b.begin + j].offset;
    return e;
  }
  HR_ASSERT(r - shift < recorded.size(), "request ", r, " is past the planned stretch (", requests, " requests)");
  return recorded[r - shift];
}

ArenaLayout layout_arena(const RequestTrace& trace) {
  return build(trace).layout;
}

std::shared_ptr<const ArenaLayout> ArenaLayouts::layout_of(const RequestTrace& trace, std::size_t within) {
  const std::vector<AllocRequest>& reqs = trace.requests();
  const auto same_requests = [&](const Kept& k) {
    if (k.pairs.size() != reqs.size() || k.repeats.size() != trace.repeats().size()) return false;
    for (std::size_t i = 0; i < k.repeats.size(); ++i) {
      const RequestTrace::Repeat &a = k.repeats[i], &b = trace.repeats()[i];
      if (a.begin != b.begin || a.end != b.end || a.times != b.times) return false;
    }
    for (std::size_t i = 0; i < reqs.size(); ++i)
      if (k.pairs[i] != (reqs[i].alloc ? kNotFree : reqs[i].pairs) ||
          (reqs[i].alloc && round_size(reqs[i].bytes) > k.layout->recorded[i].bytes))
        return false;
    return true;
  };
  const Kept* best = nullptr;
  for (const Kept& k : layouts_)
    if (k.layout->arena <= within && (!best || k.layout->arena < best->layout->arena) && same_requests(k)) best = &k;
  if (best) {
    auto layout = std::make_shared<ArenaLayout>(*best->layout);
    for (std::size_t i = 0; i < reqs.size(); ++i)
      if (reqs[i].alloc) layout->recorded[i].bytes = round_size(reqs[i].bytes);
    ++reused_;
    return layout;
  }
  Kept k;
  k.pairs.reserve(reqs.size());
  for (const AllocRequest& r : reqs) k.pairs.push_back(r.alloc ? kNotFree : r.pairs);
  k.repeats = trace.repeats();
  k.layout = std::make_shared<const ArenaLayout>(layout_arena(trace));
  ++packed_;
  if (kept_ == 0) return k.layout;
  if (layouts_.size() == kept_) layouts_.erase(layouts_.begin());
  layouts_.push_back(std::move(k));
  return layouts_.back().layout;
}

ArenaPlan plan_arena(const RequestTrace& trace, const ArenaLayout* layout) {
  const Built b = build(trace, !layout);
  ArenaPlan p;
  p.arena = layout ? layout->arena : b.layout.arena;
  p.live_peak = live_peak(b.buffers);
  for (const Lifetime& l : b.buffers) p.buffers += l.period ? l.count : 1;
  for (const Lifetime& l : b.persistent) p.persistent += l.bytes;
  std::vector<Lifetime> everything = b.buffers;
  everything.insert(everything.end(), b.persistent.begin(), b.persistent.end());
  p.requested_peak = live_peak(everything);
  return p;
}

}  // namespace hr::core
