// The run's data sets: the options and paths of the files a config names, and the synthetic VQA set written under
// output_dir/data on first use.
#pragma once

#include <cstdio>
#include <string>

#include "data/dataset.h"
#include "data/loader.h"
#include "parallel/comm.h"
#include "train/config.h"

namespace hr::train {

// Prepares the synthetic data set in `dir` unless it is already there with the same parameters (saying so on `out`).
void ensure_synthetic_data(const RunConfig& config, const std::string& dir, std::FILE* out = stdout);

// Where a run's data is: the config's files, or the synthetic set under output_dir/data, which rank 0 of
// `comm` writes on first use while the others wait.
struct DataPaths {
  std::string train_json, eval_json, image_folder;
};
DataPaths resolve_data_paths(const RunConfig& config, parallel::Communicator& comm, std::FILE* out = stdout);
// The loader options of `config` for `rank` of `world`: its order, batching and padding.
data::LoaderOptions loader_options(const RunConfig& config, int rank, int world);
// The dataset options of `config` for one of its files.
data::DataOptions data_options(const RunConfig& config, const std::string& json_path, const std::string& image_folder);

}  // namespace hr::train
