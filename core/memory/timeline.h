// A memory timeline of one stretch of a run (a training step, or its dry run): the allocators' events as
// counter tracks (allocated, reserved, each category), the step's phases as nested slices (each group's
// forward and backward, recompute, collectives, the optimizer step), and instants for segment allocations,
// cache frees and out-of-memory errors; written as Chrome trace-event JSON, which Perfetto
// (ui.perfetto.dev) and chrome://tracing open.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "core/memory/caching_allocator.h"

namespace hr::core {

class Timeline {
 public:
  // Clock::Events: time is the count of recorded events (1 µs each) instead of the wall clock, so that a
  // dry run's timeline and the real step's line up event for event.
  enum class Clock : uint8_t { Wall, Events };
  explicit Timeline(Clock clock);
  // Starts a counter set for an allocator ("device", "host"): its current values are the first points.
  // Returns the track's index for allocator_event. With the event clock, only the events of allocators
  // whose events advance it (the device) and the slices do: the host's (loader threads) take the current
  // time, so that a step's timeline and its dry run's agree to the microsecond.
  enum class Advance : uint8_t { Yes, No };
  int add_allocator(const std::string& name, const MemoryStats& now, Advance advance = Advance::Yes);
  // One allocator event (call from the allocator's trace function).
  void allocator_event(int track, const TraceEvent& e);
  void begin(const char* cat, std::string name);
  void end();
  // The trace-event JSON of what was recorded: one process `pid` named `process`, slices on one thread.
  std::string chrome_json(int pid, const std::string& process) const;
  std::size_t events() const;

 private:
  struct Event {
    char ph;  // 'C' counter, 'B'/'E' slice begin/end, 'i' instant
    double ts;
    std::string name;  // counter track, slice or instant name
    const char* cat;   // slices: forward, backward, recompute, comm, optimizer; instants: memory
    int64_t value;     // counters: bytes; instants: bytes of the segment or request
  };
  struct Track {
    std::string name;
    Advance advance = Advance::Yes;
    int64_t allocated = 0, reserved = 0;
    std::array<int64_t, kNumCategories> by_category{};
  };
  double now_locked(Advance advance = Advance::Yes);
  void counter_locked(double ts, const std::string& name, int64_t v);

  const bool event_clock_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  mutable std::mutex mutex_;
  double last_ = 0;
  int64_t ticks_ = 0;
  int open_ = 0;  // slices begun and not ended
  std::vector<Track> tracks_;
  std::vector<Event> events_;
};

// The timeline that this process's phase slices go to (nullptr: none, and trace_begin/trace_end cost one
// atomic load). Set while a traced step runs.
void set_span_timeline(Timeline* t);
inline std::atomic<Timeline*>& span_timeline_slot() {
  static std::atomic<Timeline*> slot{nullptr};
  return slot;
}
inline bool tracing() {
  return span_timeline_slot().load(std::memory_order_relaxed) != nullptr;
}
void trace_begin(const char* cat, std::string name);
void trace_end();

// A slice for the life of a scope; the name is only built while a timeline records.
class TraceSpan {
 public:
  template <typename... Args>
  explicit TraceSpan(const char* cat, const Args&... name) : on_(tracing()) {
    if (on_) trace_begin(cat, str(name...));
  }
  // Only when `when` holds (a recompute that has something to recompute).
  struct When {
    bool holds;
  };
  template <typename... Args>
  TraceSpan(When when, const char* cat, const Args&... name) : on_(when.holds && tracing()) {
    if (on_) trace_begin(cat, str(name...));
  }
  ~TraceSpan() {
    if (on_) trace_end();
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  bool on_;
};

}  // namespace hr::core
