// Data parallelism and ZeRO over a model's parameter groups. Stage 0 all-reduces gradients in buckets and
// steps a full optimizer on every rank; stage 1 keeps f32 master weights and optimizer states only for this
// rank's shard; stage 2 also reduce-scatters each group's gradients right after its backward, keeping only
// the shard; stage 3 also shards the parameters, gathering a group before its forward and backward and
// releasing it after. Offload puts master weights and states on the host and steps there; with stage 3
// parameter shards can live on the host too.
//
// Shards are per parameter: a parameter of n elements is padded to world x ceil(n / world) and rank r owns
// the r-th block. A group's shard is the concatenation of its parameters' blocks, so one collective moves a
// whole group. Every rank issues the same collectives in the same order: the model publishes the order in
// which each pass visits its groups, and the groups a rank skips (a micro-batch without images) get their
// collectives here, in that order; gradients missing on a rank count as zeros. A group may compute with another
// group's parameters besides its own (a tied lm_head with the embedding's table): stage 3 gathers them for it
// too, and stages 2-3 reduce what its backward adds to their gradients when it ends. Zero knows parameters and
// groups, never the model behind them.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "core/io/safetensors.h"
#include "core/parameters.h"
#include "optim/optimizer.h"
#include "parallel/comm.h"

namespace hr::parallel {

enum class Offload : uint8_t { None, Cpu };

struct ZeroOptions {
  int stage = 0;                              // memory.zero_stage
  Offload offload_optimizer = Offload::None;  // memory.offload_optimizer
  Offload offload_params = Offload::None;     // memory.offload_params (stage 3)
  int64_t bucket_bytes = 25 << 20;            // parallel.bucket_size: gradient all-reduce buckets (stages 0, 1)
  int prefetch_groups = 1;  // parallel.prefetch_groups (stage 3): groups whose all-gather starts ahead of use
  // parallel.overlap_comm (DeepSpeed's overlap_comm): at stages 2-3 a group's gradient reduce-scatter runs while
  // the next group's backward computes, and is finished after it; at stages 0-1 the step's last micro-batch
  // all-reduces its gradients bucket by bucket as the groups' backwards end, each bucket while the next fills.
  bool overlap_comm = true;
};

// Throws with the reason when the combination cannot be honoured (nothing is silently downgraded).
void validate(const ZeroOptions& z, const optim::OptimizerConfig& opt);

class Zero final : public core::GroupHooks {
 public:
  // Takes the model's full, initialised parameters (identical on every rank), shards them, and hooks itself
  // into the model's passes.
  Zero(core::GroupedParams& model, Communicator& comm, const optim::OptimizerConfig& opt, const ZeroOptions& z);
  ~Zero() override;
  Zero(const Zero&) = delete;
  Zero& operator=(const Zero&) = delete;

  // Before the first micro-batch of a step: starts from no gradients (end_step dropped the last step's; a
  // step redone after an out-of-memory error drops what its failed attempt left).
  void begin_step();
  // Before each micro-batch: whether it is the step's last (whose backward, at stages 0-1 with overlap_comm,
  // starts the gradient all-reduce).
  enum class MicroBatch : uint8_t { Earlier, Last };
  void begin_micro_batch(MicroBatch which);
  // After the last micro-batch's backward: the reductions still owed (all-reduce for stages 0 and 1).
  void finish_gradients();
  // The global gradient norm over all ranks (inf/NaN when some gradient overflowed).
  float grad_norm();
  // One optimizer update: `grad_scale` multiplies gradients first (1/loss scale times clipping).
  void step(float lr, float grad_scale);
  // After the update (or instead of it, for a skipped step): the per-parameter gradients are dropped, so
  // nothing a step allocated outlives it and evaluation or checkpointing between steps runs without them.
  void end_step();
  // Groups of `kind` step with lr * ratio.
  void set_lr_ratio(core::GroupKind kind, float ratio);
  int64_t steps() const;

  // Checkpoint state of this rank. Stage 0 without offload: the optimizer's own names (as a single process
  // writes them). Otherwise per group "<group>.exp_avg|exp_avg_sq|momentum_buffer|master|params" shards (8-bit
  // AdamW: "<group>.state1|absmax1|state2|absmax2", its per-rank blocks aligned to the codes' blocks and its f32-moment
  // parameters in parts of their own, a layout "zero.block_align" records).
  core::NamedTensors state() const;
  // Loads states written by `files.size()` ranks (one file per old rank, any old world size) and keeps this
  // rank's shards; parameters sharded at stage 3 come back from "<group>.params".
  void load_state(const std::vector<const core::Checkpoint*>& files, int64_t steps);
  // Full parameters of a checkpoint written by any world size from shard files (for consolidation).
  static core::NamedTensors consolidate(const std::vector<core::ParamGroup>& groups,
                                        const std::vector<const core::Checkpoint*>& files);

  bool shards_parameters() const { return z_.stage == 3; }
  // Whether the last micro-batch's backward differs from the others: it starts the all-reduce buckets (stages
  // 0-1), or sends the offloaded optimizer its gradients (stages 2-3).
  bool last_backward_differs() const {
    return buckets_gradients() || (z_.stage >= 2 && z_.offload_optimizer == Offload::Cpu);
  }
  const ZeroOptions& options() const { return z_; }

  void before(int group, core::Pass pass) override;
  void after(int group, core::Pass pass) override;
  void end_pass(core::Pass pass) override;

  struct Group;

 private:
  // Runs the hooks of the groups of `pass` before `until` (-1: all that remain) that the model skipped.
  void catch_up(core::Pass pass, int until);
  void use(int group, core::Pass pass);  // what before() does for a group
  // The parts a group computes with: its own, then those of the group it borrows (model_.borrowed_group).
  std::vector<Group*> parts_used_by(int group);
  // Whether `group` comes after the current one in the pass's order.
  bool later_in_pass(int group, core::Pass pass) const;
  std::string group_name(int group) const;
  int open_slices_ = 0;                   // group slices begun in a memory timeline and not yet ended
  void done(int group, core::Pass pass);  // what after() does
  // Stage 3: start_gather allocates a group's parameters and its gather buffer and starts the all-gather;
  // finish_gather waits for it and unpacks. gather() is both at once. prefetch() starts the groups after
  // `position` in the pass's order, up to prefetch_groups ahead, so that their all-gathers run while this
  // group computes.
  void start_gather(Group& g);
  void finish_gather(Group& g);
  void gather(Group& g);
  void prefetch(core::Pass pass, std::size_t position);
  void poll_gathers();
  void drop_pending_gathers();
  void release(Group& g);
  // `completes`: the shard is complete when this reduction ends (reduced() runs then); false for a borrowed group
  // whose own backward reduces again later in the pass.
  void reduce_scatter_grads(Group& g, bool completes = true);
  // Ends the reduce-scatters still running (overlap_comm): their shards are added to the groups' gradients and
  // their buffers freed.
  void finish_reductions();
  // A group's gradient shard is complete (its reduction ended): on the last micro-batch with the optimizer
  // offloaded, its copy to the host starts on the side stream, under the backward still to come.
  void reduced(Group& g);
  // Offload: waits for the side copies and drops the host buffers they filled (gradients sent ahead, the last
  // group's updated parameters).
  void settle_side_copies();
  void all_reduce_grads();
  // Whether the last backward all-reduces gradient buckets as its groups end (stages 0-1, overlap_comm, ranks > 1).
  bool buckets_gradients() const { return z_.stage <= 1 && z_.overlap_comm && comm_.world() > 1; }
  // Stages 0-1 with overlap_comm on the last micro-batch: the group's trainable gradients (zeros where this rank
  // has none) join the bucket being filled; a full bucket starts its all-reduce once the one before it has ended.
  void bucket_grads(int group);
  void add_to_bucket(core::Param* p);
  void start_bucket();
  void finish_bucket();
  // Which of this rank's flags are set on any rank (an i64 all-reduce of host buffers tagged comm).
  std::vector<bool> on_any_rank(const std::vector<bool>& mine);
  std::unique_ptr<Group> make_group(const std::string& name, const std::vector<core::Param*>& part,
                                    core::GroupKind kind);
  void make_states(Group& g, const core::Tensor& mine);
  void step_group(Group& g, float lr, float grad_scale);
  core::Tensor gradient_shard(Group& g);
  core::Tensor update_target(Group& g, core::Tensor* whole);
  void update_segments(Group& g, const core::Tensor& param, const core::Tensor& grad, float lr, float grad_scale);
  void store_update(const core::Tensor& dst, const core::Tensor& updated);

  core::GroupedParams& model_;
  std::array<std::size_t, 2> cursor_{};  // per pass: the position in its order
  Communicator& comm_;
  optim::OptimizerConfig opt_;
  ZeroOptions z_;
  int shard_world_ = 1, shard_rank_ = 0;
  int64_t align_ = 1;  // per-rank blocks round up to this (8-bit AdamW's block)
  // By model group id: its parts (one, or a frozen and a trainable one), none for a group with nothing to shard.
  std::vector<std::vector<std::unique_ptr<Group>>> groups_;
  std::unique_ptr<optim::Optimizer> local_;  // stage 0 without offload
  std::vector<Group*> reducing_;             // groups whose reduce-scatter is running (overlap_comm)
  struct Buckets;
  std::unique_ptr<Buckets> buckets_;  // stages 0-1: the all-reduce during the last backward
  bool last_micro_ = false;
  Tensor uploading_;  // stage 3 with offload: the host copy of the group whose updated parameters are arriving
  int64_t steps_ = 0;
  core::Device device_, state_device_, host_;  // host_: where host-side buffers go (a meta host in a plan)
};

}  // namespace hr::parallel
