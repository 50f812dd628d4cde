// The training engine: the model on a device as the plan decided (precision, trainable groups), its ZeRO
// sharding, and one training step (every micro-batch's forward and backward, the gradient reductions, the
// global norm, the optimizer update). The trainer runs it on the real device; the planner runs exactly the
// same code on the meta device, which is why its prediction is exact.
#pragma once

#include <functional>
#include <memory>

#include "data/loader.h"
#include "models/llava.h"
#include "parallel/zero.h"
#include "train/config.h"

namespace hr::train {

core::DType param_dtype(Precision p);

class Engine {
 public:
  // Builds the model (parameters uninitialised) with its trainable groups set by the config's stage.
  Engine(const RunConfig& config, core::Device device, parallel::Communicator& comm);
  ~Engine();
  models::Llava& model() { return *model_; }
  // Shards the (now initialised or loaded) parameters and allocates the optimizer states.
  void shard();
  parallel::Zero& zero() { return *zero_; }
  parallel::Communicator& comm() { return comm_; }

  struct Accumulated {
    double loss_sum = 0;     // over this rank's micro-batches
    int64_t tokens = 0;      // this rank's
    float scaled_norm = 0;   // global gradient norm, still multiplied by the loss scale
  };
  // Forward and backward of `micro_batches` batches from `next`, then the reductions and the global norm.
  Accumulated accumulate(const std::function<data::LoadedBatch()>& next, int64_t micro_batches, float loss_scale);
  // The optimizer update; `grad_scale` = clipping coefficient / loss scale. Ends the step: the gradients
  // are released.
  void update(float lr, float grad_scale);
  // Ends a step without updating (an fp16 overflow): the gradients are released all the same.
  void skip_update();

 private:
  const RunConfig& config_;
  parallel::Communicator& comm_;
  std::unique_ptr<models::Llava> model_;
  std::unique_ptr<parallel::Zero> zero_;
  models::ModelOptions options_;
};

}  // namespace hr::train
