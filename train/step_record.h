// What a finished step measured, beside what its dry run predicted: the memory.jsonl record of one step (the
// dry run of its exact shapes, its replay from the state the allocator started in, the mismatch check, the
// leak watch). Data only: the console prints it, the memory log writes it.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/lru_map.h"
#include "core/memory/caching_allocator.h"
#include "train/engine.h"
#include "train/memory_log.h"
#include "train/observe.h"
#include "train/planner.h"

namespace hr::train {

// The shape of each micro-batch a step ran.
using StepShapes = std::vector<MicroShape>;

// Dry runs of the step shapes seen, the kKept most recently used: batches whose lengths vary make new shapes
// for the whole run, and each dry run keeps the step's request trace.
class StepPredictions {
 public:
  // `device`: the allocator the steps run on; where it is planned, a step may take an earlier step's arena layout
  // (Predictor::step's arena_held).
  StepPredictions(Predictor& predictor, const core::CachingAllocator& device)
      : predictor_(predictor), device_(device) {}
  const Prediction& of(const StepShapes& shapes);
  int64_t dry_runs() const { return dry_runs_; }
  static constexpr std::size_t kKept = 64;

 private:
  Predictor& predictor_;
  const core::CachingAllocator& device_;
  core::LruMap<StepShapes, Prediction> predicted_{kKept};
  int64_t dry_runs_ = 0;
};

// What a step did, as the step runner (step_runner.h) hands it on.
struct StepOutcome {
  int64_t step = 0;  // its number, from 1
  float lr = 0;
  Engine::StepStats stats;
  StepShapes shapes;
  core::AllocatorSnapshot start;  // where the allocator began it (after an out-of-memory error, the redone step)
  bool skipped = false;           // the optimizer step was skipped: an fp16 overflow, or a non-finite step
  bool fp16_overflow = false;
  bool nonfinite = false;       // bf16/fp32: the loss or the gradient norm was not finite
  std::string nonfinite_where;  // what the diagnosis found on this rank ("": the fault was another rank's)
  int64_t oom_recoveries = 0;   // out-of-memory errors recovered in it by halving the micro-batches
  int64_t unlearnable = 0;      // micro-batches left without a label by data.max_seq_len
  bool stop_agreed = false;     // some rank was asked to stop (SIGTERM, SIGINT) by the step's end
  double seconds = 0, comm_exposed_s = 0;
};

struct MeasuredStep {
  StepRecord record;  // memory.jsonl's line, its warnings included
  core::MemoryStats device, host;
  int64_t rss = 0;
  std::string timeline;   // the step's memory timeline file, "" when it was not traced
  std::string leak;       // the leak watch's warnings, one a line, "" for none
  bool mismatch = false;  // the measured peaks are not the dry run's (never on the CPU: a bug)
};

class StepMeter {
 public:
  struct Where {
    int rank = 0, world = 1;
    int gpu = -1;  // the cuda:N the run trains on; -1 on the CPU
  };
  StepMeter(const RunConfig& c, core::CachingAllocator& device, core::CachingAllocator& host,
            StepPredictions& predictions, MemoryLog& log, RunObservers& observers, int64_t planned_peak, Where where);
  // Ends the step's timeline first (a dry run's phases must not land in it), then measures.
  MeasuredStep measure(const StepOutcome& s);

 private:
  StepRecord record_of(const StepOutcome& s) const;
  const RunConfig& c_;
  core::CachingAllocator &device_, &host_;
  StepPredictions& predictions_;
  MemoryLog& log_;
  RunObservers& observers_;
  int64_t planned_peak_;
  Where where_;
};

}  // namespace hr::train
