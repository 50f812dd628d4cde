// Parameterised layers (linear, layer norm, RMS norm) over the core ops: forward, and a backward that
// accumulates parameter gradients into their buffers when the parameters are trainable.
#pragma once

#include "core/ops/norm.h"
#include "core/parameters.h"
#include "models/config.h"

namespace hr::models {

using core::Bias;
using core::Device;
using core::DType;
using core::GroupedParams;
using core::GroupHooks;
using core::GroupKind;
using core::OutputWatch;
using core::Param;
using core::ParamGroup;
using core::ParamRole;
using core::ParamStore;
using core::Pass;
using core::Shape;
using core::Tensor;

// Whether a backward returns its input's gradient: a layer whose input nothing upstream trains (the patch embedding,
// the projector before a frozen vision tower) skips it.
enum class InputGrad : uint8_t { Skip, Compute };
// What a forward keeps for its backward: what its checkpoint policy says, or nothing (inference, or a part whose
// gradients nobody needs: a frozen vision tower).
enum class Saving : uint8_t { ForBackward, Nothing };

// The LoRA dropout key of the training pass under way on this thread: a model sets one around a micro-batch's
// forward and again around its backward (recomputation included), so both draw the same masks; none is set in
// evaluation and generation, which drop nothing.
class LoraDropoutScope {
 public:
  explicit LoraDropoutScope(uint64_t key);
  ~LoraDropoutScope();
  LoraDropoutScope(const LoraDropoutScope&) = delete;
  LoraDropoutScope& operator=(const LoraDropoutScope&) = delete;
  static const uint64_t* current();

 private:
  const uint64_t* saved_;
  uint64_t key_;
};

// Rows [from, from + count) of one row layout are rows [to, to + count) of another.
struct RowRun {
  int64_t from = 0, to = 0, count = 0;
};
// The last tails[s] rows of each of the back-to-back sequences of `lengths` rows, one after another: the rows a
// layer that runs only each sequence's tail keeps (TokenLayout::tail_rows), in order.
std::vector<RowRun> tail_runs(const std::vector<int64_t>& lengths, const std::vector<int64_t>& tails);
// The rows of x (N, C) that `runs` name, at their `to` in a (rows, C) tensor; the rows no run fills are zeros.
Tensor pack_rows(const Tensor& x, const std::vector<RowRun>& runs, int64_t rows);
// pack_rows' backward: the packed rows back at their positions of a zero tensor of `shape` (viewed as (N, C)).
Tensor unpack_rows(const Tensor& packed, const std::vector<RowRun>& runs, const Shape& shape);
// x (N, C) += the packed rows at their positions: the sum of a gradient and pack_rows' backward, without the zeros.
void add_unpacked_(const Tensor& x, const Tensor& packed, const std::vector<RowRun>& runs);

struct Linear {
  Param* weight = nullptr;  // (out, in); a conv weight (out, c, p, p) is viewed as (out, c*p*p); or quantized
  bool quantized() const { return weight->quantized(); }
  Param* bias = nullptr;    // (out) or null
  Param* lora_a = nullptr;  // (r, in) or null: LoRA's down projection
  Param* lora_b = nullptr;  // (out, r)
  float lora_scale = 0.f, lora_dropout = 0.f;
  uint64_t lora_id = 0;  // this layer's part of the dropout key

  // With `lora` naming this layer (the last part of `prefix`), adds its adapters; with `lora` quantizing the base,
  // the weight is held quantized (whether adapted or not).
  static Linear make(ParamStore& store, const std::string& prefix, int64_t in, int64_t out, core::Bias bias,
                     const LoraSpec* lora = nullptr);
  Tensor forward(const Tensor& x) const;
  // The layer, then the activation `op`: pre is the layer's output (what the activation's backward reads), act the
  // activation. With `fuse` the bias add runs inside the activation's pass, where that gives the same values: a
  // bias, no adapters (they add onto the biased output) and an unquantized weight.
  struct Activated {
    Tensor pre, act;
  };
  Activated forward_activated(const Tensor& x, core::UnaryOp op, bool fuse) const;
  // Adds dW (and db) into the gradient buffers when trainable, and dA, dB for adapters; returns dx unless `input`
  // says to skip it (a first layer, whose input nothing upstream needs the gradient of).
  Tensor backward(const Tensor& dy, const Tensor& x, InputGrad input = InputGrad::Compute) const;
  int64_t in() const { return quantized() ? weight->quant.cols : weight->numel() / weight->shape[0]; }
  int64_t out() const { return quantized() ? weight->quant.rows : weight->shape[0]; }

 private:
  Tensor w2d() const { return weight->data.view({out(), in()}); }
};

struct LayerNorm {
  Param* weight = nullptr;
  Param* bias = nullptr;
  float eps = 1e-5f;

  static LayerNorm make(ParamStore& store, const std::string& prefix, int64_t dim, float eps);
  // residual: the fused residual add (x += residual in place, core/ops/norm.h); add_to_dx: its gradient, added onto
  // dx in the same pass.
  core::NormOut forward(const Tensor& x, const Tensor& residual = Tensor()) const;
  Tensor backward(const Tensor& dy, const Tensor& x, const core::NormSaved& saved,
                  const Tensor& add_to_dx = Tensor()) const;
};

struct RMSNorm {
  Param* weight = nullptr;
  float eps = 1e-6f;

  static RMSNorm make(ParamStore& store, const std::string& prefix, int64_t dim, float eps);
  core::NormOut forward(const Tensor& x, const Tensor& residual = Tensor()) const;  // as LayerNorm's
  Tensor backward(const Tensor& dy, const Tensor& x, const core::NormSaved& saved,
                  const Tensor& add_to_dx = Tensor()) const;
};

}  // namespace hr::models
