// Runs one training step: its micro-batches drawn from the loader, forward and backward through the engine (an
// out-of-memory error halves the micro-batches and redoes the step, with memory.on_oom: shrink_micro_batch), the
// loss scaler's verdict, clipping and the optimizer update, and the ranks' agreement on whether to stop.
#pragma once

#include <chrono>
#include <vector>

#include "data/loader.h"
#include "optim/schedule.h"
#include "train/console.h"
#include "train/engine.h"
#include "train/observe.h"
#include "train/step_record.h"

namespace hr::train {

class StepRunner {
 public:
  struct Parts {
    Engine& engine;
    data::DataLoader& loader;
    optim::LossScaler& scaler;
    core::CachingAllocator &device, &host;
    RunObservers& observers;
    StepPredictions& predictions;
    Console& console;
    parallel::Communicator& comm;         // the ranks (the stop agreement)
    parallel::Communicator& collectives;  // where the engine's collectives go (exposed communication)
  };
  StepRunner(const RunConfig& c, Parts parts);

  StepOutcome run(int64_t step, float lr);

  // Micro-batches per loader batch: doubled by each recovered out-of-memory error.
  int64_t split() const { return split_; }
  // fp16: the run diverged, its steps overflowing at the minimum loss scale memory.loss_scale.max_skips_at_min
  // times in a row.
  bool diverged() const;
  int64_t skips_at_min() const { return skips_at_min_; }
  int64_t nonfinite_steps() const { return nonfinite_steps_; }

 private:
  using Clock = std::chrono::steady_clock;
  // This step's batches from the loader, each cut in split_ micro-batches.
  struct Drawn {
    std::vector<data::LoadedBatch> batches, pending;  // as the loader gave them; their micro-batches
    StepShapes shapes;                                // of each micro-batch run
    std::size_t at = 0;
  };
  void draw(Drawn& d);
  Engine::StepStats forward_backward(Drawn& d, StepOutcome& out);
  // After an out-of-memory error: whether the step can be redone smaller (then it is prepared for that).
  bool shrink(Drawn& d, StepOutcome& out);
  void update(const Drawn& d, StepOutcome& out);
  bool agree_on_stop();

  const RunConfig& c_;
  Parts p_;
  int64_t split_ = 1;
  int64_t skips_at_min_ = 0;  // fp16: steps in a row skipped on overflow at the minimum loss scale
  int64_t nonfinite_steps_ = 0;
};

// A loader batch in `parts` micro-batches of consecutive samples, each padded as the loader pads.
std::vector<data::LoadedBatch> split_batch(const data::LoadedBatch& lb, int64_t parts, const RunConfig& c);

}  // namespace hr::train
