// The training run's console: every message it prints, worded once.
#include "train/console.h"

#include <cstring>

#include "core/check.h"
#include "models/config.h"
#include "train/console_format.h"

namespace hr::train {

using hr::format_bytes;

Console::Console(int rank, int world, bool tty, std::FILE* out) : rank_(rank), world_(world), tty_(tty), out_(out) {}

std::string Console::rank_prefix() const {
  return world_ > 1 ? str("rank ", rank_, ": ") : std::string();
}

void Console::print(const std::string& text) {
  std::fputs(text.c_str(), out_);
  std::fflush(out_);
}

// ---- Starting ----

void Console::deepspeed(const RunConfig& c) {
  if (!lead() || c.deepspeed.empty()) return;
  std::string ignored;
  for (const std::string& k : c.deepspeed_not_acted_on) ignored += (ignored.empty() ? "" : ", ") + k;
  print(str("[deepspeed] ", c.deepspeed, " read onto headroom's keys (config.yaml shows them); read but not acted on: ",
            ignored.empty() ? "none" : ignored, "\n"));
}

void Console::plan(const Plan& plan, const Search& search) {
  if (!lead()) return;
  print(plan_table(plan));
  if (search.any_auto) print(search_explanation(search, 5));
}

void Console::starting_anyway(const std::string& why) {
  if (lead()) print(why + "\nstarting anyway (memory.preflight: false): expect an out-of-memory error\n");
}

void Console::finished_interrupted_save(const std::string& dir) {
  if (lead()) print(str("finished ", dir, " (its save was interrupted after every file was written)\n"));
}

void Console::resumed(const std::string& dir, const TrainerState& s) {
  if (lead())
    print(str("resumed from ", dir, " at step ", s.step, " (written by ", s.world_size, " rank",
              s.world_size == 1 ? "" : "s", " at ZeRO stage ", s.zero_stage, ")\n"));
}

void Console::no_checkpoint(const std::string& output_dir) {
  if (lead()) print(str("no checkpoint in ", output_dir, ": starting from scratch\n"));
}

void Console::dropped_log_lines(const std::string& log, int64_t dropped, int64_t step) {
  print(str(log, ": dropped ", dropped, " lines of steps after ", step, ", which this run writes again\n"));
}

void Console::training(const RunConfig& c, int64_t parameters, int64_t trainable, int64_t total) {
  if (!lead()) return;
  print(str("training ", c.model.config.name, " (", models::projector_name(c.model.config.projector), ", stage ",
            stage_name(c.stage), "): ", parameters, " parameters, ", trainable, " trainable; ", total, " steps of ",
            c.global_batch_size, " samples (micro ", c.micro_batch_size, " x accumulation ",
            c.gradient_accumulation_steps, " x ", world_, " rank", world_ == 1 ? "" : "s", "); precision ",
            precision_name(c.precision), "; ZeRO stage ", c.zero.stage,
            c.zero.offload_optimizer == parallel::Offload::Cpu ? ", optimizer offloaded to the host" : "",
            c.zero.offload_params == parallel::Offload::Cpu ? ", parameters offloaded to the host" : "", "\n"));
}

// ---- Out of memory ----

void Console::oom_snapshot(const std::string& file) {
  print(str(fresh(), rank_prefix(), "the allocator at the out-of-memory error: ", file,
            " (open it in pytorch.org/memory_viz)\n"));
}

void Console::oom_halving(int64_t step, int64_t micro, int64_t accumulation) {
  if (lead())
    print(str(fresh(), "step ", step, ": out of memory with micro-batch ", micro, "; halving it to micro-batch ",
              micro / 2, " x accumulation ", accumulation,
              " (the same samples, the same global batch) and redoing the step\n"));
}

// ---- A step ----

void Console::timeline(int64_t step, const std::string& file) {
  if (lead())
    print(str(fresh(), "step ", step, ": memory timeline in ", file, world_ > 1 ? " and the other ranks'" : "",
              " (open it in ui.perfetto.dev)\n"));
}

void Console::mismatch(const std::string& warning) {
  print(str(fresh(), warning, "\n"));
}

void Console::nonfinite(int64_t step, float loss, float grad_norm, const std::string& where, OnNonfinite policy) {
  char numbers[96];
  std::snprintf(numbers, sizeof numbers, "non-finite loss (%g) or gradient norm (%g)", double(loss), double(grad_norm));
  print(str(fresh(), rank_prefix(), "step ", step, ": ", numbers, "; the first non-finite value came from ", where,
            ". The step is skipped", policy == OnNonfinite::Stop ? " and the run stops (train.on_nonfinite: stop)" : "",
            "\n"));
}

void Console::fp16_overflow(int64_t step, float loss_scale) {
  char scale[32];
  std::snprintf(scale, sizeof scale, "%g", double(loss_scale));
  if (lead()) print(str(fresh(), "step ", step, ": fp16 overflow at loss scale ", scale, "; step skipped\n"));
}

void Console::leak(const std::string& warnings) {
  print(str(fresh(), rank_prefix(), warnings, "\n"));
}

void Console::skipped_sample(const std::string& what) {
  if (lead()) print(str(fresh(), "skipped bad sample: ", what, "\n"));
}

void Console::masked_sample(const std::string& what) {
  if (lead())
    print(str(fresh(), "warning: ", what,
              ": LLaVA's round lengths disagree with the tokens (its \"tokenization mismatch\"); every label "
              "masked, as LLaVA does\n"));
}

void Console::unlearnable(int64_t step, int64_t max_seq_len) {
  if (lead())
    print(str(fresh(), "warning: step ", step, ": data.max_seq_len ", max_seq_len,
              " cut off every answer of a micro-batch: it has no label to learn (loss and gradient 0). Raise "
              "data.max_seq_len (micro-batches like it are counted at the end)\n"));
}

void Console::image_dropped(int64_t step, int64_t max_seq_len) {
  if (lead())
    print(str(fresh(), "warning: step ", step, ": data.max_seq_len ", max_seq_len,
              " cut a sample before its image's placeholders: the image is dropped with them, as LLaVA truncates "
              "(counted at the end)\n"));
}

void Console::step_line(const StepLine& l) {
  const std::string line =
      str("step ", l.step, "/", l.total, " | loss ", l.loss, " | lr ", l.lr, " | grad_norm ", l.grad_norm, " | tok/s ",
          int64_t(l.tokens_per_s), " | samples/s ", format_rate(l.samples_per_s), " | mem ",
          format_bytes(double(l.peak_allocated)), " peak / ", format_bytes(double(l.peak_reserved)), " reserved",
          world_ > 1 ? str(" | comm ", format_ms(l.comm_exposed_s), " exposed") : std::string(), " | ETA ",
          format_duration(l.eta_s));
  print(tty_ ? str("\r", bar(l.step, l.total), " ", line) : line + "\n");
}

// ---- Evaluation ----

void Console::bad_eval_sample(const std::string& what) {
  if (lead()) print(str(fresh(), "skipped bad evaluation sample: ", what, "\n"));
}

void Console::eval_mismatches(const EvalMemory& m) {
  const int64_t mismatches = m.loss.mismatches + m.generation.mismatches;
  if (mismatches)
    print(str(fresh(), "[memory] rank ", rank_, ": ", mismatches,
              " evaluation passes measured a peak other than their dry runs (loss pass ", m.loss.measured,
              " B measured / ", m.loss.predicted, " B predicted, generation ", m.generation.measured, " / ",
              m.generation.predicted, ")\n"));
}

void Console::evaluation(int64_t step, const EvalResult& r, const EvalMemory& m) {
  if (!lead()) return;
  const bool mismatched = m.loss.mismatches + m.generation.mismatches > 0;
  std::string text =
      str(fresh(), "step ", step, " | ", eval_summary(r), " | memory: loss pass ",
          format_bytes(double(m.loss.measured)), ", generation ", format_bytes(double(m.generation.measured)), " (",
          mismatched ? "NOT as predicted" : "as predicted", ")\n");
  for (const std::string& e : r.examples) text += str("    ", e, "\n");
  print(text);
}

// ---- The end ----

void Console::close_bar() {
  if (tty_) print("\n");
}

void Console::diverged(int64_t step, int64_t skips, float min_scale, int64_t max_skips, const std::string& kept) {
  char scale[32];
  std::snprintf(scale, sizeof scale, "%g", double(min_scale));
  if (lead())  // as DeepSpeed's loss scaler raises at its minimum scale
    print(str(fresh(), "[fp16] stopped at step ", step, ": the run diverged, ", skips,
              " steps in a row overflowed at the minimum loss scale ", scale,
              " (memory.loss_scale.min; memory.loss_scale.max_skips_at_min: ", max_skips, "); ", kept,
              ". Lower train.learning_rate or use memory.precision: bf16\n"));
}

void Console::stopped_nonfinite(int64_t step, const std::string& kept) {
  if (lead())
    print(str("stopped at step ", step, " on a non-finite loss or gradient; ", kept,
              ". Lower train.learning_rate, check the data and weights, or set train.on_nonfinite: skip\n"));
}

void Console::stop_requested(int signal, int64_t step) {
  if (lead())
    print(str("stop requested (", signal ? strsignal(signal) : "on another rank", "): saving the checkpoint of step ",
              step, " and exiting; --resume continues from it\n"));
}

void Console::stopped(int64_t step, int64_t total, const std::string& output_dir) {
  if (lead()) print(str("stopped at step ", step, " of ", total, "; outputs in ", output_dir, "\n"));
}

void Console::incomplete_log(const std::string& what) {
  print(str(rank_prefix(), "incomplete log: ", what, "\n"));
}

void Console::mismatched_steps(int64_t steps) {
  if (steps) print(str(rank_prefix(), "[memory] ", steps, " steps measured a peak other than predicted\n"));
}

void Console::summary(const RunSummary& s) {
  if (!lead()) return;
  std::string t =
      str("every step's peak was predicted by a dry run of its shapes: ", s.dry_runs, " dry runs",
          s.layouts_reused ? str(", ", s.layouts_reused, " of them in an earlier step's arena layout") : "", "\n");
  if (s.oom_recoveries)
    t += str(s.oom_recoveries, " out-of-memory errors recovered by halving the micro-batch (now ", s.micro_batch,
             " x accumulation ", s.accumulation, ")\n");
  if (s.bad_samples) t += str(s.bad_samples, " bad samples (named above), skipped ", s.bad_sample_skips, " times\n");
  if (s.masked_samples)
    t += str(s.masked_samples,
             " samples trained with every label masked (LLaVA's tokenization mismatch, named above)\n");
  if (s.fp16_skipped_steps) t += str(s.fp16_skipped_steps, " optimizer steps skipped on fp16 overflow\n");
  if (s.images_dropped)
    t += str(s.images_dropped, " images dropped with their placeholders by data.max_seq_len ", s.max_seq_len, "\n");
  if (s.unlearnable)
    t += str(s.unlearnable, " micro-batches had no label left after data.max_seq_len ", s.max_seq_len, " cut them\n");
  if (s.nonfinite_steps) t += str(s.nonfinite_steps, " steps skipped on a non-finite loss or gradient (named above)\n");
  t += s.allocator_summary;
  if (s.peak_measured >= 0) t += peak_step_line(s);
  print(t);
}

// The step with the highest peak: measured by category beside its dry run's prediction and the plan's worst case.
std::string Console::peak_step_line(const RunSummary& s) {
  std::string cats;
  for (core::Category cat : core::kAllCategories)
    if (const int64_t b = s.peak_at[std::size_t(cat)])
      cats += str(cats.empty() ? "" : ", ", core::category_name(cat), " ", format_bytes(double(b)));
  const int64_t err = s.peak_measured - s.peak_predicted;
  return str("peak step ", s.peak_step, ": ", format_bytes(double(s.peak_measured)), " allocated (", cats,
             "); predicted ", format_bytes(double(s.peak_predicted)), " by its dry run, error ", err < 0 ? "-" : "",
             format_bytes(double(err < 0 ? -err : err)), err == 0 ? " (exact)" : "", "; the plan's worst case ",
             format_bytes(double(s.planned_peak)), "\n");
}

void Console::report(const std::string& file, const std::string& error) {
  print(error.empty() ? str("run report: ", file, "\n") : str("run report not written: ", error, "\n"));
}

void Console::done(double seconds, const std::string& output_dir) {
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.1f", seconds);
  if (lead()) print(str("done in ", secs, " s; outputs in ", output_dir, "\n"));
}

}  // namespace hr::train
