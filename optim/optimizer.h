// Optimizers over a ParamStore: AdamW, SGD with momentum, Adafactor. States are f32; low-precision
// parameters get f32 master weights. Where the states live is the caller's choice (a device, or the host
// for offload); the optimizer never decides that itself.
#pragma once

#include <string>

#include "core/io/safetensors.h"
#include "models/params.h"

namespace hr::optim {

using core::Device;
using core::Tensor;
using models::ParamStore;

enum class OptimizerKind : uint8_t { AdamW, SGD, Adafactor };
const char* optimizer_name(OptimizerKind k);
OptimizerKind parse_optimizer(const std::string& s);  // adamw | sgd | adafactor

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::AdamW;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // adam_beta1/2, adam_epsilon
  float weight_decay = 0.f;
  float momentum = 0.9f;  // sgd
  bool nesterov = false;
};

// Whether a parameter takes weight decay: not biases and not norm weights (Hugging Face Trainer's rule).
bool decays(const std::string& param_name);

class Optimizer {
 public:
  // Allocates the states of every trainable parameter (categories optimizer and master_params).
  Optimizer(ParamStore& params, const OptimizerConfig& config);

  // One update with learning rate `lr`; gradients are multiplied by `grad_scale` first (1/loss scale times
  // the clipping coefficient). Parameters without a gradient buffer are left alone.
  void step(float lr, float grad_scale);
  // Parameters whose name starts with `prefix` step with lr * ratio (LLaVA's mm_vision_tower_lr).
  void set_lr_ratio(const std::string& prefix, float ratio);
  int64_t steps() const { return steps_; }

  // States for a checkpoint: "<param>.exp_avg", ".exp_avg_sq", ".momentum_buffer", ".exp_avg_sq_row/col",
  // ".master"; and back. Loading checks every name and shape.
  core::NamedTensors state() const;
  void load_state(const core::Checkpoint& ckpt, int64_t steps);

 private:
  struct Slot {
    models::Param* param;
    Tensor master, a, b;  // a/b: exp_avg/exp_avg_sq, momentum/-, row/col
    bool decay;
    float lr_ratio = 1.f;
  };
  ParamStore& params_;
  OptimizerConfig cfg_;
  std::vector<Slot> slots_;
  int64_t steps_ = 0;
};

}  // namespace hr::optim
