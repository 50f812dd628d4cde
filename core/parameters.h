// Named parameters (llava-hf names) in typed groups, their gradients, the store that owns them, and the hooks
// a model calls around each group's use: what the optimizer, ZeRO and checkpoints see of a model.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/ops/params.h"
#include "core/quant.h"
#include "core/tensor.h"

namespace hr::core {

// What a parameter is within its layer: how it is initialised and whether it takes weight decay follow from
// this, never from its name.
enum class ParamRole : uint8_t {
  Weight,      // a matrix or an embedding: Normal(0, 0.02), weight decay
  Bias,        // zeros, no weight decay
  NormWeight,  // a norm's scale: ones, no weight decay
  LoraA,       // a LoRA adapter's down projection (r, in): Kaiming-uniform as PEFT, weight decay
  LoraB,       // its up projection (out, r): zeros, weight decay
};

struct Param {
  std::string name;
  Shape shape;  // the full shape, also while ZeRO-3 holds only a shard and `data` is released
  DType dtype = DType::F32;
  // A quantized frozen weight (lora.base_bits): `data` is its u8 blob of quant.bytes, `shape` {quant.bytes}, and
  // the weight it stands for is (quant.rows, quant.cols). quant.bytes is 0 for every other parameter.
  QuantLayout quant;
  Tensor data;
  Tensor grad;  // undefined until the first backward that produces it; never allocated when frozen
  // The gradient's dtype: the parameter's, or f32 for a 16-bit parameter whose store accumulates in f32.
  DType grad_dtype = DType::F32;
  bool trainable = true;
  int group = -1;  // index of its group in the store
  ParamRole role = ParamRole::Weight;

  // The gradient buffer, zero-filled on first use (tagged `grads`, owned by the parameter's module): for a kernel
  // that adds onto some of its elements (an embedding's rows).
  Tensor& ensure_grad();
  // The gradient buffer for a kernel that writes or adds onto every element, and which of the two it must do: with
  // no gradient yet, a new buffer left unfilled and Accumulate::No (PyTorch's zero_grad(set_to_none=True): the first
  // backward writes the gradient, without a pass of zeros or reading them back); else the buffer, Accumulate::Yes.
  struct GradTarget {
    Tensor grad;
    Accumulate accumulate = Accumulate::Yes;
  };
  GradTarget grad_target();
  int64_t numel() const { return shape_numel(shape); }  // stored elements (a quantized weight's bytes)
  bool quantized() const { return quant.bytes > 0; }
  int64_t count() const { return quantized() ? quant.numel() : numel(); }  // the parameters it stands for
};

// The module a parameter belongs to: its name up to the last '.' ("a.b.weight" -> "a.b").
std::string owner_of(const std::string& param_name);

// What a group of parameters is in a vision-language model (a vision encoder, a projector, a decoder): the
// planner's cost model, per-module learning rates, freezing and precision go by it, never by names.
enum class GroupKind : uint8_t {
  Embedding,     // the token embeddings
  EncoderStem,   // the vision encoder's patch and position embeddings and its norms
  EncoderLayer,  // one vision encoder layer
  Projector,     // the multimodal projector
  DecoderLayer,  // one language-model layer
  Head,          // the decoder's final norm, or its output projection
};
const char* group_kind_name(GroupKind k);
bool is_encoder(GroupKind k);  // EncoderStem or EncoderLayer
bool is_decoder(GroupKind k);  // Embedding, DecoderLayer or Head

// A set of parameters used together (a transformer block, the embeddings, the head), in the order the
// forward pass first uses them. ZeRO shards, gathers and reduces per group.
struct ParamGroup {
  std::string name;
  GroupKind kind = GroupKind::DecoderLayer;
  std::vector<Param*> params;
};

enum class Pass : uint8_t { Forward, Backward };

// Called by the model around each group's use, and when a pass ends. ZeRO-3 gathers a group's parameters
// before and releases them after; ZeRO-2 reduce-scatters a group's gradients after its backward.
class GroupHooks {
 public:
  virtual ~GroupHooks() = default;
  virtual void before(int group, Pass pass) = 0;
  virtual void after(int group, Pass pass) = 0;
  virtual void end_pass(Pass pass) = 0;
};

// Sees what each group's block computed, before its `after` hook: the output in the forward pass, the gradient
// it passes back in the backward pass. Installed only while a numerical fault is diagnosed.
class OutputWatch {
 public:
  virtual ~OutputWatch() = default;
  virtual void output(int group, Pass pass, const Tensor& t) = 0;
};
inline void watch_output(OutputWatch* w, int group, Pass pass, const Tensor& t) {
  if (w) w->output(group, pass, t);
}

inline void hook_before(GroupHooks* h, int group, Pass pass) {
  if (h) h->before(group, pass);
}
inline void hook_after(GroupHooks* h, int group, Pass pass) {
  if (h) h->after(group, pass);
}
inline void hook_end_pass(GroupHooks* h, Pass pass) {
  if (h) h->end_pass(pass);
}

class ParamStore {
 public:
  ParamStore(Device device, DType dtype) : device_(device), dtype_(dtype) {}
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  // A new, empty group; returns its index.
  int add_group(const std::string& name, GroupKind kind);
  // While a scope lives, parameters added to the store join its group.
  class GroupScope {
   public:
    GroupScope(ParamStore& store, int group);
    ~GroupScope();
    GroupScope(const GroupScope&) = delete;
    GroupScope& operator=(const GroupScope&) = delete;

   private:
    ParamStore& store_;
    int saved_;
  };
  // Allocates an uninitialised parameter in the current group (category params, owner = its module), in
  // the store's dtype or the one set for its group's kind.
  Param& add(const std::string& name, const Shape& shape, ParamRole role = ParamRole::Weight);
  // A frozen (rows, cols) weight held quantized in `format` (category params, like every weight).
  Param& add_quantized(const std::string& name, int64_t rows, int64_t cols, const QuantFormat& format);
  void set_dtype_for(GroupKind kind, DType dtype) { dtype_for_[kind] = dtype; }
  // Gradients of 16-bit parameters accumulate in `dtype` from here on (f32: DeepSpeed's grad_accum_dtype fp32,
  // what PyTorch's autocast keeps); others in their own dtype. No gradient may exist yet.
  void accumulate_grads_in(DType dtype);
  DType dtype_of(GroupKind kind) const;
  Param* find(const std::string& name);
  const std::vector<std::unique_ptr<Param>>& all() const { return params_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  GroupKind kind_of(const Param& p) const { return groups_[std::size_t(p.group)].kind; }
  Device device() const { return device_; }
  DType dtype() const { return dtype_; }

  // Marks every parameter of the groups of `kind` as frozen (no gradient) or trainable; quantized weights stay
  // frozen.
  void set_trainable(GroupKind kind, bool trainable);
  // Releases every gradient buffer (the next backward allocates zeroed ones).
  void zero_grad();
  // Parameters (a quantized weight's, not its bytes): all, or the trainable ones.
  enum class Counting : uint8_t { All, Trainable };
  int64_t count(Counting which = Counting::All) const;

 private:
  Param& add_typed(const std::string& name, const Shape& shape, ParamRole role, DType dtype);

  Device device_;
  DType dtype_;
  std::vector<std::unique_ptr<Param>> params_;
  std::vector<ParamGroup> groups_;
  std::map<std::string, Param*> by_name_;
  std::map<GroupKind, DType> dtype_for_;
  DType accumulate_in_ = DType::F32;  // for 16-bit parameters; set by accumulate_grads_in
  bool accumulate_wide_ = false;
  int current_group_ = -1;
};

// A model as data parallelism and ZeRO see it: parameters in groups, the order each pass visits the groups,
// and where the hooks go. Sharding needs nothing else of a model.
class GroupedParams {
 public:
  virtual ~GroupedParams() = default;
  virtual ParamStore& params() = 0;
  const std::vector<ParamGroup>& groups() { return params().groups(); }
  // Every group a pass can visit, in the order it visits them whatever the data. A rank that skips some (a
  // micro-batch without images) leaves them out of its hook calls, and the sharding makes their collectives
  // in this order, so that every rank issues the same ones.
  virtual const std::vector<int>& pass_order(Pass pass) const = 0;
  // The group whose parameters `group` computes with beside its own (a tied lm_head multiplies by the embedding's
  // table), -1 for none: ZeRO-3 gathers them for it too, and stages 2-3 reduce what its backward adds to their
  // gradients when it ends.
  virtual int borrowed_group(int group) const {
    (void)group;
    return -1;
  }
  // Hooks called around each group's use and at the end of each pass; nullptr for none.
  virtual void set_hooks(GroupHooks* hooks) = 0;
};

}  // namespace hr::core
