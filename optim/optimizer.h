// Optimizers over a ParamStore: AdamW, SGD with momentum, Adafactor, one state per trainable parameter.
// Low-precision parameters get f32 master weights. Where the states live is the caller's choice (a device, or
// the host for offload); the optimizer never decides that itself.
#pragma once

#include <string>
#include <vector>

#include "core/io/safetensors.h"
#include "core/parameters.h"
#include "optim/state.h"

namespace hr::optim {

using core::Device;
using core::ParamStore;

// Whether a parameter takes weight decay: not biases and not norm weights (Hugging Face Trainer's rule).
bool decays(const core::Param& p);
// Whether a parameter is an embedding table (token or position embeddings: Hugging Face's nn.Embedding modules).
// 8-bit AdamW keeps f32 moments for them, as Hugging Face's Trainer does for adamw_bnb_8bit (bitsandbytes'
// GlobalOptimManager override to 32 bits: the rows a batch does not touch would decay through the quantization).
bool embedding_table(const core::Param& p);
// Whether 8-bit AdamW keeps a parameter's moments in f32: embedding tables, and runs under kMin8bitElements.
bool keeps_f32_moments(const core::Param& p);
// The optimizer that steps `p` under `config`: f32 AdamW for the parameters 8-bit AdamW keeps f32 moments for.
OptimizerConfig moments_for(const OptimizerConfig& config, const core::Param& p);

class Optimizer {
 public:
  // Allocates the states of every trainable parameter (categories optimizer and master_params).
  Optimizer(ParamStore& params, const OptimizerConfig& config);

  // One update with learning rate `lr`; gradients are multiplied by `grad_scale` first (1/loss scale times
  // the clipping coefficient). Parameters without a gradient buffer are left alone.
  void step(float lr, float grad_scale);
  // Parameters of the groups of `kind` step with lr * ratio (LLaVA's mm_vision_tower_lr, mm_projector_lr).
  void set_lr_ratio(core::GroupKind kind, float ratio);
  int64_t steps() const { return steps_; }

  // States for a checkpoint, "<param>" + OptimizerState's suffixes; and back. Loading checks every name and
  // shape.
  core::NamedTensors state() const;
  void load_state(const core::Checkpoint& ckpt, int64_t steps);

 private:
  struct Slot {
    core::Param* param;
    OptimizerState state;
    bool decay;
    float lr_ratio = 1.f;
  };
  ParamStore& params_;
  OptimizerConfig cfg_;
  std::vector<Slot> slots_;
  int64_t steps_ = 0;
};

}  // namespace hr::optim
