// The plan as a table (headroom plan, the start of a run, a refusal) and as JSON (plan.json, --json).
#include <nlohmann/json.hpp>

#include "models/anyres.h"
#include "train/planner.h"

namespace hr::train {

using namespace hr::core;

namespace {

std::string commas(int64_t v) {
  std::string s = std::to_string(v < 0 ? -v : v), out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return (v < 0 ? "-" : "") + out;
}

std::string gib(int64_t b) {
  return format_bytes(double(b));
}

std::string pad(const std::string& s, std::size_t w) {
  return s.size() >= w ? s : s + std::string(w - s.size(), ' ');
}
std::string lpad(const std::string& s, std::size_t w) {
  return s.size() >= w ? s : std::string(w - s.size(), ' ') + s;
}

const char* const kKinds[] = {"caching", "expandable", "planned"};

// A percentage of `of`, cut to `width` characters (0 when `of` is 0).
std::string percent(double part, double of, std::size_t width) {
  return str(of ? 100.0 * part / of : 0.0).substr(0, width);
}

// The run, the decisions, the parameters by module.
std::string table_head(const Plan& p) {
  const RunConfig& c = p.config;
  std::string o;
  o += str("plan: ", c.model.config.name, " (stage ", stage_name(c.stage), ") on ", p.world, " x ", p.device.name,
           " | capacity ", gib(p.capacity), ", runtime reserve ", gib(p.runtime_reserve), ", budget ",
           int(c.budget * 100 + 0.5f), "% -> ", gib(p.usable), " usable per rank\n");
  o += str("decisions: ", p.decisions.describe(), "; global batch ", c.global_batch_size, " of up to ", c.max_seq_len,
           " tokens\n");
  if (const models::LlavaConfig& m = c.model.config; m.anyres.on()) {  // what each image of the worst case is
    const data::Resolution im = planned_image(c);
    o += str("images: AnyRes, each planned as ", im.height, " x ", im.width, " px (",
             c.plan_image ? std::string("--image-size")
             : c.max_image_tokens > 0
                 ? str("the largest layout a sequence holds, at most data.max_image_tokens ", c.max_image_tokens)
                 : std::string("the largest layout a sequence holds"),
             "): ", models::anyres_crops(im, m.anyres, m.vision.image_size), " crops and ",
             commas(models::anyres_tokens(im, m.anyres, m.vision.image_size, m.vision.grid())), " tokens, ",
             c.max_images_per_sample, " per sample\n");
  }
  o += str("parameters: ", commas(p.params_total), " total, ", commas(p.params_trainable), " trainable\n");
  for (const auto& [name, n] : p.params_by_module) o += str("  ", pad(name, 34), lpad(commas(n), 16), "\n");
  return o;
}

// Each category at the predicted peak, by the dry run and by the closed form, then their totals.
std::string category_rows(const Plan& p) {
  std::string o;
  o += str("per rank (all ", p.world, " alike: shards are padded to the world size), at the predicted peak:\n");
  o += str("  ", pad("category", 20), lpad("dry run", 14), lpad("closed form", 14), lpad("diff", 12), "   formula\n");
  int64_t formula_total = 0;
  for (const ClosedFormRow& r : p.closed_form) {
    formula_total += r.formula;
    o += str("  ", pad(r.item, 20), lpad(gib(r.dry_run), 14), lpad(gib(r.formula), 14),
             lpad(gib(r.formula - r.dry_run), 12), "   ", r.how, "\n");
  }
  const int64_t allocated = p.rank.peak_allocated;
  o += str("  ", pad("peak allocated", 20), lpad(gib(allocated), 14), lpad(gib(formula_total), 14),
           lpad(percent(double(formula_total - allocated), double(allocated), 5) + "%", 12), "\n");
  o += str("  ", pad("allocator overhead", 20), lpad(gib(p.rank.peak_reserved - allocated), 14),
           "   cached and split blocks (reserved - allocated)\n");
  return o;
}

// memory.allocator: the peak reserved with each allocator the plan ran, and the planned arena's size.
std::string allocator_rows(const Plan& p) {
  if (!(p.reserved_by_allocator[0] >= 0 || p.reserved_by_allocator[2] >= 0)) return "";
  std::string o = "  memory.allocator (a dry run with each; peak reserved, its overhead above peak allocated):\n";
  for (std::size_t k = 0; k < 3; ++k) {
    const int64_t r = p.reserved_by_allocator[k], a = p.allocated_by_allocator[k];
    if (r < 0) continue;
    o += str("  ", pad(str("  ", kKinds[k]), 20), lpad(gib(r), 14), lpad(gib(r - a), 14), " (",
             percent(double(r - a), double(r), 4), "%)", std::size_t(p.config.allocator) == k ? "   <- this plan" : "",
             "\n");
  }
  if (p.arena.buffers)
    o += str("  ", pad("", 20), "planned: ", commas(int64_t(p.arena.buffers)), " buffers of the step in an arena of ",
             gib(int64_t(p.arena.arena)), " (their live peak ", gib(int64_t(p.arena.live_peak)), ", ",
             percent(double(p.arena.arena - p.arena.live_peak), double(p.arena.live_peak), 4), "% above)\n");
  return o;
}

// The runtime reserve, the total against the budget, the host's peak and where the peaks are reached.
std::string total_rows(const Plan& p) {
  const RunConfig& c = p.config;
  std::string o;
  o += str("  ", pad("runtime reserve", 20), lpad(gib(p.runtime_reserve), 14),
           "   context and library workspaces (no allocator sees them)\n");
  o += str("  ", pad("total", 20), lpad(gib(p.total_predicted()), 14), "   of ",
           gib(int64_t(double(c.budget) * double(p.capacity))), " budget: ", p.fits ? "fits" : "DOES NOT FIT", "\n");
  if (p.rank.host_peak) o += str("  host (offload, batches): ", gib(p.rank.host_peak), "\n");
  o += str("  peak reached in ", p.rank.peak_owner.empty() ? "(unscoped)" : p.rank.peak_owner, "; activation peak in ",
           p.rank.activation_peak_owner.empty() ? "-" : p.rank.activation_peak_owner, "\n");
  return o;
}

// Evaluation on the state the step leaves: its loss pass, its generation, the KV cache and the next-token logits.
std::string evaluation_rows(const Plan& p) {
  const RunConfig& c = p.config;
  const models::LlmConfig& llm = c.model.config.llm;
  const int64_t positions = c.max_seq_len + c.max_new_tokens - 1;
  const int64_t rows = p.eval_rows;
  std::string o;
  o +=
      str("evaluation on the state the step leaves (", rows, " sequences a batch: train.eval_batch_size ",
          c.eval_batch_size, ", max_new_tokens ", c.max_new_tokens, "): ", p.eval_fits ? "fits" : "DOES NOT FIT", "\n");
  o += str("  ", pad("loss pass", 20), lpad(gib(p.eval.peak_allocated), 14), " allocated, ", gib(p.eval.peak_reserved),
           " reserved: ", rows, " x ", c.max_seq_len, " tokens, logits of ", rows * c.max_new_tokens,
           " positions, peak in ", p.eval.peak_owner, "\n");
  o += str("  ", pad("generation", 20), lpad(gib(p.generation.peak_allocated), 14), " allocated, ",
           gib(p.generation.peak_reserved), " reserved: ", rows, " prompts of ", c.max_seq_len, " tokens, peak in ",
           p.generation.peak_owner, "\n");
  o += str("  ", pad("KV cache", 20), lpad(gib(p.kv_cache_bytes), 14), " = 2 x ", llm.layers, " layers x ",
           llm.kv_heads, " kv_heads x ", llm.head_dim(), " head_dim x ", rows, " x ", positions, " positions x ",
           p.model_element_bytes, " B\n");
  o += str("  ", pad("next-token logits", 20), lpad(gib(p.generation_logits_bytes), 14), " = [", rows, ", ", llm.vocab,
           "]: the prompt's [tokens, vocab] logits never exist\n");
  return o;
}

// The cost model's step time: compute, exposed (and hidden) collectives and offload, and the tokens per second.
std::string step_time_line(const Plan& p) {
  const RunConfig& c = p.config;
  const double tokens = double(c.global_batch_size * c.max_seq_len);
  return str(
      "step time (cost model): ", p.time.total(), " s = compute ", p.time.compute_s, " s (recompute ",
      p.time.recompute_s, " s) + collectives ", p.time.exposed_comm_s(), " s exposed",
      p.time.hidden_comm_s > 0
          ? str(" (", p.time.hidden_comm_s, " s more under compute: overlapped ",
                c.zero.stage <= 1 ? "all-reduce buckets" : "reduce-scatters and prefetched all-gathers", ")")
          : "",
      " + offload ", p.time.offload_s, " s",
      p.time.hidden_offload_s > 0
          ? str(" (", p.time.hidden_offload_s, " s more of host transfers under the backward and the host update)")
          : "",
      p.time.act_offload_s > 0
          ? str(" + activation offload ", p.time.exposed_act_offload_s, " s exposed of ", p.time.act_offload_s,
                " s of copies", p.time.exposed_act_offload_s > 0 ? " (a block computes faster than its copy)" : "")
          : "",
      "; ", int64_t(tokens / std::max(p.time.total(), 1e-12)), " tokens/s over all ranks\n");
}

using json = nlohmann::json;

// Bytes by category, every category named.
json category_json(const CategoryBytes& b) {
  json j = json::object();
  for (Category cat : kAllCategories) j[category_name(cat)] = b[std::size_t(cat)];
  return j;
}

// A rank's predicted memory (every rank alike): the peaks, the categories, each allocator's dry run, the arena.
json rank_json(const Plan& p) {
  json allocators = json::object();
  for (std::size_t k = 0; k < 3; ++k)
    if (p.reserved_by_allocator[k] >= 0)
      allocators[kKinds[k]] = {{"peak_reserved", p.reserved_by_allocator[k]},
                               {"peak_allocated", p.allocated_by_allocator[k]}};
  return {{"peak_allocated", p.rank.peak_allocated},
          {"peak_reserved", p.rank.peak_reserved},
          {"persistent", p.rank.persistent},
          {"by_category", category_json(p.rank.at_peak)},
          {"category_peaks", category_json(p.rank.category_peaks)},
          {"allocator_overhead", p.rank.peak_reserved - p.rank.peak_allocated},
          {"allocator", kKinds[std::size_t(p.config.allocator)]},
          {"allocators", allocators},
          {"arena",
           {{"arena", p.arena.arena},
            {"live_peak", p.arena.live_peak},
            {"persistent", p.arena.persistent},
            {"buffers", p.arena.buffers}}},
          {"runtime_reserve", p.runtime_reserve},
          {"total", p.total_predicted()},
          {"peak_owner", p.rank.peak_owner},
          {"activation_peak_owner", p.rank.activation_peak_owner},
          {"host_peak", p.rank.host_peak},
          {"host_by_category", category_json(p.rank.host_at_peak)},
          // micro-batches the dry run recorded as repetitions instead of running (the same peaks)
          {"micro_batches_repeated", p.rank.micro_batches_repeated}};
}

// Evaluation's loss pass and generation (null where the run does not evaluate).
json evaluation_json(const Plan& p) {
  if (!p.evaluates) return json(nullptr);
  return {{"fits", p.eval_fits},
          {"eval_batch_size", p.config.eval_batch_size},
          {"rows", p.eval_rows},
          {"max_new_tokens", p.config.max_new_tokens},
          {"loss_pass",
           {{"peak_allocated", p.eval.peak_allocated},
            {"peak_reserved", p.eval.peak_reserved},
            {"by_category", category_json(p.eval.at_peak)},
            {"peak_owner", p.eval.peak_owner}}},
          {"generation",
           {{"peak_allocated", p.generation.peak_allocated},
            {"peak_reserved", p.generation.peak_reserved},
            {"by_category", category_json(p.generation.at_peak)},
            {"peak_owner", p.generation.peak_owner},
            {"kv_cache_bytes", p.kv_cache_bytes},
            {"logits_bytes", p.generation_logits_bytes}}}};
}

json decisions_json(const Plan& p) {
  const RunConfig& c = p.config;
  return {
      {"precision", precision_name(c.precision)},
      {"gradient_checkpointing",
       {{"vision", models::checkpoint_name(c.vision_ckpt.kind)}, {"llm", models::checkpoint_name(c.llm_ckpt.kind)}}},
      {"llm_last_block_kept", c.llm_ckpt.keep_last},
      {"vision_frozen", p.decisions.vision_frozen},
      {"offload_activations",
       {{"vision", c.vision_ckpt.offload ? "cpu" : "none"}, {"llm", c.llm_ckpt.offload ? "cpu" : "none"}}},
      {"optimizer", optim::optimizer_name(c.optimizer.kind)},
      {"micro_batch_size", c.micro_batch_size},
      {"gradient_accumulation_steps", c.gradient_accumulation_steps},
      {"global_batch_size", c.global_batch_size},
      {"zero_stage", c.zero.stage},
      {"prefetch_groups", c.zero.prefetch_groups},
      {"offload_optimizer", c.zero.offload_optimizer == parallel::Offload::Cpu ? "cpu" : "none"},
      {"offload_params", c.zero.offload_params == parallel::Offload::Cpu ? "cpu" : "none"}};
}

json step_time_json(const StepTime& t) {
  return {{"total_s", t.total()},
          {"compute_s", t.compute_s},
          {"recompute_s", t.recompute_s},
          {"comm_s", t.comm_s},
          {"comm_hidden_s", t.hidden_comm_s},
          {"comm_exposed_s", t.exposed_comm_s()},
          {"offload_s", t.offload_s},
          {"offload_hidden_s", t.hidden_offload_s},
          {"activation_offload_s", t.act_offload_s},
          {"activation_offload_exposed_s", t.exposed_act_offload_s},
          {"flops", t.flops}};
}

}  // namespace

std::string plan_table(const Plan& p) {
  std::string o = table_head(p) + category_rows(p) + allocator_rows(p) + total_rows(p);
  if (p.evaluates) o += evaluation_rows(p);
  return o + step_time_line(p);
}

std::string plan_json(const Plan& p) {
  json ranks = json::array();
  const json rank = rank_json(p);
  for (int r = 0; r < p.world; ++r) {
    json x = rank;
    x["rank"] = r;
    ranks.push_back(x);
  }
  json modules = json::object();
  for (const auto& [name, n] : p.params_by_module) modules[name] = n;
  json closed = json::array();
  for (const ClosedFormRow& r : p.closed_form)
    closed.push_back({{"item", r.item}, {"formula", r.formula}, {"dry_run", r.dry_run}, {"how", r.how}});
  const json j = {{"model", p.config.model.config.name},
                  {"device", p.device.name},
                  {"world_size", p.world},
                  {"params_total", p.params_total},
                  {"params_trainable", p.params_trainable},
                  {"params_by_module", modules},
                  {"capacity", p.capacity},
                  {"runtime_reserve", p.runtime_reserve},
                  {"budget", p.config.budget},
                  {"usable", p.usable},
                  {"fits", p.fits},
                  {"evaluation", evaluation_json(p)},
                  {"decisions", decisions_json(p)},
                  {"step_time", step_time_json(p.time)},
                  {"closed_form", closed},
                  {"ranks", ranks}};
  return j.dump(2) + "\n";
}

std::string search_explanation(const Search& s, std::size_t show) {
  std::string o = str("search: ", s.evaluated, " dry runs in ", s.seconds, " s; candidates, best first:\n");
  for (std::size_t i = 0; i < s.ranked.size() && i < show; ++i) {
    const Plan& p = s.ranked[i];
    o += str(i == 0 ? "  * " : "    ", p.decisions.describe(), " | peak ", gib(p.total_predicted()), " of ",
             gib(p.usable + p.runtime_reserve), p.fits ? "" : " (does not fit)", " | step ", p.time.total(), " s\n");
  }
  if (!s.ranked.empty()) {
    const Plan& w = s.ranked.front();
    if (!w.fits)
      o += "  nothing fits the budget\n";
    else if (s.ranked.size() > 1)
      o += str("  the winner is the fastest predicted step among the plans that fit; the runner-up costs ",
               s.ranked[1].fits ? str(s.ranked[1].time.total() - w.time.total(), " s more per step")
                                : std::string("more memory than there is"),
               "\n");
  }
  return o;
}

}  // namespace hr::train
