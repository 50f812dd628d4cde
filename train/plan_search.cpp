// Strategy search: every key set to `auto` is filled with the fastest predicted plan that fits; the cheapest
// fixes for a plan that does not fit; the largest micro-batch that fits.
#include <algorithm>
#include <chrono>

#include "train/planner.h"

namespace hr::train {

using models::CheckpointKind;
using parallel::Offload;

namespace {

using Clock = std::chrono::steady_clock;

// Fitting before not, then the faster; at the same time f32 AdamW's exact states before 8-bit ones and activations
// kept on the device (offloading them moves bytes for nothing), then the smaller.
bool faster(const Plan& a, const Plan& b) {
  if (a.fits != b.fits) return a.fits;
  if (!a.fits) return a.rank.peak_reserved < b.rank.peak_reserved;
  if (a.time.total() != b.time.total()) return a.time.total() < b.time.total();
  const bool a_eight = a.config.optimizer.kind == optim::OptimizerKind::AdamW8bit,
             b_eight = b.config.optimizer.kind == optim::OptimizerKind::AdamW8bit;
  if (a_eight != b_eight) return b_eight;
  const bool a_moves = a.time.act_offload_s > 0, b_moves = b.time.act_offload_s > 0;
  if (a_moves != b_moves) return b_moves;
  return a.rank.peak_reserved < b.rank.peak_reserved;
}

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// The plan with micro-batch m (accumulation keeps the per-rank batch `per_rank` when given).
RunConfig with_micro(const RunConfig& c, int64_t m, int64_t per_rank, int world) {
  RunConfig r = c;
  r.micro_batch_size = m;
  r.gradient_accumulation_steps = per_rank > 0 ? per_rank / m : c.gradient_accumulation_steps;
  r.global_batch_size = r.micro_batch_size * r.gradient_accumulation_steps * world;
  r.micro_auto = false;
  return r;
}

// memory.offload_activations moves what checkpointing keeps: some group it is set for must checkpoint.
void validate_activation_offload(const RunConfig& c) {
  const bool asked = c.vision_ckpt.offload || c.llm_ckpt.offload;
  const bool checkpointed = (c.vision_ckpt.offload && c.vision_ckpt.kind != CheckpointKind::None) ||
                            (c.llm_ckpt.offload && c.llm_ckpt.kind != CheckpointKind::None);
  HR_CHECK(!asked || checkpointed,
           "[config] memory.offload_activations: cpu moves to the host what gradient checkpointing keeps of each "
           "block, and no group it is set for checkpoints; set memory.gradient_checkpointing (or its .llm / .vision) "
           "to selective or full");
}

// Whether the sharding and offload settings are a valid combination; the reason when not, if `why` is given.
bool valid(const RunConfig& c, std::string* why = nullptr) {
  try {
    parallel::validate(c.zero, c.optimizer);
    validate_activation_offload(c);
    return true;
  } catch (const Error& e) {
    if (why && why->empty()) *why = e.what();
    return false;
  }
}

// What the search may choose from: every value of a key set to `auto`, the key's own value otherwise.
struct Choices {
  std::vector<optim::OptimizerKind> optimizers;  // train.optimizer: auto: f32 AdamW or 8-bit AdamW
  std::vector<bool> act_offload;                 // memory.offload_activations of the groups set to auto
  std::vector<int> stages;
  std::vector<Offload> offloads;
  // Prefetch depth matters at ZeRO-3 only (deeper holds more gathered groups and hides no more in the cost model
  // past one, so the faster-then-smaller order takes 1 where it fits and 0 where only that fits).
  std::vector<int> depths;
  std::vector<CheckpointKind> vision, llm;
  std::vector<int64_t> micros;
  int64_t per_rank = 0;  // micro_auto: the per-rank batch micro x accumulation keeps (0: accumulation kept)
};

Choices choices(const RunConfig& c, int world) {
  Choices ch;
  ch.stages = c.zero_auto ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{c.zero.stage};
  ch.offloads = c.offload_auto ? std::vector<Offload>{Offload::None, Offload::Cpu}
                               : std::vector<Offload>{c.zero.offload_optimizer};
  ch.optimizers = c.optimizer_auto
                      ? std::vector<optim::OptimizerKind>{optim::OptimizerKind::AdamW, optim::OptimizerKind::AdamW8bit}
                      : std::vector<optim::OptimizerKind>{c.optimizer.kind};
  ch.act_offload =
      c.vision_act_offload_auto || c.llm_act_offload_auto ? std::vector<bool>{false, true} : std::vector<bool>{false};
  ch.depths = c.prefetch_auto ? std::vector<int>{0, 1, 2} : std::vector<int>{c.zero.prefetch_groups};
  const std::vector<CheckpointKind> all = {CheckpointKind::None, CheckpointKind::Selective, CheckpointKind::Full};
  const bool vision_trains = c.stage == Stage::Full && !c.model.freeze_vision;
  ch.vision = c.vision_ckpt_auto ? (vision_trains ? all : std::vector<CheckpointKind>{CheckpointKind::None})
                                 : std::vector<CheckpointKind>{c.vision_ckpt.kind};
  ch.llm = c.llm_ckpt_auto ? all : std::vector<CheckpointKind>{c.llm_ckpt.kind};
  ch.per_rank = c.micro_auto ? c.global_batch_size / world : 0;
  ch.micros = c.micro_auto ? divisors(ch.per_rank) : std::vector<int64_t>{c.micro_batch_size};
  return ch;
}

// One combination of the strategies the search chooses (the micro-batch apart).
struct Strategy {
  int stage;
  Offload offload;
  int depth;
  CheckpointKind vision, llm;
  bool act_offload;
  optim::OptimizerKind optimizer;
};

// Every combination of the choices, in the search's order; below ZeRO-3 one prefetch depth only.
std::vector<Strategy> combinations(const Choices& ch) {
  std::vector<Strategy> all;
  for (int stage : ch.stages)
    for (Offload off : ch.offloads)
      for (int depth : ch.depths)
        for (CheckpointKind v : ch.vision)
          for (CheckpointKind l : ch.llm)
            for (bool act : ch.act_offload)
              for (optim::OptimizerKind o : ch.optimizers)
                if (stage == 3 || depth == ch.depths.back()) all.push_back({stage, off, depth, v, l, act, o});
  return all;
}

// The config with the strategy's settings, none of them `auto` any more.
RunConfig with_strategy(const RunConfig& c, const Strategy& s) {
  RunConfig r = c;
  r.zero.stage = s.stage;
  r.zero.offload_optimizer = s.offload;
  r.zero.prefetch_groups = s.stage == 3 ? s.depth : (c.prefetch_auto ? 1 : c.zero.prefetch_groups);
  r.vision_ckpt.kind = s.vision;
  r.llm_ckpt.kind = s.llm;
  if (c.vision_act_offload_auto) r.vision_ckpt.offload = s.act_offload;
  if (c.llm_act_offload_auto) r.llm_ckpt.offload = s.act_offload;
  r.zero_auto = r.offload_auto = r.vision_ckpt_auto = r.llm_ckpt_auto = r.prefetch_auto = false;
  r.vision_act_offload_auto = r.llm_act_offload_auto = false;
  r.optimizer.kind = s.optimizer;
  r.optimizer_auto = false;
  return r;
}

// The peak grows with the micro-batch: binary search for the largest that fits. Every plan tried is ranked.
void search_micro_batch(const RunConfig& r, const Choices& ch, const DevicePreset& device, int world, Search& s) {
  std::size_t lo = 0, hi = ch.micros.size();
  while (lo < hi) {
    const std::size_t mid = (lo + hi) / 2;
    Plan p = make_plan(with_micro(r, ch.micros[mid], ch.per_rank, world), device, world);
    ++s.evaluated;
    const bool fit = p.fits;
    s.ranked.push_back(std::move(p));
    if (fit)
      lo = mid + 1;
    else
      hi = mid;
  }
}

// Changes to a config that a fix may make: each a --set description and the config it makes, kept where the
// sharding settings it leaves are valid.
struct Changes {
  const RunConfig& base;
  std::vector<std::pair<std::string, RunConfig>> list;

  void add(const std::string& what, const std::function<void(RunConfig&)>& f) {
    RunConfig r = base;
    f(r);
    if (valid(r)) list.emplace_back(what, r);
  }
};

// More checkpointing: the language model's, or both towers' where the vision tower trains.
void more_checkpointing(Changes& ch) {
  const RunConfig& c = ch.base;
  const bool vision_trains = c.stage == Stage::Full && !c.model.freeze_vision;
  for (CheckpointKind k : {CheckpointKind::Selective, CheckpointKind::Full}) {
    if (c.llm_ckpt.kind < k)
      ch.add(str("memory.gradient_checkpointing.llm=", models::checkpoint_name(k)),
             [&](RunConfig& r) { r.llm_ckpt.kind = k; });
    if (vision_trains && c.vision_ckpt.kind < k)
      ch.add(str("memory.gradient_checkpointing=", models::checkpoint_name(k)),
             [&](RunConfig& r) { r.llm_ckpt.kind = r.vision_ckpt.kind = k; });
  }
}

// The language model's kept activations on the host (memory.offload_activations): with its checkpointing as it is,
// or with selective or full checkpointing where it has less.
void activations_on_the_host(Changes& ch) {
  const RunConfig& c = ch.base;
  if (c.llm_ckpt.offload) return;
  for (CheckpointKind k : {CheckpointKind::Selective, CheckpointKind::Full}) {
    if (c.llm_ckpt.kind > k) continue;
    const std::string with =
        c.llm_ckpt.kind == k ? "" : str(" --set memory.gradient_checkpointing.llm=", models::checkpoint_name(k));
    ch.add(str("memory.offload_activations.llm=cpu", with), [&](RunConfig& r) {
      r.llm_ckpt.kind = std::max(r.llm_ckpt.kind, k);
      r.llm_ckpt.offload = true;
    });
  }
}

// Halved micro-batches that keep the per-rank batch (more accumulation).
void smaller_micro_batches(Changes& ch, int world) {
  const RunConfig& c = ch.base;
  const int64_t per_rank = c.micro_batch_size * c.gradient_accumulation_steps;
  for (int64_t m = c.micro_batch_size / 2; m >= 1; m /= 2)
    if (per_rank % m == 0)
      ch.add(str("train.micro_batch_size=", m, " (accumulation ", per_rank / m, ")"),
             [&](RunConfig& r) { r = with_micro(r, m, per_rank, world); });
}

// A higher ZeRO stage (several ranks), no ZeRO-3 prefetch, the optimizer offloaded, bf16 in place of fp32.
void sharding_and_precision(Changes& ch, int world) {
  const RunConfig& c = ch.base;
  if (world > 1)
    for (int z = c.zero.stage + 1; z <= 3; ++z)
      ch.add(str("memory.zero_stage=", z), [&](RunConfig& r) { r.zero.stage = z; });
  if (c.zero.stage == 3 && c.zero.prefetch_groups > 0)
    ch.add("parallel.prefetch_groups=0", [&](RunConfig& r) { r.zero.prefetch_groups = 0; });
  if (c.zero.offload_optimizer == Offload::None)
    ch.add("memory.offload_optimizer=cpu", [&](RunConfig& r) { r.zero.offload_optimizer = Offload::Cpu; });
  if (c.precision == Precision::FP32)
    ch.add("memory.precision=bf16", [&](RunConfig& r) { r.precision = Precision::BF16; });
}

// AnyRes: fewer crops an image, as LLaVA-NeXT's smaller grids: the pinpoints of the most tiles dropped, level by level
// (with LLaVA-NeXT's five, 2 x 2 goes first, then 3 x 1 and 1 x 3). The model then sees its images in fewer tiles.
void smaller_pinpoints(Changes& ch) {
  const models::LlavaConfig& m = ch.base.model.config;
  const int64_t size = m.vision.image_size;
  auto tiles = [&](const data::Resolution& p) { return (p.height / size) * (p.width / size); };
  std::vector<int64_t> levels;
  for (const data::Resolution& p : m.anyres.pinpoints) levels.push_back(tiles(p));
  std::sort(levels.begin(), levels.end());
  levels.erase(std::unique(levels.begin(), levels.end()), levels.end());
  for (std::size_t l = levels.size(); l-- > 1;) {
    std::vector<data::Resolution> kept;
    std::string list;
    for (const data::Resolution& p : m.anyres.pinpoints)
      if (tiles(p) < levels[l])
        kept.push_back(p), list += str(list.empty() ? "" : ", ", "[", p.height, ", ", p.width, "]");
    ch.add(str("model.image_grid_pinpoints=[", list, "]"),
           [&](RunConfig& r) { r.model.config.anyres.pinpoints = kept; });
  }
}

// Both at once: the language model fully checkpointed and a halved micro-batch.
void full_checkpointing_and_smaller_micro_batches(Changes& ch, int world) {
  const RunConfig& c = ch.base;
  if (c.llm_ckpt.kind == CheckpointKind::Full) return;
  const int64_t per_rank = c.micro_batch_size * c.gradient_accumulation_steps;
  for (int64_t m = c.micro_batch_size / 2; m >= 1; m /= 2)
    if (per_rank % m == 0)
      ch.add(str("memory.gradient_checkpointing.llm=full and train.micro_batch_size=", m), [&](RunConfig& r) {
        r = with_micro(r, m, per_rank, world);
        r.llm_ckpt.kind = CheckpointKind::Full;
      });
}

// The plans of the changes that fit. Evaluation's batches (the changes from `eval_from` on, largest first) change
// nothing of the training step: only the largest that fits is kept.
std::vector<Plan> fitting(const Changes& ch, std::size_t eval_from, const DevicePreset& device, int world) {
  std::vector<Plan> fits;
  bool eval_fix_found = false;
  for (std::size_t i = 0; i < ch.list.size(); ++i) {
    const auto& [what, r] = ch.list[i];
    if (i >= eval_from && eval_fix_found) break;
    Plan p = make_plan(r, device, world);
    if (!p.fits) continue;
    eval_fix_found = i >= eval_from;
    p.decisions_changed = what;
    fits.push_back(std::move(p));
  }
  return fits;
}

// LoRA, or LoRA over a quantized frozen base (QLoRA), each as a fix.
Changes lora_changes(const RunConfig& c) {
  Changes lora{c, {}};
  // LLaVA's finetune_lora.sh: r 128 and alpha 256 on a 4,096-wide model; a rank of hidden / 32 on smaller ones.
  const int64_t rank = std::clamp<int64_t>(c.model.config.llm.hidden / 32, 1, 128);
  const std::string enable = str("lora.enable=true --set lora.r=", rank, " --set lora.alpha=", 2 * rank);
  auto enable_lora = [rank](RunConfig& r) {
    r.lora_enable = true;
    r.lora.r = rank;
    r.lora.alpha = float(2 * rank);
  };
  if (!c.lora_enable) lora.add(enable + " (LoRA: trains adapters, not the language model)", enable_lora);
  for (int bits : {8, 4})
    if (!c.lora_enable || bits < c.lora.base_bits)
      lora.add(str(c.lora_enable ? "" : enable + " --set ", "lora.base_bits=", bits, " (LoRA over a ", bits,
                   "-bit frozen base", c.lora_enable ? "" : ": trains adapters, not the language model", ")"),
               [&](RunConfig& r) {
                 if (!c.lora_enable) enable_lora(r);
                 r.lora.base_bits = bits;
               });
  return lora;
}

// The first of `changes` that fits, appended to `fits`: for the fixes offered after the others.
void add_first_fitting(const Changes& changes, const DevicePreset& device, int world, std::vector<Plan>& fits) {
  for (const auto& [what, r] : changes.list) {
    Plan p = make_plan(r, device, world);
    if (!p.fits) continue;
    p.decisions_changed = what;
    fits.push_back(std::move(p));
    return;
  }
}

// 8-bit AdamW states (bitsandbytes' AdamW8bit): a quarter of AdamW's state bytes, at any ZeRO stage and offload.
// It changes the optimizer's arithmetic, as LoRA changes what trains: offered after the fixes that keep it, chosen
// by the search only under train.optimizer: auto.
void add_8bit_fix(const RunConfig& c, const DevicePreset& device, int world, std::vector<Plan>& fits) {
  if (c.optimizer.kind != optim::OptimizerKind::AdamW || c.optimizer_auto) return;  // auto: the search had it
  Changes eight{c, {}};
  eight.add("train.optimizer=adamw_8bit (8-bit AdamW states)",
            [&](RunConfig& r) { r.optimizer.kind = optim::OptimizerKind::AdamW8bit; });
  add_first_fitting(eight, device, world, fits);
}

// LoRA, then a quantized frozen base (QLoRA), fit where a full fine-tune does not, but they change what trains
// or the base's precision: offered after the others, the first that fits only, and never chosen by `auto`.
void add_lora_fix(const RunConfig& c, const DevicePreset& device, int world, std::vector<Plan>& fits) {
  if (c.stage == Stage::Pretrain || c.model.freeze_llm || (c.lora_enable && c.lora.base_bits == 4)) return;
  add_first_fitting(lora_changes(c), device, world, fits);
}

}  // namespace

Search search_plans(const RunConfig& c, const DevicePreset& device, int world) {
  const auto t0 = Clock::now();
  Search s;
  s.any_auto = c.micro_auto || c.vision_ckpt_auto || c.llm_ckpt_auto || c.offload_auto || c.zero_auto ||
               c.prefetch_auto || c.vision_act_offload_auto || c.llm_act_offload_auto || c.optimizer_auto;
  const Choices ch = choices(c, world);
  std::string invalid;
  for (const Strategy& strategy : combinations(ch)) {
    const RunConfig r = with_strategy(c, strategy);
    if (valid(r, &invalid)) search_micro_batch(r, ch, device, world, s);
  }
  // No combination the search may choose from is valid: the user's own setting is the error.
  if (s.ranked.empty()) throw Error(invalid);
  std::stable_sort(s.ranked.begin(), s.ranked.end(), faster);
  s.evaluated += may_keep_last_block(s.ranked.front());
  s.ranked.front() = keep_last_block_if_free(std::move(s.ranked.front()));
  s.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return s;
}

std::vector<Plan> suggest_fixes(const RunConfig& c, const DevicePreset& device, int world, int count) {
  Changes changes{c, {}};
  more_checkpointing(changes);
  activations_on_the_host(changes);
  smaller_micro_batches(changes, world);
  sharding_and_precision(changes, world);
  full_checkpointing_and_smaller_micro_batches(changes, world);
  smaller_pinpoints(changes);
  // Evaluation's batch, largest first (it changes nothing of the training step): only the largest that fits.
  const std::size_t eval_fixes = changes.list.size();
  if (plans_evaluation(c))
    for (int64_t b = c.eval_batch_size / 2; b >= 1; b /= 2)
      changes.add(str("train.eval_batch_size=", b), [&](RunConfig& r) { r.eval_batch_size = b; });
  std::vector<Plan> fits = fitting(changes, eval_fixes, device, world);
  std::stable_sort(fits.begin(), fits.end(), faster);
  if (int(fits.size()) > count) fits.resize(std::size_t(count));
  add_8bit_fix(c, device, world, fits);
  add_lora_fix(c, device, world, fits);
  // As `train` would run each: the last block kept where that is free.
  for (Plan& f : fits) f = keep_last_block_if_free(std::move(f));
  return fits;
}

Plan max_micro_batch(const RunConfig& c, const DevicePreset& device, int world, int64_t limit) {
  auto at = [&](int64_t m) { return make_plan(with_micro(c, m, 0, world), device, world); };
  Plan best = at(1);
  if (!best.fits) return best;
  int64_t lo = 1, hi = 2;
  while (hi <= limit) {
    Plan p = at(hi);
    if (!p.fits) break;
    best = std::move(p);
    lo = hi;
    hi *= 2;
  }
  hi = std::min(hi, limit + 1);  // lo fits, hi does not (or is past the limit)
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    Plan p = at(mid);
    if (p.fits)
      lo = mid, best = std::move(p);
    else
      hi = mid;
  }
  return keep_last_block_if_free(std::move(best));
}

}  // namespace hr::train

namespace hr::train {

Plan chosen_plan(const Search& search, const RunConfig& config) {
  return config.allocator_auto ? compare_allocators(search.ranked.front()) : search.ranked.front();
}

Plan compare_allocators(const Plan& plan) {
  const core::AllocatorKind kinds[] = {core::AllocatorKind::Caching, core::AllocatorKind::Expandable,
                                       core::AllocatorKind::Planned};
  std::vector<Plan> plans;
  for (core::AllocatorKind k : kinds) {
    if (k == plan.config.allocator) {
      plans.push_back(plan);
      continue;
    }
    RunConfig r = plan.config;
    r.allocator = k;
    r.llm_ckpt.keep_last = false;  // kept or not, by this allocator's own dry runs
    plans.push_back(keep_last_block_if_free(make_plan(r, plan.device, plan.world)));
  }
  std::size_t best = std::size_t(plan.config.allocator);
  if (plan.config.allocator_auto)
    for (std::size_t k = 0; k < plans.size(); ++k)
      if (plans[k].fits && (!plans[best].fits || plans[k].total_predicted() < plans[best].total_predicted())) best = k;
  Plan out = plans[best];
  for (std::size_t k = 0; k < plans.size(); ++k) {
    out.reserved_by_allocator[k] = plans[k].rank.peak_reserved;
    out.allocated_by_allocator[k] = plans[k].rank.peak_allocated;
  }
  if (const Plan& planned = plans[2]; planned.rank.requests)
    out.arena = core::plan_arena(*planned.rank.requests, planned.rank.layout.get());
  return out;
}

}  // namespace hr::train
