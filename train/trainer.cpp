// The training run: its start (plan, device, data, the engine started or resumed, the loader, the logs), the step
// loop (run the step, measure it, log it, advance, stop?), evaluations and checkpoints between steps, and its end.
// The step's parts live in step_runner (running it), step_record (measuring it) and console (everything printed).
#include "train/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>
#include <set>

#include "core/io/atomic_file.h"
#include "core/memory/device_memory.h"
#include "train/checkpoint.h"
#include "train/console.h"
#include "train/devices.h"
#include "train/engine.h"
#include "train/eval_log.h"
#include "train/evaluate.h"
#include "train/log_file.h"
#include "train/memory_log.h"
#include "train/observe.h"
#include "train/planner.h"
#include "train/report.h"
#include "train/run_data.h"
#include "train/run_guards.h"
#include "train/run_plan.h"
#include "train/step_record.h"
#include "train/step_runner.h"

namespace hr::train {

namespace fs = std::filesystem;
using namespace hr::core;
using namespace hr::models;
using namespace hr::data;
using Clock = std::chrono::steady_clock;

namespace {

// One training run as one rank.
class Trainer {
 public:
  Trainer(PlannedRun planned, const TrainOptions& options, parallel::Communicator& comm, Console& console);
  int64_t step() const { return state_.step; }
  int64_t total() const { return total_; }

  // Draws the step's micro-batches, runs forward and backward (an out-of-memory error may redo it smaller), updates.
  StepOutcome run_step() {
    if (first_step_ < 0) first_step_ = state_.step, loop_start_ = Clock::now();
    return runner_->run(state_.step + 1, sched_->lr(state_.step));
  }
  // The dry run's peaks beside the measured ones, the leak watch: data only.
  MeasuredStep measure(const StepOutcome& s) { return meter_->measure(s); }
  // memory.jsonl, TensorBoard, the console.
  void log(const StepOutcome& s, const MeasuredStep& m);
  // The step is done: its number, the loader's position and the loss scale for a checkpoint; the run's tallies.
  void advance(const StepOutcome& s, const MeasuredStep& m);
  // Whether the run ends after this step, and its exit code: a non-finite step under train.on_nonfinite: stop or
  // a diverged fp16 run (1, without a checkpoint, so that the last one stays the last good one), or a stop asked
  // for on any rank (SIGTERM, SIGINT: 0, with a checkpoint).
  std::optional<int> stopping(const StepOutcome& s);
  void maybe_save_or_evaluate();
  int finish();

 private:
  const RunConfig& c() const { return plan_.config; }
  void open_data();
  void start(const TrainOptions& options);
  void make_loader();
  void open_logs();
  void report_data(const StepOutcome& s);
  void evaluate_now();
  int stop_on_nonfinite();
  int stop();
  void report_incomplete_logs();
  void write_report();
  RunSummary summary() const;

  parallel::Communicator& comm_;
  Console& console_;
  const Clock::time_point t_start_ = Clock::now();
  Plan plan_;
  std::unique_ptr<parallel::Communicator> gpu_comm_;  // ZeRO's collectives on GPUs (run_plan.h)
  Device device_;
  const bool save_and_evaluate_at_end_;
  std::unique_ptr<Predictor> predictor_;  // every step dry-run at its own shapes
  std::unique_ptr<StepPredictions> predictions_;
  EvalPredictions eval_predicted_{StepPredictions::kKept};  // evaluation passes' dry runs, over all evaluations
  std::shared_ptr<CachingAllocator> alloc_, host_alloc_;
  int gpu_ = -1;  // N of the cuda:N the run trains on; -1 on the CPU
  std::unique_ptr<LlavaDataset> train_set_, eval_set_;
  std::unique_ptr<Engine> engine_;
  TrainerState state_;
  int64_t total_ = 0;
  std::unique_ptr<optim::Schedule> sched_;
  std::unique_ptr<optim::LossScaler> scaler_;
  std::unique_ptr<DataLoader> loader_;
  std::unique_ptr<MemoryLog> mlog_;
  std::unique_ptr<LogFile> eval_log_, predictions_log_;  // rank 0's, with an evaluation set
  std::unique_ptr<RunObservers> observers_;              // TensorBoard, memory timelines, out-of-memory snapshots
  std::unique_ptr<StepMeter> meter_;
  std::unique_ptr<StepRunner> runner_;
  // For the console's ETA and the end-of-run summary.
  Clock::time_point loop_start_;
  int64_t first_step_ = -1;
  struct PeakStep {
    int64_t step = 0, measured = -1, predicted = -1;
    CategoryBytes at_peak{};
  } peak_step_;
  int64_t mismatches_ = 0;
  std::size_t skipped_reported_ = 0, masked_reported_ = 0;
  // data.max_seq_len cuts: micro-batches left without a label, and images dropped with their placeholders (each
  // warned about the first time, counted at the end).
  int64_t unlearnable_ = 0, images_dropped_reported_ = 0;
  std::set<std::string> eval_bad_named_;  // bad evaluation samples already named
};

Trainer::Trainer(PlannedRun planned, const TrainOptions& options, parallel::Communicator& comm, Console& console)
    : comm_(comm),
      console_(console),
      plan_(std::move(planned.plan)),
      gpu_comm_(std::move(planned.device.gpu_comm)),
      device_(planned.device.device),
      save_and_evaluate_at_end_(options.finish) {
  const int rank = comm.rank(), world = comm.world();
  // device.type: cpu or cuda:N (devices.h). Parameters, gradients, states and activations live there through its
  // caching allocator; the host allocator keeps the loader's batches and offloaded states.
  predictor_ = std::make_unique<Predictor>(c(), world, rank, sizing_target(plan_.device));
  configure_run_device(device_, c().memory_limit, c().allocator);
  alloc_ = allocator_for(device_);
  host_alloc_ = allocator_for(Device::host());
  predictions_ = std::make_unique<StepPredictions>(*predictor_, *alloc_);
  if (device_.type == DeviceType::CUDA) gpu_ = device_.index;
  open_data();
  engine_ = std::make_unique<Engine>(c(), device_, gpu_comm_ ? *gpu_comm_ : comm);
  start(options);
  make_loader();
  const Llava& model = engine_->model();
  console_.training(c(), model.params().count(), model.params().count(core::ParamStore::Counting::Trainable), total_);
  open_logs();
  // The logs keep the steps up to state_.step (open_logs); TensorBoard drops the earlier runs' steps after it.
  observers_ = std::make_unique<RunObservers>(c(), comm, *alloc_, *host_alloc_, state_.step + 1);
  meter_ = std::make_unique<StepMeter>(c(), *alloc_, *host_alloc_, *predictions_, *mlog_, *observers_,
                                       plan_.rank.peak_allocated, StepMeter::Where{rank, world, gpu_});
  runner_ = std::make_unique<StepRunner>(
      c(), StepRunner::Parts{*engine_, *loader_, *scaler_, *alloc_, *host_alloc_, *observers_, *predictions_, console_,
                             comm_, gpu_comm_ ? *gpu_comm_ : comm_});
}

void Trainer::open_data() {
  const DataPaths paths = resolve_data_paths(c(), comm_);
  DataOptions dopt = data_options(c(), paths.train_json, paths.image_folder);
  train_set_ = std::make_unique<LlavaDataset>(dopt, models::input_spec(c().model.config));
  if (!paths.eval_json.empty()) {
    dopt.json_path = paths.eval_json;
    eval_set_ = std::make_unique<LlavaDataset>(dopt, models::input_spec(c().model.config));
  }
}

// The engine started, or resumed from the newest checkpoint (a save killed after its files were whole is finished
// first); the step count, the schedule and the loss scaler.
void Trainer::start(const TrainOptions& options) {
  if (options.resume) {
    if (console_.lead())
      for (const std::string& dir : recover_checkpoints(c().output_dir)) console_.finished_interrupted_save(dir);
    comm_.barrier();
  }
  const std::optional<std::string> resume_dir = options.resume ? latest_checkpoint(c().output_dir) : std::nullopt;
  state_ = resume_dir ? engine_->load(*resume_dir) : engine_->start();
  // Planned: what starting left cached goes back, so that reserved is the states, their segments and the arena.
  if (c().allocator == AllocatorKind::Planned) alloc_->empty_cache();
  // A resumed position is checked against this run's data before the loader goes there.
  if (resume_dir) check_loader_position(state_, *resume_dir, train_set_->size(), train_set_->path());
  const int64_t per_epoch = std::max<int64_t>(1, train_set_->size() / c().global_batch_size);
  const double epoch_steps = std::ceil(c().num_train_epochs * double(per_epoch));
  HR_CHECK(c().max_steps > 0 || epoch_steps <= double(kMaxTrainerCount), "[config] train.num_train_epochs ",
           c().num_train_epochs, " makes ", epoch_steps, " steps of ", per_epoch,
           " per epoch, more than a run can count");
  total_ = c().max_steps > 0 ? c().max_steps : std::max<int64_t>(1, int64_t(epoch_steps));
  const int64_t warmup =
      c().warmup_steps >= 0 ? c().warmup_steps : int64_t(std::ceil(c().warmup_ratio * double(total_)));
  sched_ = std::make_unique<optim::Schedule>(optim::Schedule{c().scheduler, c().learning_rate, warmup, total_});
  scaler_ = std::make_unique<optim::LossScaler>(c().precision == Precision::FP16 ? c().loss_scale_initial : 1.f,
                                                c().loss_scale_window, c().loss_scale_hysteresis, c().loss_scale_min);
  if (resume_dir) {
    scaler_->load(state_.scaler);
    console_.resumed(*resume_dir, state_);
  } else if (options.resume) {
    console_.no_checkpoint(c().output_dir);
  }
}

void Trainer::make_loader() {
  loader_ = std::make_unique<DataLoader>(*train_set_, loader_options(c(), comm_.rank(), comm_.world()), state_.loader);
}

// The logs go back to the step this run starts from: the steps after it (a run killed after its last checkpoint,
// or an earlier run in this directory) are written again, and a reader sees each once.
void Trainer::open_logs() {
  const std::string mlog_name =
      comm_.world() == 1 ? std::string("memory.jsonl") : str("memory.rank", comm_.rank(), ".jsonl");
  std::vector<std::string> logs = {str(c().output_dir, "/", mlog_name)};
  if (console_.lead())
    logs.insert(logs.end(), {c().output_dir + "/eval.jsonl", c().output_dir + "/eval_predictions.jsonl"});
  for (const std::string& log : logs)
    if (const int64_t dropped = drop_lines_after_step(log, state_.step))
      console_.dropped_log_lines(log, dropped, state_.step);
  mlog_ = std::make_unique<MemoryLog>(logs[0], c().leak_window);
  if (console_.lead() && eval_set_) {
    eval_log_ = std::make_unique<LogFile>(logs[1]);
    predictions_log_ = std::make_unique<LogFile>(logs[2]);
  }
}

void Trainer::log(const StepOutcome& s, const MeasuredStep& m) {
  const StepRecord& rec = m.record;
  if (!m.timeline.empty()) console_.timeline(s.step, m.timeline);
  if (m.mismatch) console_.mismatch(rec.warnings.front());
  observers_->step(mlog_->write(rec, m.device, m.host, m.rss));
  if (s.nonfinite && !s.nonfinite_where.empty())
    console_.nonfinite(s.step, rec.loss, rec.grad_norm, s.nonfinite_where, c().on_nonfinite);
  else if (s.fp16_overflow)
    console_.fp16_overflow(s.step, rec.loss_scale);
  if (!m.leak.empty()) console_.leak(m.leak);
  report_data(s);
  if (!console_.lead() || !(s.step % c().logging_steps == 0 || s.step == total_ || console_.tty())) return;
  // The ETA from the mean step time of this session's steps so far (evaluations and checkpoints included).
  const double elapsed = std::chrono::duration<double>(Clock::now() - loop_start_).count();
  const int64_t done = s.step - first_step_;
  console_.step_line({s.step, total_, rec.loss, rec.lr, rec.grad_norm, rec.tokens_per_s, rec.samples_per_s,
                      m.device.allocated_bytes.peak, m.device.reserved_bytes.peak, rec.comm_exposed_s,
                      done > 0 ? elapsed / double(done) * double(total_ - s.step) : 0.0});
}

// What the loader met on the way: bad samples (each named once), samples LLaVA's template check masked, and what
// data.max_seq_len cut (warned about the first time, counted at the end).
void Trainer::report_data(const StepOutcome& s) {
  while (skipped_reported_ < loader_->skipped().size())
    console_.skipped_sample(loader_->skipped()[skipped_reported_++]);
  if (s.unlearnable > 0 && unlearnable_ == 0) console_.unlearnable(s.step, c().max_seq_len);
  unlearnable_ += s.unlearnable;
  if (loader_->images_dropped() > 0 && images_dropped_reported_ == 0) console_.image_dropped(s.step, c().max_seq_len);
  images_dropped_reported_ = loader_->images_dropped();
  while (masked_reported_ < loader_->masked().size()) console_.masked_sample(loader_->masked()[masked_reported_++]);
}

void Trainer::advance(const StepOutcome& s, const MeasuredStep& m) {
  if (m.mismatch) ++mismatches_;
  const MemoryStats& ms = m.device;
  if (!s.skipped && ms.allocated_bytes.peak > peak_step_.measured)
    peak_step_ = {s.step, ms.allocated_bytes.peak, m.record.predicted_peak, ms.at_peak};
  state_.oom_recoveries += s.oom_recoveries;
  if (s.fp16_overflow) ++state_.skipped_steps;
  state_.step = s.step;
  state_.loader = loader_->position();
  state_.scaler = scaler_->state();
}

std::optional<int> Trainer::stopping(const StepOutcome& s) {
  if ((s.nonfinite && c().on_nonfinite == OnNonfinite::Stop) || runner_->diverged()) return stop_on_nonfinite();
  if (s.stop_agreed) return stop();
  return std::nullopt;
}

// Each rank evaluates its share in step with the others (ZeRO-3 gathers parameters collectively); rank 0
// reports the merged result.
void Trainer::evaluate_now() {
  if (!eval_set_) return;
  // Planned: the arena the steps keep goes back first (the next step grows it again), so that evaluation's
  // exactly sized segments do not come on top of it; the plan's evaluation starts the same way.
  if (c().allocator == AllocatorKind::Planned) alloc_->empty_cache();
  EvalMemory memory(*alloc_, *predictor_, eval_predicted_);
  EvalOptions eo{c().eval_samples, c().eval_batch_size, c().max_new_tokens, c().ce_chunk_rows, &comm_};
  eo.pad_to_multiple_of = c().pad_to_multiple_of;
  eo.max_seq_len = c().max_seq_len;
  eo.watch = &memory;
  eo.on_bad_sample = c().on_bad_sample;
  EvalResult r = evaluate(engine_->model(), *eval_set_, eo);
  // Each bad evaluation sample named once (every evaluation meets the same ones), as the loader names training's.
  for (const std::string& bad : r.bad_samples)
    if (eval_bad_named_.insert(bad).second) console_.bad_eval_sample(bad);
  console_.eval_mismatches(memory);
  if (!console_.lead()) return;
  write_eval_line(*eval_log_, state_.step, r, memory);
  observers_->eval(state_.step, r);
  write_predictions(*predictions_log_, state_.step, r);
  console_.evaluation(state_.step, r, memory);
}

void Trainer::maybe_save_or_evaluate() {
  if (state_.step >= total_) return;  // finish() saves and evaluates the last step
  const bool save = c().save_steps > 0 && state_.step % c().save_steps == 0;
  const bool eval = c().eval_steps > 0 && state_.step % c().eval_steps == 0;
  if (save) engine_->save(state_);
  if (eval) evaluate_now();
  // Planned: what a checkpoint or an evaluation left cached goes back, so the steps reserve the states and
  // the arena only (the next step grows the arena again; its prediction replays from that state).
  if ((save || eval) && c().allocator == AllocatorKind::Planned) alloc_->empty_cache();
}

void Trainer::report_incomplete_logs() {
  for (const LogFile* log : {&mlog_->file(), static_cast<const LogFile*>(eval_log_.get()),
                             static_cast<const LogFile*>(predictions_log_.get())})
    if (log && !log->complete()) console_.incomplete_log(log->incomplete());
}

void Trainer::write_report() {
  const std::string file = c().output_dir + "/report.html";
  try {
    const std::string html = run_report_html(c().output_dir);
    AtomicFile f(file);
    f.write(html.data(), html.size());
    f.commit();
    console_.report(file, "");
  } catch (const std::exception& e) {  // the run is done: a report that cannot be written is only reported
    console_.report(file, e.what());
  }
}

int Trainer::stop_on_nonfinite() {
  const std::optional<std::string> last = latest_checkpoint(c().output_dir);
  const std::string kept = last ? str("the last checkpoint, ", *last, ", is from before it and was not overwritten")
                                : std::string("no checkpoint was written before it");
  if (runner_->diverged())
    console_.diverged(state_.step, runner_->skips_at_min(), c().loss_scale_min, c().loss_scale_max_skips_at_min, kept);
  else
    console_.stopped_nonfinite(state_.step, kept);
  comm_.barrier();
  return 1;
}

int Trainer::stop() {
  console_.close_bar();
  console_.stop_requested(stop_signal(), state_.step);
  engine_->save(state_);
  report_incomplete_logs();
  if (console_.lead()) write_report();
  console_.stopped(state_.step, total_, c().output_dir);
  comm_.barrier();
  return 0;
}

RunSummary Trainer::summary() const {
  RunSummary s;
  s.dry_runs = predictions_->dry_runs();
  s.layouts_reused = int64_t(predictor_->layouts().reused());
  s.oom_recoveries = state_.oom_recoveries;
  s.micro_batch = c().micro_batch_size / runner_->split();
  s.accumulation = c().gradient_accumulation_steps * runner_->split();
  s.bad_samples = loader_->skipped().size();
  s.bad_sample_skips = loader_->skips();
  s.masked_samples = loader_->masked().size();
  s.fp16_skipped_steps = state_.skipped_steps;
  s.images_dropped = loader_->images_dropped();
  s.unlearnable = unlearnable_;
  s.nonfinite_steps = runner_->nonfinite_steps();
  s.max_seq_len = c().max_seq_len;
  s.allocator_summary = alloc_->memory_summary();
  s.peak_step = peak_step_.step, s.peak_measured = peak_step_.measured, s.peak_predicted = peak_step_.predicted;
  s.peak_at = peak_step_.at_peak;
  s.planned_peak = plan_.rank.peak_allocated;
  return s;
}

int Trainer::finish() {
  console_.close_bar();
  if (save_and_evaluate_at_end_) {
    engine_->save(state_);
    evaluate_now();
  }
  report_incomplete_logs();
  console_.mismatched_steps(mismatches_);
  if (console_.lead()) {
    console_.summary(summary());
    write_report();
    console_.done(std::chrono::duration<double>(Clock::now() - t_start_).count(), c().output_dir);
  }
  comm_.barrier();
  return 0;
}

// The resolved config in output_dir/config.yaml, written by rank 0 under the output directory's lock, which it
// holds for the run: one job writes an output directory at a time.
std::unique_ptr<OutputDirLock> claim_output_dir(const RunConfig& c, parallel::Communicator& comm) {
  if (comm.rank() != 0) return nullptr;
  fs::create_directories(c.output_dir);
  auto lock = std::make_unique<OutputDirLock>(c.output_dir);
  AtomicFile f(c.output_dir + "/config.yaml");
  f.write(c.resolved_yaml.data(), c.resolved_yaml.size());
  f.commit();
  return lock;
}

// Under an MPI launcher stdout is the launcher's pipe or pty, whatever the user's terminal is: plain lines unless
// the bar is asked for.
bool progress_bar(const RunConfig& c, parallel::Communicator& comm) {
  const bool terminal = isatty(STDOUT_FILENO) && !parallel::launched_by_mpi();
  return comm.rank() == 0 && (c.progress_bar == ProgressBar::On || (c.progress_bar == ProgressBar::Auto && terminal));
}

}  // namespace

int run_training(const RunConfig& given, const TrainOptions& options, parallel::Communicator& comm) {
  comm.set_timeout(given.collective_timeout_s);  // parallel.timeout: a stopped rank ends the job, named
  const std::unique_ptr<OutputDirLock> lock = claim_output_dir(given, comm);
  const StopSignals signals;  // from here on, SIGTERM/SIGINT stop after a step with a checkpoint
  use_cpu_threads(given, comm.world());
  Console console(comm.rank(), comm.world(), progress_bar(given, comm));
  Trainer t(plan_run(given, comm, console), options, comm, console);  // data, engine started or resumed, loader
  while (t.step() < t.total()) {
    const StepOutcome step = t.run_step();          // draw, forward and backward (out-of-memory recovery), update
    const MeasuredStep measured = t.measure(step);  // the dry run's peaks beside the measured ones, the leak watch
    t.log(step, measured);                          // memory.jsonl, TensorBoard, the console
    t.advance(step, measured);                      // the step count, the loader's position, the loss scale
    if (const std::optional<int> code = t.stopping(step)) return *code;  // non-finite, diverged, SIGTERM
    t.maybe_save_or_evaluate();
  }
  return t.finish();
}

}  // namespace hr::train
