// An optimizer's states for one run of elements (a parameter, or one rank's shard of a parameter group) and
// the one update that steps it: the Optimizer and ZeRO hold their states differently but name, allocate and
// update them with this.
#pragma once

#include <functional>
#include <string>

#include "core/io/safetensors.h"
#include "core/tensor.h"

namespace hr::optim {

using core::Tensor;

enum class OptimizerKind : uint8_t { AdamW, SGD, Adafactor, AdamW8bit };
// adamw | sgd | adafactor | adamw_8bit (also Hugging Face's adamw_bnb_8bit)
OptimizerKind parse_optimizer(const std::string& s);
const char* optimizer_name(OptimizerKind kind);  // as train.optimizer spells it
// 8-bit AdamW keeps f32 moments for runs of fewer elements than this (bitsandbytes' min_8bit_size).
constexpr int64_t kMin8bitElements = 4096;

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::AdamW;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // adam_beta1/2, adam_epsilon
  float weight_decay = 0.f;
  float momentum = 0.9f;  // sgd
  bool nesterov = false;
};

// Every state is f32 but 8-bit AdamW's codes. Names are those of torch.optim and bitsandbytes (state1/2,
// absmax1/2) and of headroom's checkpoints.
struct OptimizerState {
  Tensor master;                          // f32 master weights (low-precision or offloaded parameters)
  Tensor exp_avg, exp_avg_sq;             // AdamW
  Tensor momentum_buffer;                 // SGD with momentum
  Tensor exp_avg_sq_row, exp_avg_sq_col;  // Adafactor's factored second moment (row: the whole of it, 1-D)
  // 8-bit AdamW (runs of kMin8bitElements or more): the moments' u8 codes and f32 block scales (ops/optimizer.h)
  Tensor state1, absmax1, state2, absmax2;

  // Views of every state over [begin, end) of a flat run. 8-bit codes and scales only from a block's first element
  // (begin a multiple of core::kAdam8bitBlock): a view's blocks are then blocks of the whole run.
  OptimizerState slice(int64_t begin, int64_t end) const;
  // Calls f(suffix, tensor) for each defined state, suffix as in checkpoints (".exp_avg", ".master", ...).
  void for_each(const std::function<void(const char* suffix, const Tensor& t)>& f) const;
};

// The moments of `config` for a run of `shape` on `device`, zeroed (category optimizer; the caller's scope
// names the owner). Adafactor factors the second moment of a shape with at least 2 dims; 8-bit AdamW keeps codes and
// block scales (which runs keep f32 moments instead is the caller's choice: moments_for).
OptimizerState zero_moments(const OptimizerConfig& config, const core::Shape& shape, core::Device device);

struct StepArgs {
  float lr = 0.f;            // this run's learning rate (the schedule's, times its module's ratio)
  float weight_decay = 0.f;  // 0 for biases and norm weights
  int64_t step = 1;          // 1-based, for bias correction
  float grad_scale = 1.f;    // 1/loss scale times the clipping coefficient
};

// One update of `param` from `grad` with the states `s` (views of the same run).
void update(const OptimizerConfig& config, const Tensor& param, const Tensor& grad, const OptimizerState& s,
            const StepArgs& args);

}  // namespace hr::optim
