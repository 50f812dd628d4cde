// The memory planner (DESIGN §5). A dry run builds the real engine on the meta device and runs one real
// training step at the worst-case shapes through the same caching allocator: on the CPU back-end its peaks
// equal the real run's byte for byte. A closed-form breakdown explains the numbers, a cost model predicts the
// step time, and a search fills every strategy key set to `auto` with the fastest plan that fits.
// Its parts: predictor.cpp (the dry runs), planner.cpp (a plan of a config as given), cost_model.cpp and
// closed_form.cpp (beside the dry run, internal: plan_parts.h), plan_search.cpp (the search, the fixes),
// plan_print.cpp (the table and plan.json); the devices planned for are devices.h.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/memory/arena_plan.h"
#include "core/memory/category.h"
#include "core/memory/device_memory.h"
#include "core/memory/replay.h"
#include "core/memory/timeline.h"
#include "models/llava.h"
#include "parallel/comm.h"
#include "train/config.h"
#include "train/devices.h"
#include "train/evaluate.h"

namespace hr::train {

class Engine;

struct MicroShape {
  int64_t batch = 0, seq = 0, images = 0;
  // AnyRes: each image's size, which decides its crops and tokens (the batch's memory); empty otherwise.
  std::vector<data::Resolution> image_sizes;
  // train.padding_free: the lengths of the sequences the LLM runs, packed (models::packed_lengths; empty when it runs
  // the whole batch), and how many of each one's last positions its last layer runs (models::tail_lengths; empty:
  // all). A real batch and its synthetic_batch allocate alike.
  std::vector<int64_t> packed = {}, tails = {};
  auto operator<=>(const MicroShape&) const = default;
};

// What a dry run of `batch` runs: its rows, length, images and their sizes, and with c's train.padding_free the
// LLM's packed sequences and its last layer's rows of them.
MicroShape shape_of(const data::Batch& batch, const RunConfig& c);

// AnyRes: the size of each image of the plan's worst case: the largest layout (the most crops, then the most
// tokens) a sequence of data.max_seq_len has room for beside its BOS, a token of text and its other images, at most
// data.max_image_tokens; or c.plan_image (`headroom plan --image-size`), shrunk under data.max_image_tokens as the
// loader would.
data::Resolution planned_image(const RunConfig& c);

// A batch of shape `s` for dry runs and tests: each row starts with BOS and its images' placeholders; every
// later position has a label (the image's too), up to its packed length, and from its tail on where it has one. What
// the tokens are does not change what is allocated. Pixel values live on `host`: zeros on a real host, nothing at all
// on a meta one.
data::LoadedBatch synthetic_batch(const models::LlavaConfig& m, const MicroShape& s, core::Device host);

using CategoryBytes = std::array<int64_t, core::kNumCategories>;

struct Prediction {
  int64_t peak_allocated = 0, peak_reserved = 0;
  int64_t persistent = 0;   // allocated before the step: parameters, states, shards
  CategoryBytes at_peak{};  // by category at the moment of the peak (sums to peak_allocated)
  CategoryBytes category_peaks{};
  std::string peak_owner;  // the module whose allocation reached the peak
  std::string activation_peak_owner;
  int64_t host_peak = 0;  // host memory of the step (offloaded states, batch buffers)
  CategoryBytes host_at_peak{};
  // The step's device allocation requests in order: replayed on the state a real allocator is in when the
  // step starts, they give its reserved peak, which depends on what that allocator has cached.
  std::shared_ptr<const core::RequestTrace> requests;
  // Micro-batches recorded as repetitions of the one before them rather than run (see Predictor::step).
  int64_t micro_batches_repeated = 0;
  // memory.allocator: planned: where the step's requests go in the arena (worked out from `requests`).
  std::shared_ptr<const core::ArenaLayout> layout;
};

// What a traced dry run keeps besides its prediction (headroom plan --trace / --snapshot).
struct StepRecording {
  core::Timeline* timeline = nullptr;  // receives the step's allocator events and phase slices (may be null)
  core::AllocatorSnapshot start;       // the meta device's allocator when the step started
};

// Holds an engine on a meta device of its own (its own memory context: several predictors can exist at once)
// and predicts training steps.
class Predictor {
 public:
  // `target`: whose workspace sizes the meta device mirrors. `capacity` (0: none) caps the meta device like
  // the real one, so a step that would run out of memory throws OutOfMemory here too.
  Predictor(const RunConfig& config, int world, int rank, core::SizingTarget target, std::size_t capacity = 0);
  ~Predictor();
  Predictor(const Predictor&) = delete;
  Predictor& operator=(const Predictor&) = delete;
  // One step of the given micro-batches (their count is the accumulation). With `recording`, every
  // micro-batch runs (none is recorded as a repetition) and the recording is filled. With `arena_held` (the bytes
  // of arena the real allocator holds before the step: a run's steps, one after another), a planned allocator's
  // layout may be an earlier step's of this predictor (core::ArenaLayouts) rather than packed anew.
  Prediction step(const std::vector<MicroShape>& micro_batches, StepRecording* recording = nullptr,
                  std::optional<std::size_t> arena_held = std::nullopt);
  // Of the steps' layouts: how many were packed, and how many earlier ones reused (with `arena_held`).
  const core::ArenaLayouts& layouts() const { return layouts_; }
  // Accumulation x (micro, max_seq_len, micro x max_images_per_sample).
  std::vector<MicroShape> worst_case() const;
  std::vector<data::Resolution> worst_image_sizes(int64_t images) const;
  // Inference on the engine as a step has left it (parameters, gradients, states persist): an evaluation loss
  // pass, and generation (the KV cache, the prefill, one decode step: every later step allocates the same).
  Prediction evaluation(const EvalShape& shape);
  Prediction generation(const GenerationShape& shape);
  // Before an evaluation: under memory.allocator: planned the trainer releases what the steps left cached (the
  // arena), so that evaluation's exactly sized segments do not come on top of it; so does the dry run.
  void begin_evaluation();
  // What evaluation runs at its largest: eval_rows() sequences of max_seq_len tokens (their images, the logits
  // of max_new_tokens positions each), and as many prompts of max_seq_len tokens generating train.max_new_tokens.
  EvalShape eval_worst_case() const;
  GenerationShape generation_worst_case() const;
  // Sequences per evaluation batch: train.eval_batch_size, or fewer when a rank's share of the samples is smaller.
  int64_t eval_rows() const;
  const models::Llava& model() const;

 private:
  RunConfig config_;
  core::MemoryContext memory_;  // the meta device and the meta host; outlives the engine
  std::unique_ptr<parallel::Communicator> comm_;
  std::unique_ptr<Engine> engine_;
  core::ArenaLayouts layouts_;
  // A dry run of `pass` on the meta device: the allocators' peaks and the device's requests. `rec` (a step that
  // records) gets the starting snapshot and the timeline; with `stretch` a planned allocator runs the pass as one
  // stretch and lays its arena out from the requests (`arena_held`: as step() says).
  Prediction dry_run(const std::function<void(core::RequestTrace&)>& pass, StepRecording* rec = nullptr,
                     bool stretch = false, std::optional<std::size_t> arena_held = std::nullopt);
};

struct Decisions {
  Precision precision = Precision::FP32;
  models::CheckpointKind vision_ckpt = models::CheckpointKind::None, llm_ckpt = models::CheckpointKind::None;
  bool llm_keep_last = false;  // the checkpointed LLM's last block keeps everything (models::CheckpointPolicy)
  // No gradient reaches the vision tower (frozen, no adapters): its forward keeps nothing, whatever its policy says.
  bool vision_frozen = false;
  bool vision_act_offload = false, llm_act_offload = false;  // memory.offload_activations
  optim::OptimizerKind optimizer = optim::OptimizerKind::AdamW;
  int64_t micro_batch_size = 1, gradient_accumulation_steps = 1;
  int zero_stage = 0;
  int prefetch_groups = 1;  // ZeRO-3's all-gathers started ahead
  parallel::Offload offload_optimizer = parallel::Offload::None, offload_params = parallel::Offload::None;
  core::AllocatorKind allocator = core::AllocatorKind::Caching;
  // "micro 4 x accumulation 2, ZeRO 2, checkpointing vision none / llm selective, ..." ("vision frozen" for a frozen
  // tower)
  std::string describe() const;
};

struct StepTime {
  double compute_s = 0, recompute_s = 0, comm_s = 0, offload_s = 0;
  // Of comm_s, what runs under compute: ZeRO-3's parameter all-gathers started a group ahead
  // (parallel.prefetch_groups > 0) overlap the previous group's compute; the first group's of each pass does not.
  double hidden_comm_s = 0;
  // Of the offload's transfers, what moves under other work (not in offload_s): at ZeRO 2-3 gradients leave for the
  // host during the last backward; at ZeRO-3 updated shards go back while the next group updates on the host.
  double hidden_offload_s = 0;
  // memory.offload_activations: the kept tensors' copies to the host and back over PCIe, and the part of them no
  // block's compute hides (in total()).
  double act_offload_s = 0, exposed_act_offload_s = 0;
  double flops = 0;        // per step and rank, recompute included
  double model_flops = 0;  // per step and rank, recompute not credited (the model's FLOPs, as MFU counts them)
  double exposed_comm_s() const { return comm_s - hidden_comm_s; }
  double total() const { return compute_s + exposed_comm_s() + offload_s + exposed_act_offload_s; }
};

// One row of the closed-form breakdown beside the dry run.
struct ClosedFormRow {
  std::string item;
  int64_t formula = 0, dry_run = 0;
  std::string how;  // the formula in words
};

struct Plan {
  Decisions decisions;
  RunConfig config;  // the input config with the decisions applied
  DevicePreset device;
  int world = 1;
  int64_t capacity = 0, runtime_reserve = 0, usable = 0;  // usable = budget x capacity - runtime reserve
  bool fits = false;     // the step ran on a meta device capped at `usable` without running out of memory
  bool retries = false;  // it fits only because the allocator frees its cache and retries (as the real one will)
  Prediction rank;       // every rank's prediction: shards are padded, so ranks differ in nothing the plan sees
  StepTime time;
  int64_t params_total = 0, params_trainable = 0;
  std::vector<std::pair<std::string, int64_t>> params_by_module;
  std::vector<ClosedFormRow> closed_form;
  std::string decisions_changed;  // for a suggested fix: what changed from the input config
  // The training step's peak reserved and allocated per rank under each memory.allocator (caching, expandable,
  // planned; -1 where not worked out), each from a dry run with that allocator (compare_allocators).
  std::array<int64_t, 3> reserved_by_allocator{-1, -1, -1}, allocated_by_allocator{-1, -1, -1};
  core::ArenaPlan arena;  // planned: the step's arena beside the live peak of its requests
  // Evaluation, when the run evaluates (an eval set, or the synthetic set's): the loss pass and generation at
  // their largest, run on the engine as the training step leaves it.
  bool evaluates = false, eval_fits = true;
  Prediction eval, generation;
  int64_t kv_cache_bytes = 0, generation_logits_bytes = 0;  // the closed forms beside the generation dry run
  int64_t model_element_bytes = 0;                          // of the model precision (the cache's and logits')
  int64_t eval_rows = 0;                                    // sequences per evaluation batch
  // The largest reserved peak of the run (training step, evaluation, generation) plus the runtime reserve.
  int64_t total_predicted() const;
  int64_t train_predicted() const { return rank.peak_reserved + runtime_reserve; }
};

// Whether a run of `config` evaluates: it names an eval set, or trains on the synthetic set (which has one).
bool plans_evaluation(const RunConfig& config);

// A checkpointed LLM's last block: its backward starts as soon as the loss is computed, so recomputing it redoes the
// forward just run. `p` again with that block kept whole (models::CheckpointPolicy::keep_last) when, dry-run, that
// adds nothing to the peak allocated (where the loss's buffers rather than a block's backward make the peak, keeping
// it does add) and at most kKeptBlockReservedRoom (0.5%) to the reserved peak (the cache's blocks split differently),
// and still fits (with p's decisions_changed); else `p`. One more plan (when may_keep_last_block): the search
// applies it to its fastest plan, compare_allocators to each allocator's, suggest_fixes to each fix it offers and
// max_micro_batch to the largest micro-batch that fits as given.
Plan keep_last_block_if_free(Plan p);
inline constexpr double kKeptBlockReservedRoom = 0.005;
bool may_keep_last_block(const Plan& p);
// The plan for `config` exactly as given (every auto must already be decided).
Plan make_plan(const RunConfig& config, const DevicePreset& device, int world);
struct Search {
  std::vector<Plan> ranked;  // fitting plans, fastest first, then the rest by peak
  int evaluated = 0;
  double seconds = 0;
  bool any_auto = false;
};
// Fills every `auto` key by search: the fastest predicted plan whose peak fits the budget.
Search search_plans(const RunConfig& config, const DevicePreset& device, int world);

// The cheapest changes to a config that does not fit (up to `count`), each a fitting plan; then 8-bit AdamW states
// and LoRA, which change the arithmetic or what trains, where they fit. Each plan is the one `train` would make of
// its config (the last block kept where that is free).
std::vector<Plan> suggest_fixes(const RunConfig& config, const DevicePreset& device, int world, int count = 3);

// Dry runs of `plan`'s step under every memory.allocator (filling reserved_by_allocator); with memory.allocator:
// auto, the plan of the kind whose run reserves least (its step's or its evaluation's peak, whichever is larger)
// and fits (the search assumes planned).
Plan compare_allocators(const Plan& plan);
// The plan a run of `config` takes from its search: the fastest, its allocator compared under memory.allocator: auto.
Plan chosen_plan(const Search& search, const RunConfig& config);

// The largest micro-batch that fits (accumulation adjusted to keep the global batch when there is one); 0: none.
Plan max_micro_batch(const RunConfig& config, const DevicePreset& device, int world, int64_t limit = 1024);

// Printing.
std::string plan_table(const Plan& plan);
std::string plan_json(const Plan& plan);
std::string search_explanation(const Search& s, std::size_t show = 10);

}  // namespace hr::train
