// The plan of a config as given: the dry run of its worst-case step (predictor.cpp), capped to the usable bytes
// when its cache would pass them, its evaluation passes, its parameters by module, the cost model's step time
// (cost_model.cpp) and the closed-form breakdown (closed_form.cpp). The search over `auto` keys is plan_search.cpp;
// the devices planned for are devices.cpp.
#include "train/planner.h"

#include <unistd.h>

#include <algorithm>

#include "train/engine.h"
#include "train/plan_parts.h"

namespace hr::train {

using namespace hr::core;
using namespace hr::models;

// ---- decisions ----

std::string Decisions::describe() const {
  std::string s = str("micro ", micro_batch_size, " x accumulation ", gradient_accumulation_steps, ", ZeRO ",
                      zero_stage, ", checkpointing vision ", vision_frozen ? "frozen" : checkpoint_name(vision_ckpt),
                      " / llm ", checkpoint_name(llm_ckpt), llm_keep_last ? " (last block kept)" : "");
  if (vision_act_offload || llm_act_offload)
    s += str(", activations of ",
             vision_act_offload && llm_act_offload ? "vision and llm"
             : llm_act_offload                     ? "llm"
                                                   : "vision",
             " on cpu");
  if (zero_stage == 3) s += str(", prefetch ", prefetch_groups);
  if (offload_optimizer == parallel::Offload::Cpu) s += ", optimizer on cpu";
  if (offload_params == parallel::Offload::Cpu) s += ", params on cpu";
  if (optimizer == optim::OptimizerKind::AdamW8bit) s += ", 8-bit AdamW";
  if (allocator != AllocatorKind::Caching) s += str(", ", allocator_kind_name(allocator), " allocator");
  return s + ", " + precision_name(precision);
}

namespace {

Decisions decisions_of(const RunConfig& c) {
  Decisions d;
  d.precision = c.precision;
  d.vision_ckpt = c.vision_ckpt.kind;
  d.llm_ckpt = c.llm_ckpt.kind;
  d.llm_keep_last = c.llm_ckpt.keep_last;  // set by keep_last_block_if_free only where it changes something
  d.optimizer = c.optimizer.kind;
  d.vision_act_offload = c.vision_ckpt.offload && c.vision_ckpt.kind != CheckpointKind::None;
  d.llm_act_offload = c.llm_ckpt.offload && c.llm_ckpt.kind != CheckpointKind::None;
  d.allocator = c.allocator;
  d.micro_batch_size = c.micro_batch_size;
  d.gradient_accumulation_steps = c.gradient_accumulation_steps;
  d.zero_stage = c.zero.stage;
  d.prefetch_groups = c.zero.prefetch_groups;
  d.offload_optimizer = c.zero.offload_optimizer;
  d.offload_params = c.zero.offload_params;
  return d;
}

}  // namespace

// ---- plans ----

bool plans_evaluation(const RunConfig& c) {
  return !c.eval_json.empty() || (c.train_json.empty() && c.synth_eval > 0);
}

int64_t Plan::total_predicted() const {
  int64_t peak = rank.peak_reserved;
  // Past the usable bytes the allocator frees its cached blocks and retries: then what is allocated counts.
  if (evaluates)
    for (const Prediction* e : {&eval, &generation})
      peak = std::max(peak, e->peak_reserved <= usable ? e->peak_reserved : e->peak_allocated);
  return peak + runtime_reserve;
}

namespace {

// Before a dry run builds the model (on the meta device, but its modules and parameter records are host memory):
// the parameters alone, in the smallest dtype they are held in and sharded as far as the stage shards them, must
// fit where they live. A model that cannot fit anywhere (num_hidden_layers: 100000000) is refused by this
// arithmetic, whatever memory.preflight says, instead of being built.
void check_parameters_can_fit(const RunConfig& c, const DevicePreset& device, int world) {
  const models::LlavaConfig& m = c.model.config;
  double per_param = double(dtype_size(param_dtype(c.precision)));
  if (c.lora_enable && c.lora.quantizes_base()) per_param = std::min(per_param, c.lora.base_bits / 8.0);
  const bool sharded = c.zero.stage == 3;
  const double bytes = double(m.parameter_count()) * per_param / (sharded ? world : 1);
  const bool on_host = sharded && c.zero.offload_params == parallel::Offload::Cpu;
  const double room =
      on_host ? double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE)) : double(device.capacity);
  HR_CHECK(room <= 0 || bytes <= room, "[plan] ", m.largest_part(), ": the model's ", double(m.parameter_count()),
           " parameters take at least ", format_bytes(bytes), sharded ? " per rank" : "", " as ",
           precision_name(c.precision), " parameters, more than ", on_host ? "this host's " : "the ",
           format_bytes(room), on_host ? "" : " of " + device.name,
           "; no plan can fit, so none is dry-run (smaller model sizes, or ZeRO-3 over more ranks)");
}

// First uncapped: the peaks as they are. If the reserved peak passes the usable bytes, again on a meta device
// capped there: the allocator frees its cache and retries exactly as the real one would, so the step either fits
// that way or runs out of memory here instead of on the device.
void plan_step(Plan& p, Predictor& pred, core::SizingTarget target) {
  p.rank = pred.step(pred.worst_case());
  p.fits = p.usable > 0 && p.rank.peak_reserved <= p.usable;
  if (p.fits || p.usable <= 0 || p.rank.peak_allocated > p.usable) return;
  try {
    Predictor capped(p.config, p.world, 0, target, std::size_t(p.usable));
    p.rank = capped.step(capped.worst_case());
    p.fits = p.retries = true;
  } catch (const OutOfMemory&) {  // the uncapped prediction stands, with its reserved peak over the budget
  }
}

// The evaluation's loss pass and generation at their worst-case shapes, and the KV cache generation holds.
void plan_evaluation(Plan& p, Predictor& pred) {
  const RunConfig& c = p.config;
  p.evaluates = true;
  pred.begin_evaluation();
  p.eval = pred.evaluation(pred.eval_worst_case());
  const GenerationShape g = pred.generation_worst_case();
  p.generation = pred.generation(g);
  const models::LlmConfig& llm = c.model.config.llm;
  const int64_t rows = p.eval_rows = int64_t(g.prompt_lengths.size());
  p.kv_cache_bytes = KvCache::bytes(llm, rows, c.max_seq_len + g.max_new_tokens - 1, pred.model().params().dtype());
  p.model_element_bytes = int64_t(dtype_size(pred.model().params().dtype()));
  p.generation_logits_bytes = rows * llm.vocab * p.model_element_bytes;
  // The allocator frees its cached blocks and retries before it fails, so what must fit is what is allocated.
  p.eval_fits = p.usable > 0 && std::max(p.eval.peak_allocated, p.generation.peak_allocated) <= p.usable;
  p.fits = p.fits && p.eval_fits;
}

// The parameter table's rows, in the model's order.
std::vector<std::pair<std::string, int64_t>> params_by_module(const Llava& model) {
  std::vector<std::pair<std::string, int64_t>> rows;
  for (const ParamGroup& g : model.groups()) {
    int64_t n = 0;
    for (const Param* q : g.params) n += q->count();
    const std::string module = module_name(g.kind);
    auto row = std::find_if(rows.begin(), rows.end(), [&](const auto& r) { return r.first == module; });
    if (row == rows.end())
      rows.emplace_back(module, n);
    else
      row->second += n;
  }
  return rows;
}

}  // namespace

Plan make_plan(const RunConfig& config, const DevicePreset& device, int world) {
  check_parameters_can_fit(config, device, world);
  Plan p;
  p.decisions = decisions_of(config);
  p.config = config;
  p.device = device;
  p.world = world;
  parallel::validate(config.zero, config.optimizer);
  HR_CHECK(!(config.precision == Precision::BF16 && !device.bf16), "[plan] ", device.name,
           " has no bf16 arithmetic; use memory.precision: fp16 or fp32");
  const core::SizingTarget target = sizing_target(device);
  p.capacity = int64_t(device.capacity);
  p.runtime_reserve = int64_t(device.runtime_reserve);
  p.usable = int64_t(double(config.budget) * double(device.capacity)) - p.runtime_reserve;
  Predictor pred(config, world, 0, target);
  plan_step(p, pred, target);
  if (config.eval_batch_size > 0 && plans_evaluation(config)) plan_evaluation(p, pred);
  const Llava& model = pred.model();
  p.params_total = model.params().count();
  p.params_trainable = model.params().count(core::ParamStore::Counting::Trainable);
  p.params_by_module = params_by_module(model);
  const ParamCounts counts = param_counts(model);
  p.decisions.vision_frozen = !counts.vision_trainable;
  p.decisions.vision_act_offload = p.decisions.vision_act_offload && !p.decisions.vision_frozen;
  p.time = step_time(p, counts);
  p.closed_form = closed_form(p, model);
  return p;
}

bool may_keep_last_block(const Plan& p) {
  const RunConfig& c = p.config;
  return !c.llm_ckpt.keep_last && c.llm_ckpt.recomputes_last(c.model.config.llm.layers) && p.fits;
}

Plan keep_last_block_if_free(Plan p) {
  if (!may_keep_last_block(p)) return p;
  RunConfig r = p.config;
  r.llm_ckpt.keep_last = true;
  Plan kept = make_plan(r, p.device, p.world);
  const double reserved_room = (1 + kKeptBlockReservedRoom) * double(p.rank.peak_reserved);
  if (!kept.fits || kept.retries > p.retries || kept.rank.peak_allocated > p.rank.peak_allocated ||
      double(kept.rank.peak_reserved) > reserved_room || kept.rank.host_peak > p.rank.host_peak)
    return p;
  kept.decisions_changed = std::move(p.decisions_changed);
  return kept;
}

}  // namespace hr::train
