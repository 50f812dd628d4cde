// Memory timelines as Chrome trace-event JSON.
#include "core/memory/timeline.h"

#include <nlohmann/json.hpp>

namespace hr::core {

Timeline::Timeline(Clock clock) : event_clock_(clock == Clock::Events) {}

double Timeline::now_locked(Advance advance) {
  if (event_clock_) return double(advance == Advance::Yes ? ++ticks_ : ticks_);
  const double t = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start_).count();
  last_ = std::max(last_, t);  // monotone whichever thread records
  return last_;
}

void Timeline::counter_locked(double ts, const std::string& name, int64_t v) {
  events_.push_back({'C', ts, name, nullptr, v});
}

int Timeline::add_allocator(const std::string& name, const MemoryStats& now, Advance advance) {
  std::lock_guard<std::mutex> lock(mutex_);
  Track t;
  t.name = name;
  t.advance = advance;
  t.allocated = now.allocated_bytes.current;
  t.reserved = now.reserved_bytes.current;
  for (Category c : kAllCategories) t.by_category[std::size_t(c)] = now.category(c).current;
  const double ts = now_locked(advance);
  counter_locked(ts, name + " allocated", t.allocated);
  counter_locked(ts, name + " reserved", t.reserved);
  for (Category c : kAllCategories) counter_locked(ts, str(name, " ", category_name(c)), t.by_category[std::size_t(c)]);
  tracks_.push_back(std::move(t));
  return int(tracks_.size()) - 1;
}

void Timeline::allocator_event(int track, const TraceEvent& e) {
  std::lock_guard<std::mutex> lock(mutex_);
  Track& t = tracks_.at(std::size_t(track));
  const double ts = now_locked(t.advance);
  const int64_t size = int64_t(e.size);
  switch (e.kind) {
    case TraceEvent::Kind::Alloc:
    case TraceEvent::Kind::Free: {
      const int64_t d = e.kind == TraceEvent::Kind::Alloc ? size : -size;
      t.allocated += d;
      int64_t& cat = t.by_category[std::size_t(e.category)];
      cat += d;
      counter_locked(ts, t.name + " allocated", t.allocated);
      counter_locked(ts, str(t.name, " ", category_name(e.category)), cat);
      break;
    }
    case TraceEvent::Kind::SegmentAlloc:
    case TraceEvent::Kind::SegmentFree: {
      const bool alloc = e.kind == TraceEvent::Kind::SegmentAlloc;
      t.reserved += alloc ? size : -size;
      counter_locked(ts, t.name + " reserved", t.reserved);
      events_.push_back(
          {'i', ts, str(t.name, alloc ? " segment allocated " : " cached segment freed ", format_bytes(double(size))),
           "memory", size});
      break;
    }
    case TraceEvent::Kind::Retry:
      events_.push_back({'i', ts,
                         str(t.name, " no segment for ", format_bytes(double(e.requested)), " (",
                             e.owner && !e.owner->empty() ? *e.owner : std::string("(unscoped)"),
                             "): the cache is released and the request retried"),
                         "memory", int64_t(e.requested)});
      break;
    case TraceEvent::Kind::OOM:
      events_.push_back({'i', ts,
                         str(t.name, " out of memory: ", format_bytes(double(e.requested)), " for ",
                             e.owner && !e.owner->empty() ? *e.owner : std::string("(unscoped)"), " (",
                             category_name(e.category), ")"),
                         "memory", int64_t(e.requested)});
      break;
  }
}

void Timeline::begin(const char* cat, std::string name) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++open_;
  events_.push_back({'B', now_locked(), std::move(name), cat, 0});
}

void Timeline::end() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (open_ == 0) return;  // begun before this timeline was set
  --open_;
  events_.push_back({'E', now_locked(), "", nullptr, 0});
}

std::size_t Timeline::events() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_.size();
}

std::string Timeline::chrome_json(int pid, const std::string& process) const {
  std::lock_guard<std::mutex> lock(mutex_);
  using nlohmann::json;
  json ev = json::array();
  ev.push_back(
      {{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"tid", 0}, {"ts", 0}, {"args", {{"name", process}}}});
  ev.push_back(
      {{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", 1}, {"ts", 0}, {"args", {{"name", "step"}}}});
  double last = 0;
  for (const Event& e : events_) {
    last = e.ts;
    switch (e.ph) {
      case 'C':
        ev.push_back(
            {{"ph", "C"}, {"name", e.name}, {"pid", pid}, {"tid", 0}, {"ts", e.ts}, {"args", {{"bytes", e.value}}}});
        break;
      case 'B':
        ev.push_back({{"ph", "B"}, {"name", e.name}, {"cat", e.cat}, {"pid", pid}, {"tid", 1}, {"ts", e.ts}});
        break;
      case 'E':
        ev.push_back({{"ph", "E"}, {"pid", pid}, {"tid", 1}, {"ts", e.ts}});
        break;
      default:
        ev.push_back({{"ph", "i"},
                      {"s", "p"},
                      {"name", e.name},
                      {"cat", e.cat},
                      {"pid", pid},
                      {"tid", 1},
                      {"ts", e.ts},
                      {"args", {{"bytes", e.value}}}});
    }
  }
  for (int i = 0; i < open_; ++i)
    ev.push_back({{"ph", "E"}, {"pid", pid}, {"tid", 1}, {"ts", last}});  // close what an error cut short
  json out = {{"traceEvents", ev},
              {"displayTimeUnit", "ms"},
              {"otherData", {{"clock", event_clock_ ? "allocator events (1 us each)" : "wall clock (us)"}}}};
  return out.dump();
}

void set_span_timeline(Timeline* t) {
  span_timeline_slot().store(t);
}

void trace_begin(const char* cat, std::string name) {
  if (Timeline* t = span_timeline_slot().load()) t->begin(cat, std::move(name));
}

void trace_end() {
  if (Timeline* t = span_timeline_slot().load()) t->end();
}

}  // namespace hr::core
