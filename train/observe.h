// What a run shows beside memory.jsonl, where people already look: TensorBoard scalars (log.report_to:
// tensorboard), Chrome trace-event memory timelines of chosen steps (memory.trace_steps, for Perfetto), and
// PyTorch memory_viz snapshots at out-of-memory errors (memory.snapshot_on_oom).
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/io/tfevents.h"
#include "core/memory/memviz.h"
#include "core/memory/timeline.h"
#include "parallel/comm.h"
#include "train/config.h"
#include "train/evaluate.h"

namespace hr::train {

// The TensorBoard scalars of one memory.jsonl line (values exactly the line's, as float32).
std::vector<std::pair<std::string, float>> step_scalars(const nlohmann::json& line);
std::vector<std::pair<std::string, float>> eval_scalars(const EvalResult& r);

class RunObservers {
 public:
  // Installs itself on the run's device and host allocators (their trace and out-of-memory observer) where
  // the config asks for timelines or snapshots; the TensorBoard writer lives on rank 0. `first_step` is the first
  // step this run logs: the event file starts with a SessionLog START there, so that TensorBoard drops what an
  // earlier run in the directory logged from that step on, as the JSON-lines logs are cut (a resumed run).
  RunObservers(const RunConfig& c, parallel::Communicator& comm, core::CachingAllocator& device,
               core::CachingAllocator& host, int64_t first_step);
  ~RunObservers();
  RunObservers(const RunObservers&) = delete;
  RunObservers& operator=(const RunObservers&) = delete;

  // Starts the timeline of step `step` when it is one of memory.trace_steps.
  void begin_step(int64_t step);
  // Ends the step's timeline and writes it; returns the file ("" when the step was not traced). Call before
  // anything else runs an engine (a dry run's phases would land in it).
  std::string end_step();
  // Rank 0 writes the step's scalars; with several ranks every rank calls it (per-rank memory tags are
  // summed across ranks).
  void step(const nlohmann::json& line);
  void eval(int64_t step, const EvalResult& r);
  // After an out-of-memory error of this step (memory.snapshot_on_oom): writes the allocator as it was at
  // the error, with its latest actions, and returns the file ("" when there is none to write).
  std::string write_oom_snapshot();

 private:
  void on_event(bool device, const core::TraceEvent& e) noexcept;
  void write_scalars(int64_t step, const std::vector<std::pair<std::string, float>>& v);

  const RunConfig& c_;
  parallel::Communicator& comm_;
  core::CachingAllocator &device_, &host_;
  std::unique_ptr<core::EventWriter> tensorboard_;
  bool traced_ = false;  // allocator traces installed
  std::atomic<core::Timeline*> timeline_{nullptr};
  std::unique_ptr<core::Timeline> owned_;
  int device_track_ = 0, host_track_ = 0;
  int64_t step_ = 0;
  // The device allocator's latest actions, for the history of an out-of-memory snapshot (as PyTorch's
  // _record_memory_history keeps max_entries).
  std::deque<core::MemvizAction> history_;
  static constexpr std::size_t kHistoryKept = 20'000;
  bool history_off_ = false;           // the history could not be kept (out of host memory)
  core::AllocatorSnapshot oom_state_;  // the device allocator at this step's out-of-memory error
  bool have_oom_state_ = false;
};

}  // namespace hr::train
