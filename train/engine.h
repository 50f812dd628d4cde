// The training engine: the model on a device as the config says (precision, trainable groups), its ZeRO
// sharding, and its lifecycle: start (fresh) or load (resume), step (every micro-batch's forward and
// backward, the reductions, the global norm), update, save. The trainer runs it on the real device; the
// planner runs exactly the same code on the meta device, which is why its prediction is exact.
#pragma once

#include <functional>
#include <memory>
#include <optional>

#include "data/loader.h"
#include "models/llava.h"
#include "parallel/zero.h"
#include "train/checkpoint.h"
#include "train/config.h"

namespace hr::train {

core::DType param_dtype(Precision p);

// The model a config describes, on `device`: its dtype (and the vision tower's, with vision_precision: fp32)
// and which groups train at the config's stage. Parameters are uninitialised.
std::unique_ptr<models::Llava> build_model(const RunConfig& config, core::Device device);

class Engine {
 public:
  Engine(const RunConfig& config, core::Device device, parallel::Communicator& comm);
  ~Engine();
  models::Llava& model() { return *model_; }
  parallel::Zero& zero() { return *zero_; }
  parallel::Communicator& comm() { return comm_; }

  // A fresh run: random weights from the run's seed (the same on every rank) or train.init_weights, then
  // sharded by the ZeRO stage.
  TrainerState start();
  // A resumed run: the full weights of checkpoint `dir`, sharded, then this rank's optimizer state (any world
  // size and stage wrote it). Returns where the run continues.
  TrainerState load(const std::string& dir);
  // Shards the parameters as they are, with nothing to load (the planner's dry runs).
  void shard();

  struct StepStats {
    double loss = 0;          // mean over the micro-batches and the ranks
    int64_t tokens = 0;       // over all ranks
    int64_t loss_tokens = 0;  // the labelled ones the loss averages over, over all ranks
    double flops = 0;         // what the micro-batches' matrix products ran (core::matmul_flops), over all ranks
    float scaled_norm = 0;    // global gradient norm, still multiplied by the loss scale (inf/NaN: overflow)
    float loss_scale = 1;     // the scale the backward ran with
  };
  // Forward and backward of `micro_batches` batches from `next`, then the gradient reductions and the global
  // norm. This is what can run out of memory and be redone with smaller micro-batches. `after_micro`, when
  // given, is called after each micro-batch with its index and returns how many of the following ones to
  // leave out (a dry run that has seen them all repeat, see Predictor::step).
  StepStats step(const std::function<data::LoadedBatch()>& next, int64_t micro_batches, float loss_scale,
                 const std::function<int64_t(int64_t)>& after_micro = nullptr);
  // The optimizer update; `grad_scale` = clipping coefficient / loss scale. Ends the step: the gradients are
  // released.
  void update(float lr, float grad_scale);
  // Ends a step without updating (an fp16 overflow): the gradients are released all the same.
  void skip_update();
  // After a step with a non-finite loss or gradient norm: redoes the forward and backward of `batch` with a
  // watch on every group's output and input gradient, and returns the first group that produced a
  // non-finite value, its pass and its non-finite parameters ("" if this rank's batch produced none). Every
  // rank calls it (ZeRO's collectives run in lockstep); the step then ends with skip_update().
  std::string diagnose_nonfinite(const data::LoadedBatch& batch, float loss_scale);
  // A checkpoint of `state` in the output dir (collective: every rank writes its part). Refused, on every rank,
  // when any rank holds a non-finite weight or optimizer state: the last good checkpoint stays the last one.
  void save(const TrainerState& state);
  // The first of this rank's tensors a checkpoint writes that holds a NaN or an infinity ("" when none).
  std::string first_nonfinite_tensor() const;

 private:
  const RunConfig& config_;
  parallel::Communicator& comm_;
  std::unique_ptr<models::Llava> model_;
  std::unique_ptr<parallel::Zero> zero_;
  models::ModelOptions options_;
};

}  // namespace hr::train
