// Training checkpoints: output_dir/checkpoint-STEP/ holding model.safetensors (llava-hf names; not written
// at ZeRO-3, whose parameters live in the shards), the optimizer state (optimizer.safetensors, or one
// optimizer.rankR.safetensors per rank when it is sharded), config.yaml and trainer_state.json (step, data
// position, loss scaler, world size). Every rank writes its part into one temporary directory, which rank 0
// fsyncs and renames: a checkpoint appears complete or not at all. The last K are kept.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/loader.h"
#include "models/hf_config.h"
#include "models/llava.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "parallel/zero.h"

namespace hr::train {

struct TrainerState {
  int64_t step = 0;  // optimizer steps completed
  data::LoaderPosition loader;
  optim::LossScaler::State scaler{65536.f, 0, -1, 2};
  int64_t skipped_steps = 0;
  int64_t optimizer_steps = 0;
  int64_t oom_recoveries = 0;          // this run's, not saved
  int world_size = 1, zero_stage = 0;  // of the run that wrote it
};

// What makes a checkpoint a directory Hugging Face opens beside config.json: the tokenizer files and
// preprocessor_config.json of the run (copied as they are; a preprocessor_config.json of the run's image size and
// normalisation is written when none is carried), the token ids for config.json and generation_config.json,
// and the largest model.safetensors before it is sharded (model-0000K-of-0000N.safetensors and
// model.safetensors.index.json, as save_pretrained's max_shard_size).
struct HfSidecar {
  std::vector<std::string> files;
  std::vector<std::pair<std::string, std::string>> written;  // file name, content: written instead of copied
  std::string preprocessor_json;
  models::TokenIds tokens;
  std::size_t max_shard_bytes = std::size_t(5) * 1000 * 1000 * 1000;  // transformers' "5GB"
};
// Copies / writes the sidecar's files into `dir`.
void write_hf_sidecar(const std::string& dir, const HfSidecar& sidecar);
// The model's weights into `dir`: one model.safetensors, or shards and an index above max_shard_bytes.
void save_model_weights(const std::string& dir, const core::NamedTensors& weights, std::size_t max_shard_bytes);
// Whether `dir` holds a whole model (model.safetensors or model.safetensors.index.json).
bool has_model_weights(const std::string& dir);

// Collective: every rank calls it.
void save_checkpoint(const std::string& output_dir, const models::Llava& model, const parallel::Zero& zero,
                     const TrainerState& state, int64_t keep_last, parallel::Communicator& comm,
                     const std::string& config_yaml, const HfSidecar& sidecar = {});

// The newest complete checkpoint directory in output_dir, if any.
std::optional<std::string> latest_checkpoint(const std::string& output_dir);
// Finishes the saves a crash interrupted after their files were whole (a .complete-checkpoint-N without its
// checkpoint-N is renamed into place; one beside its checkpoint-N is the other half of a swap and goes). Returns the
// checkpoints it put in place. Rank 0 calls it before a resume looks for the latest checkpoint.
std::vector<std::string> recover_checkpoints(const std::string& output_dir);

// Loads a model's weights for inference from a checkpoint-STEP directory (its model.safetensors, or at ZeRO-3
// the consolidated.safetensors `headroom ckpt consolidate` writes) or a .safetensors file of llava-hf names.
void load_inference_weights(models::Llava& model, const std::string& path);

// Resuming is in three parts: the trainer state, the full model weights (before the model is sharded), and
// the optimizer state (after: each rank keeps its shard, whatever the world size that wrote it). Errors name
// the file and what is wrong.
TrainerState read_trainer_state(const std::string& dir);
// trainer_state.json's text (`where` names it in errors): every value present, of its type and in its range (whole
// numbers from 0 to kMaxTrainerCount, optimizer_steps and skipped_steps at most step, a positive finite loss scale,
// a ZeRO stage from 0 to 3), or an error naming the file and the key.
TrainerState parse_trainer_state(const std::string& text, const std::string& where);
constexpr int64_t kMaxTrainerCount = int64_t(1) << 62;
// The loader position of checkpoint `dir`'s state against the run's data set of `samples` samples (`data` names
// it): an offset inside it, and an epoch whose sample count fits in 64 bits.
void check_loader_position(const TrainerState& state, const std::string& dir, int64_t samples, const std::string& data);
void load_model_weights(const std::string& dir, models::Llava& model);
// Loads the LoRA adapters a directory holds (PEFT's adapter_model.safetensors, in its adapter/ as checkpoints
// write them, or in itself) into the model; false when it has none. A directory with adapters and a model without them
// is an error saying which lora.* keys to set.
bool load_adapters_in(const std::string& dir, models::Llava& model);
void load_optimizer_state(const std::string& dir, parallel::Zero& zero, int64_t optimizer_steps);

// The full model of a checkpoint (model.safetensors, its shards, or the ZeRO-3 shards) written to one llava-hf
// file, or with out_dir set, into that directory as save_model_weights does.
void consolidate_checkpoint(const std::string& dir, const models::Llava& model, const std::string& out,
                            bool out_dir = false, std::size_t max_shard_bytes = HfSidecar{}.max_shard_bytes);

}  // namespace hr::train
