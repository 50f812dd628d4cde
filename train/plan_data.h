// `headroom plan --data-steps N`: the run's first N optimizer steps on its own data, every rank's micro-batches, each
// step dry-run at its own shapes. The planned worst case bounds them all; this shows how the real steps spread under
// it (what length grouping changes: a batch of tall images next to one of square ones).
#pragma once

#include <string>
#include <vector>

#include "train/config.h"
#include "train/devices.h"

namespace hr::train {

struct DataSteps {
  std::string data;  // the file the steps were read from
  int world = 1;
  int64_t steps = 0;
  std::vector<std::vector<int64_t>> peaks;  // [rank][step]: the dry run's peak allocated
  int64_t dry_runs = 0;                     // distinct (rank, step shapes) dry-run
  int64_t largest_image_tokens = 0;         // the most tokens one image of these steps made
};

// Reads the run's training data as the trainer does (the synthetic set is written under output_dir/data first if
// the config names none) and dry-runs each rank's first `steps` steps.
DataSteps dry_run_data_steps(const RunConfig& config, const DevicePreset& device, int world, int64_t steps);

// The spread of the steps' peaks against `planned` (the worst case's peak allocated), as lines of text.
std::string data_steps_table(const DataSteps& d, int64_t planned, bool grouped);
// The same as a JSON object: the peaks by rank and step, and the summary.
std::string data_steps_json(const DataSteps& d, int64_t planned, bool grouped);

}  // namespace hr::train
