// The training run: data, model, optimizer and the step loop (micro-batches with accumulation, loss scaling,
// clipping, optimizer step), evaluation, checkpoints, the memory log and the console.
#pragma once

#include <memory>

#include "parallel/comm.h"
#include "train/checkpoint.h"
#include "train/config.h"

namespace hr::train {

struct TrainOptions {
  bool resume = false;  // continue from the newest checkpoint in output_dir
  bool finish = true;   // save and evaluate after the last step (headroom bench: no)
};

// Runs the whole training as one rank of `comm` (every rank calls it); returns the process exit code.
// Errors throw hr::Error.
int run_training(const RunConfig& config, const TrainOptions& options, parallel::Communicator& comm);

// The stop signal (SIGTERM, SIGINT) this process received during run_training, or 0.
int stop_signal();

// Prepares the synthetic data set in `dir` unless it is already there with the same parameters.
void ensure_synthetic_data(const RunConfig& config, const std::string& dir);

// Where a run's data is: the config's files, or the synthetic set under output_dir/data, which rank 0 of
// `comm` writes on first use while the others wait.
struct DataPaths {
  std::string train_json, eval_json, image_folder;
};
DataPaths resolve_data_paths(const RunConfig& config, parallel::Communicator& comm);
// The dataset options of `config` for one of its files.
// The run's tokenizer (data.tokenizer, see config.h).
std::shared_ptr<const data::Tokenizer> load_run_tokenizer(const RunConfig& config);
// The tokenizer files a Hugging Face directory may hold, which checkpoints carry.
inline constexpr const char* kHfTokenizerFiles[] = {"tokenizer.model", "tokenizer.json", "tokenizer_config.json",
                                                    "special_tokens_map.json", "added_tokens.json"};
// What checkpoints carry for Hugging Face (checkpoint.h): the run's tokenizer files (data.tokenizer's directory,
// or model.name_or_path's) and preprocessor_config.json, its token ids, train.max_shard_size.
HfSidecar run_hf_sidecar(const RunConfig& config);
// The image normalisation: model.name_or_path's (or model.vision_tower's) preprocessor_config.json, else CLIP's.
data::ImageNorm run_image_norm(const RunConfig& config);
data::DataOptions data_options(const RunConfig& config, const std::string& json_path, const std::string& image_folder);

}  // namespace hr::train
