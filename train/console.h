// Everything a training run prints, in one place: its start, each step's line and notes, evaluations, its end.
// Rank 0 prints what concerns the run; every rank prints what concerns it alone, prefixed with its rank when
// there are several. On a terminal the step line is a progress bar redrawn in place, and every other message
// first ends that line.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/memory/caching_allocator.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/eval_log.h"
#include "train/evaluate.h"
#include "train/planner.h"

namespace hr::train {

// What the step line shows (memory.jsonl has the same numbers).
struct StepLine {
  int64_t step = 0, total = 0;
  float loss = 0, lr = 0, grad_norm = 0;
  double tokens_per_s = 0, samples_per_s = 0;
  int64_t peak_allocated = 0, peak_reserved = 0;
  double comm_exposed_s = 0;
  double eta_s = 0;
};

// The end of a run: what it skipped, recovered and measured, for the summary rank 0 prints.
struct RunSummary {
  int64_t dry_runs = 0, oom_recoveries = 0, micro_batch = 0, accumulation = 0;
  int64_t layouts_reused = 0;  // dry runs whose arena layout was an earlier step's (core::ArenaLayouts)
  std::size_t bad_samples = 0, masked_samples = 0;
  int64_t bad_sample_skips = 0, fp16_skipped_steps = 0, images_dropped = 0, unlearnable = 0, nonfinite_steps = 0;
  int64_t max_seq_len = 0;
  std::string allocator_summary;
  // The step with the highest peak: measured, predicted by its dry run, by category; -1: none measured.
  int64_t peak_step = 0, peak_measured = -1, peak_predicted = -1, planned_peak = 0;
  CategoryBytes peak_at{};
};

class Console {
 public:
  Console(int rank, int world, bool tty, std::FILE* out = stdout);
  bool lead() const { return rank_ == 0; }
  bool tty() const { return tty_; }

  // Starting.
  void deepspeed(const RunConfig& c);
  void plan(const Plan& plan, const Search& search);
  void starting_anyway(const std::string& why);
  void finished_interrupted_save(const std::string& dir);
  void resumed(const std::string& dir, const TrainerState& s);
  void no_checkpoint(const std::string& output_dir);
  void dropped_log_lines(const std::string& log, int64_t dropped, int64_t step);
  void training(const RunConfig& c, int64_t parameters, int64_t trainable, int64_t total);

  // Out of memory inside a step.
  void oom_snapshot(const std::string& file);
  void oom_halving(int64_t step, int64_t micro, int64_t accumulation);

  // A step's notes, then its line.
  void timeline(int64_t step, const std::string& file);
  void mismatch(const std::string& warning);
  void nonfinite(int64_t step, float loss, float grad_norm, const std::string& where, OnNonfinite policy);
  void fp16_overflow(int64_t step, float loss_scale);
  void leak(const std::string& warnings);
  void skipped_sample(const std::string& what);
  void masked_sample(const std::string& what);
  void unlearnable(int64_t step, int64_t max_seq_len);
  void image_dropped(int64_t step, int64_t max_seq_len);
  void step_line(const StepLine& l);

  // Evaluation.
  void bad_eval_sample(const std::string& what);
  void eval_mismatches(const EvalMemory& memory);
  void evaluation(int64_t step, const EvalResult& r, const EvalMemory& memory);

  // The end: the progress bar's line ends first.
  void close_bar();
  void diverged(int64_t step, int64_t skips, float min_scale, int64_t max_skips, const std::string& kept);
  void stopped_nonfinite(int64_t step, const std::string& kept);
  void stop_requested(int signal, int64_t step);
  void stopped(int64_t step, int64_t total, const std::string& output_dir);
  void incomplete_log(const std::string& what);
  void mismatched_steps(int64_t steps);
  void summary(const RunSummary& s);
  void report(const std::string& file, const std::string& error);
  void done(double seconds, const std::string& output_dir);

 private:
  // "\n" where the progress bar's line must end first, "" elsewhere.
  const char* fresh() const { return tty_ ? "\n" : ""; }
  // "rank 3: " with several ranks, "" with one.
  std::string rank_prefix() const;
  void print(const std::string& text);  // flushed
  static std::string peak_step_line(const RunSummary& s);

  int rank_, world_;
  bool tty_;
  std::FILE* out_;
};

}  // namespace hr::train
