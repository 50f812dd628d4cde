// Training checkpoints: output_dir/checkpoint-STEP/ holding model.safetensors (llava-hf names),
// optimizer.safetensors and trainer_state.json (step, data position, loss scaler). A checkpoint directory
// appears complete or not at all (written under a temporary name, fsync'ed, renamed); the last K are kept.
#pragma once

#include <optional>
#include <string>

#include "models/data/loader.h"
#include "models/llava.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"

namespace hr::train {

struct TrainerState {
  int64_t step = 0;  // optimizer steps completed
  models::LoaderPosition loader;
  optim::LossScaler::State scaler{65536.f, 0, -1, 2};
  int64_t skipped_steps = 0;
};

void save_checkpoint(const std::string& output_dir, const models::Llava& model, const optim::Optimizer& optimizer,
                     const TrainerState& state, int64_t keep_last);

// The newest complete checkpoint directory in output_dir, if any.
std::optional<std::string> latest_checkpoint(const std::string& output_dir);

// Loads model weights, optimizer state and trainer state; errors name the file and what is wrong.
TrainerState load_checkpoint(const std::string& dir, models::Llava& model, optim::Optimizer& optimizer);

}  // namespace hr::train
