// The training run: data, model, optimizer and the step loop (micro-batches with accumulation, loss scaling,
// clipping, optimizer step), evaluation, checkpoints, the memory log and the console.
#pragma once

#include <memory>

#include "parallel/comm.h"
#include "train/config.h"

namespace hr::train {

struct TrainOptions {
  bool resume = false;  // continue from the newest checkpoint in output_dir
  bool finish = true;   // save and evaluate after the last step (headroom bench: no)
};

// Runs the whole training as one rank of `comm` (every rank calls it); returns the process exit code.
// Errors throw hr::Error.
int run_training(const RunConfig& config, const TrainOptions& options, parallel::Communicator& comm);

}  // namespace hr::train
