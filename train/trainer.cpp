// The training run: plan and pre-flight, data, the engine's start or resume, and the step loop with its
// out-of-memory recovery, memory log, console, evaluations and checkpoints.
#include "train/trainer.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/backend/device_info.h"
#include "core/io/atomic_file.h"
#include "core/lru_map.h"
#include "core/memory/device_memory.h"
#include "data/synth.h"
#include "train/checkpoint.h"
#include "train/console_format.h"
#include "train/engine.h"
#include "train/eval_log.h"
#include "train/evaluate.h"
#include "train/log_file.h"
#include "train/memory_log.h"
#include "train/observe.h"
#include "train/planner.h"
#include "train/report.h"
#include "train/run_guards.h"

namespace hr::train {

namespace fs = std::filesystem;
using namespace hr::core;
using namespace hr::models;
using namespace hr::data;
using Clock = std::chrono::steady_clock;

namespace {

// Splits a loader batch into `parts` micro-batches of consecutive samples (after an out-of-memory error).
std::vector<LoadedBatch> split_batch(const LoadedBatch& lb, int64_t parts, const RunConfig& c) {
  if (parts == 1) return {lb};
  std::vector<LoadedBatch> out;
  const int64_t n = int64_t(lb.examples.size()), per = (n + parts - 1) / parts;
  for (int64_t start = 0; start < n; start += per) {
    LoadedBatch b;
    b.examples.assign(lb.examples.begin() + start, lb.examples.begin() + std::min(n, start + per));
    for (const Example& e : b.examples) b.tokens += int64_t(e.ids.size());
    LoaderOptions o;
    o.pad_to_max_seq_len = c.pad_to_max_length;
    o.pad_to_multiple_of = c.pad_to_multiple_of;
    o.max_seq_len = c.max_seq_len;
    b.batch = collate(b.examples, batch_length(b.examples, o), c.model.config.ignore_index);
    out.push_back(std::move(b));
  }
  return out;
}

std::vector<MicroShape> to_shapes(const std::vector<std::array<int64_t, 3>>& v) {
  std::vector<MicroShape> out;
  for (const auto& a : v) out.push_back({a[0], a[1], a[2]});
  return out;
}

// One training run as one rank: everything run_training's loop needs, and the parts of a step.
class Trainer {
 public:
  Trainer(const RunConfig& given, const TrainOptions& options, parallel::Communicator& comm);
  int64_t step() const { return state_.step; }
  int64_t total() const { return total_; }
  float lr() const { return sched_->lr(state_.step); }
  // Resets the step's peaks and returns where the allocator starts it from: what it has cached depends on
  // every earlier step, evaluation and checkpoint, and so does the step's reserved peak.
  AllocatorSnapshot begin_step();

  // This step's batches from the loader, each cut in `split_` micro-batches (after recovered OOMs).
  struct Drawn {
    std::vector<LoadedBatch> batches, pending;   // as the loader gave them; their micro-batches
    std::vector<std::array<int64_t, 3>> shapes;  // (batch, seq, images) of each micro-batch run
    std::size_t at = 0;
  };
  // Forward and backward of the step; an OutOfMemory error halves the micro-batches and redoes it.
  Engine::StepStats step_redone_on_oom(Drawn& d, AllocatorSnapshot& start);
  // The loss scaler's verdict, clipping, the optimizer update; returns whether the step was skipped. A
  // non-finite loss or gradient in bf16/fp32 is diagnosed on the step's first micro-batch and skips the step.
  bool update(const Engine::StepStats& s, const Drawn& d, float lr);
  // The memory log line (measured beside predicted), leak and mismatch warnings, the console line.
  void record(const Engine::StepStats& s, const Drawn& d, const AllocatorSnapshot& start, float lr, bool skipped,
              Clock::time_point t0);
  // After a non-finite step with train.on_nonfinite: stop, or an fp16 run that diverged (its steps overflow at the
  // minimum loss scale, memory.loss_scale.max_skips_at_min in a row): ends the run (exit 1) without a checkpoint,
  // so that the last one written stays the last good one.
  bool stopped_on_nonfinite() const { return (nonfinite_ && c_.on_nonfinite == OnNonfinite::Stop) || diverged(); }
  int stop_on_nonfinite();
  bool diverged() const {
    return c_.loss_scale_max_skips_at_min > 0 && skips_at_min_ >= c_.loss_scale_max_skips_at_min;
  }
  void maybe_save_or_evaluate();
  // Whether any rank was asked to stop (SIGTERM, SIGINT) by the end of the step just recorded: the ranks agree on it
  // in one collective as record() begins, so that a rank waiting there for the others counts it in the step.
  bool stop_requested() const { return stop_agreed_; }
  // Ends a stopped run: the checkpoint of the step just finished, no evaluation; returns 0.
  int stop();
  int finish();

 private:
  Plan plan_and_preflight(const RunConfig& given);
  DevicePreset device_with_least_room(RunConfig& config);
  int tightest_rank_ = 0;  // the rank whose device room every rank plans with
  void evaluate_now();
  bool agree_on_stop();
  bool stop_agreed_ = false;
  // output_dir/report.html (headroom report); a failure to write it is reported, never fatal.
  void write_report();

  parallel::Communicator& comm_;
  const bool lead_;  // rank 0 prints, writes eval.jsonl, plan.json and the resolved config
  // Several ranks on GPUs: ZeRO's collectives on device tensors, over NCCL (or MPI through host memory). Made while
  // planning, before the GPU's memory is measured (NCCL's buffers are part of the runtime reserve): declared before
  // plan_.
  std::unique_ptr<parallel::Communicator> gpu_comm_;
  Clock::time_point t_start_ = Clock::now();
  Plan plan_;
  const RunConfig& c_;
  const bool save_and_evaluate_at_end_;
  std::unique_ptr<Predictor> predictor_;  // every step dry-run at its own shapes
  // Dry runs of the step shapes seen, the kPredictionsKept most recently used: batches whose lengths vary
  // make new shapes for the whole run, and each dry run keeps the step's request trace.
  static constexpr std::size_t kPredictionsKept = 64;
  LruMap<std::vector<std::array<int64_t, 3>>, Prediction> predicted_{kPredictionsKept};
  EvalPredictions eval_predicted_{kPredictionsKept};  // evaluation passes' dry runs, over all evaluations
  int64_t dry_runs_ = 0;
  const Prediction& prediction_for(const std::vector<std::array<int64_t, 3>>& shapes);
  std::unique_ptr<LlavaDataset> train_set_, eval_set_;
  // The communicator the engine's collectives go through, and its exposed communication when the step began.
  parallel::Communicator& collectives() { return gpu_comm_ ? *gpu_comm_ : comm_; }
  double exposed_at_start_ = 0;
  std::unique_ptr<Engine> engine_;
  TrainerState state_;
  int64_t total_ = 0;
  std::unique_ptr<optim::Schedule> sched_;
  std::unique_ptr<optim::LossScaler> scaler_;
  std::unique_ptr<DataLoader> loader_;
  std::unique_ptr<MemoryLog> mlog_;
  std::unique_ptr<LogFile> eval_log_, predictions_log_;  // rank 0's, with an evaluation set
  void report_incomplete_logs() const;
  std::shared_ptr<CachingAllocator> alloc_, host_alloc_;
  int gpu_ = -1;                             // N of the cuda:N the run trains on; -1 on the CPU
  std::unique_ptr<RunObservers> observers_;  // TensorBoard, memory timelines, out-of-memory snapshots
  // For the console's ETA and the end-of-run summary.
  Clock::time_point loop_start_;
  int64_t first_step_ = -1;
  struct PeakStep {
    int64_t step = 0, measured = -1, predicted = -1;
    CategoryBytes at_peak{};
  } peak_step_;
  bool tty_ = false;
  int64_t split_ = 1;  // micro-batches per loader batch: doubled by each recovered out-of-memory error
  int64_t mismatches_ = 0;
  std::size_t skipped_reported_ = 0, masked_reported_ = 0;
  // data.max_seq_len cuts: micro-batches left without a label, and images dropped with their placeholders (each
  // warned about the first time, counted at the end).
  int64_t unlearnable_ = 0, images_dropped_reported_ = 0;
  std::set<std::string> eval_bad_named_;  // bad evaluation samples already named
  void report_truncation(const Drawn& d, int64_t step);
  bool nonfinite_ = false;       // this step's loss or gradient norm was not finite (bf16/fp32)
  std::string nonfinite_where_;  // what the diagnosis found on this rank
  int64_t nonfinite_steps_ = 0;
  int64_t skips_at_min_ = 0;  // fp16: steps in a row skipped on overflow at the minimum loss scale
};

// Every rank must run the same plan (micro-batch, checkpointing, what `auto` picks): each measures its own device,
// and all plan for the one with the least usable room (a GPU another process already holds memory on), so that
// they decide alike and a plan that does not fit fails on every rank with the same account. Ranks that share a
// GPU (parallel.backend: mpi) each get an equal share of it, as a device.memory_limit in `config`.
DevicePreset Trainer::device_with_least_room(RunConfig& config) {
  const int world = comm_.world(), local = world > 1 ? comm_.local_rank() : 0;
  const Device d = run_device_of(config, local);
  if (d.type == DeviceType::CUDA && world > 1) {
    if (config.gpu_collectives_over_mpi) {
      gpu_comm_ = parallel::make_staged(comm_);
    } else {
      require_gpu_per_rank(d.index, config.device, comm_);
      gpu_comm_ = parallel::make_nccl(comm_, d.index);  // its buffers exist before the GPU is measured below
    }
    gpu_comm_->set_timeout(config.collective_timeout_s);
  }
  DevicePreset device = run_device(config, local);
  if (world == 1) return device;
  if (d.type == DeviceType::CUDA && config.gpu_collectives_over_mpi)
    if (const std::size_t share = share_of_gpu(d.index, comm_)) {
      config.memory_limit = config.memory_limit ? std::min(config.memory_limit, share) : share;
      device = run_device(config, local);
    }
  const std::vector<double> all = comm_.gather({double(device.capacity), double(device.runtime_reserve)});
  auto usable = [&](int r) { return double(config.budget) * all[std::size_t(2 * r)] - all[std::size_t(2 * r + 1)]; };
  int tightest = 0;
  for (int r = 1; r < world; ++r)
    if (usable(r) < usable(tightest)) tightest = r;
  if (usable(tightest) < usable(comm_.rank())) {
    device.capacity = std::size_t(all[std::size_t(2 * tightest)]);
    device.runtime_reserve = std::size_t(all[std::size_t(2 * tightest + 1)]);
    device.name += str(", planned with rank ", tightest, "'s room (the least of the ranks)");
  }
  tightest_rank_ = tightest;
  return device;
}

Plan Trainer::plan_and_preflight(const RunConfig& requested) {
  // A rank that runs out of memory would redo its step alone while the others wait in the step's collectives.
  if (requested.shrink_on_oom && comm_.world() > 1)
    throw parallel::EveryRankError(
        "[config] memory.on_oom: shrink_micro_batch redoes a step in one process only: with "
        "several ranks the one that ran out would redo it alone while the others wait in "
        "its collectives. Use memory.on_oom: fail and let the planner size the step "
        "(train.micro_batch_size: auto)");
  RunConfig given = requested;
  const DevicePreset device = device_with_least_room(given);
  const Search search = search_plans(given, device, comm_.world());
  // memory.allocator: auto takes the allocator whose dry run of the step reserves the least.
  Plan plan = given.allocator_auto ? compare_allocators(search.ranked.front()) : search.ranked.front();
  const RunConfig& c = plan.config;
  if (lead_) {
    if (!c.deepspeed.empty()) {
      std::string ignored;
      for (const std::string& k : c.deepspeed_not_acted_on) ignored += (ignored.empty() ? "" : ", ") + k;
      std::printf("[deepspeed] %s read onto headroom's keys (config.yaml shows them); read but not acted on: %s\n",
                  c.deepspeed.c_str(), ignored.empty() ? "none" : ignored.c_str());
    }
    std::printf("%s", plan_table(plan).c_str());
    if (search.any_auto) std::printf("%s", search_explanation(search, 5).c_str());
    AtomicFile f(c.output_dir + "/plan.json");
    const std::string text = plan_json(plan);
    f.write(text.data(), text.size());
    f.commit();
    std::fflush(stdout);
  }
  if (plan.fits) return plan;
  std::string fixes;
  for (const Plan& f : suggest_fixes(c, device, comm_.world()))
    fixes += str("\n  --set ", f.decisions_changed, ": peak ", format_bytes(double(f.total_predicted())), ", step ",
                 f.time.total(), " s");
  const bool step_fits = plan.train_predicted() <= plan.usable + plan.runtime_reserve;
  const std::string what = plan.evaluates && !plan.eval_fits && step_fits
                               ? str("the training step fits but evaluation does not (loss pass ",
                                     format_bytes(double(plan.eval.peak_allocated)), ", generation ",
                                     format_bytes(double(plan.generation.peak_allocated)),
                                     " allocated at train.eval_batch_size ", c.eval_batch_size, ")")
                               : std::string("the run does not fit");
  const std::string msg =
      str("[plan] ", what, ": predicted ", format_bytes(double(plan.total_predicted())), " per rank against ",
          format_bytes(double(plan.usable + plan.runtime_reserve)), " (", int(c.budget * 100 + 0.5f), "% of ",
          format_bytes(double(plan.capacity)),
          comm_.world() > 1 ? str(", rank ", tightest_rank_, "'s room: every rank plans with the least") : "",
          "). The cheapest changes that fit:",
          fixes.empty() ? std::string("\n  (none of the single changes tried)") : fixes);
  if (c.preflight) throw parallel::EveryRankError(msg + "\n(memory.preflight: false starts it anyway)");
  if (lead_) std::printf("%s\nstarting anyway (memory.preflight: false): expect an out-of-memory error\n", msg.c_str());
  return plan;
}

Trainer::Trainer(const RunConfig& given, const TrainOptions& options, parallel::Communicator& comm)
    : comm_(comm),
      lead_(comm.rank() == 0),
      plan_(plan_and_preflight((use_cpu_threads(given, comm.world()), given))),
      c_(plan_.config),
      save_and_evaluate_at_end_(options.finish) {
  const int rank = comm.rank(), world = comm.world();
  // device.type: cpu or cuda:N. Parameters, gradients, states and activations live there through its caching
  // allocator; the host allocator keeps the loader's batches and offloaded states.
  const Device device = run_device_of(c_, world > 1 ? comm.local_rank() : 0);  // checked by the plan
  predictor_ = std::make_unique<Predictor>(c_, world, rank, sizing_target(plan_.device));
  configure_run_device(device, c_.memory_limit, c_.allocator);
  alloc_ = allocator_for(device);
  host_alloc_ = allocator_for(Device::host());
  if (device.type == DeviceType::CUDA) gpu_ = device.index;

  const DataPaths paths = resolve_data_paths(c_, comm);
  DataOptions dopt = data_options(c_, paths.train_json, paths.image_folder);
  train_set_ = std::make_unique<LlavaDataset>(dopt, models::input_spec(c_.model.config));
  if (!paths.eval_json.empty()) {
    dopt.json_path = paths.eval_json;
    eval_set_ = std::make_unique<LlavaDataset>(dopt, models::input_spec(c_.model.config));
  }

  engine_ = std::make_unique<Engine>(c_, device, gpu_comm_ ? *gpu_comm_ : comm);
  if (options.resume) {  // a save killed after its files were whole is finished before the newest is looked for
    if (lead_)
      for (const std::string& dir : recover_checkpoints(c_.output_dir))
        std::printf("finished %s (its save was interrupted after every file was written)\n", dir.c_str());
    comm.barrier();
  }
  const std::optional<std::string> resume_dir = options.resume ? latest_checkpoint(c_.output_dir) : std::nullopt;
  state_ = resume_dir ? engine_->load(*resume_dir) : engine_->start();
  // Planned: what starting left cached goes back, so that reserved is the states, their segments and the arena.
  if (c_.allocator == AllocatorKind::Planned) alloc_->empty_cache();

  // A resumed position is checked against this run's data before the loader goes there.
  if (resume_dir) check_loader_position(state_, *resume_dir, train_set_->size(), train_set_->path());
  const int64_t per_epoch = std::max<int64_t>(1, train_set_->size() / c_.global_batch_size);
  const double epoch_steps = std::ceil(c_.num_train_epochs * double(per_epoch));
  HR_CHECK(c_.max_steps > 0 || epoch_steps <= double(kMaxTrainerCount), "[config] train.num_train_epochs ",
           c_.num_train_epochs, " makes ", epoch_steps, " steps of ", per_epoch,
           " per epoch, more than a run can count");
  total_ = c_.max_steps > 0 ? c_.max_steps : std::max<int64_t>(1, int64_t(epoch_steps));
  sched_ = std::make_unique<optim::Schedule>(optim::Schedule{
      c_.scheduler, c_.learning_rate,
      c_.warmup_steps >= 0 ? c_.warmup_steps : int64_t(std::ceil(c_.warmup_ratio * double(total_))), total_});
  scaler_ = std::make_unique<optim::LossScaler>(c_.precision == Precision::FP16 ? c_.loss_scale_initial : 1.f,
                                                c_.loss_scale_window, c_.loss_scale_hysteresis, c_.loss_scale_min);
  if (resume_dir) {
    scaler_->load(state_.scaler);
    if (lead_)
      std::printf("resumed from %s at step %lld (written by %d rank%s at ZeRO stage %d)\n", resume_dir->c_str(),
                  (long long)state_.step, state_.world_size, state_.world_size == 1 ? "" : "s", state_.zero_stage);
  } else if (options.resume && lead_) {
    std::printf("no checkpoint in %s: starting from scratch\n", c_.output_dir.c_str());
  }

  LoaderOptions lopt;
  lopt.micro_batch = c_.micro_batch_size;
  lopt.workers = c_.num_workers;
  lopt.prefetch = std::max<int>(c_.prefetch, int(c_.micro_batch_size));
  lopt.seed = c_.seed;
  lopt.group_by_modality_length = c_.group_by_modality_length;
  lopt.pad_to_max_seq_len = c_.pad_to_max_length;
  lopt.pad_to_multiple_of = c_.pad_to_multiple_of;
  lopt.max_seq_len = c_.max_seq_len;
  lopt.on_bad_sample = c_.on_bad_sample;
  lopt.rank = rank;
  lopt.world = world;
  loader_ = std::make_unique<DataLoader>(*train_set_, lopt, state_.loader);

  // Under an MPI launcher stdout is the launcher's pipe or pty, whatever the user's terminal is: plain lines
  // unless the bar is asked for.
  const bool terminal = isatty(STDOUT_FILENO) && !parallel::launched_by_mpi();
  tty_ = lead_ && (c_.progress_bar == ProgressBar::On || (c_.progress_bar == ProgressBar::Auto && terminal));
  if (lead_) {
    const Llava& model = engine_->model();
    std::printf(
        "training %s (%s, stage %s): %lld parameters, %lld trainable; %lld steps of %lld samples "
        "(micro %lld x accumulation %lld x %d rank%s); precision %s; ZeRO stage %d%s%s\n",
        c_.model.config.name.c_str(), projector_name(c_.model.config.projector), stage_name(c_.stage),
        (long long)model.params().count(), (long long)model.params().count(true), (long long)total_,
        (long long)c_.global_batch_size, (long long)c_.micro_batch_size, (long long)c_.gradient_accumulation_steps,
        world, world == 1 ? "" : "s", precision_name(c_.precision), c_.zero.stage,
        c_.zero.offload_optimizer == parallel::Offload::Cpu ? ", optimizer offloaded to the host" : "",
        c_.zero.offload_params == parallel::Offload::Cpu ? ", parameters offloaded to the host" : "");
    std::fflush(stdout);
  }
  const std::string mlog_name = world == 1 ? std::string("memory.jsonl") : str("memory.rank", rank, ".jsonl");
  // The logs go back to the step this run starts from: the steps after it (a run killed after its last checkpoint,
  // or an earlier run in this directory) are written again, and a reader sees each once.
  std::vector<std::string> logs = {str(c_.output_dir, "/", mlog_name)};
  if (lead_) logs.insert(logs.end(), {c_.output_dir + "/eval.jsonl", c_.output_dir + "/eval_predictions.jsonl"});
  for (const std::string& log : logs)
    if (const int64_t dropped = drop_lines_after_step(log, state_.step))
      std::printf("%s: dropped %lld lines of steps after %lld, which this run writes again\n", log.c_str(),
                  (long long)dropped, (long long)state_.step);
  mlog_ = std::make_unique<MemoryLog>(logs[0], c_.leak_window);
  if (lead_ && eval_set_) {
    eval_log_ = std::make_unique<LogFile>(logs[1]);
    predictions_log_ = std::make_unique<LogFile>(logs[2]);
  }
  observers_ = std::make_unique<RunObservers>(c_, comm, *alloc_, *host_alloc_);
}

AllocatorSnapshot Trainer::begin_step() {
  if (first_step_ < 0) first_step_ = state_.step, loop_start_ = Clock::now();
  alloc_->reset_peak_stats();
  host_alloc_->reset_peak_stats();
  AllocatorSnapshot start = alloc_->snapshot();
  observers_->begin_step(state_.step + 1);
  exposed_at_start_ = collectives().exposed_seconds();
  return start;
}

Engine::StepStats Trainer::step_redone_on_oom(Drawn& d, AllocatorSnapshot& start) {
  const auto draw = [&] {
    d.batches.push_back(loader_->next());
    for (LoadedBatch& b : split_batch(d.batches.back(), split_, c_)) d.pending.push_back(std::move(b));
  };
  auto next = [&] {
    if (d.at == d.pending.size()) draw();
    LoadedBatch& lb = d.pending[d.at++];
    const Batch& b = lb.batch;
    d.shapes.push_back({b.batch, b.seq, b.pixel_values.defined() ? b.pixel_values.size(0) : 0});
    return lb;
  };
  const bool planned = c_.allocator == AllocatorKind::Planned;
  for (;;) {
    try {
      if (planned) {
        // The step follows the plan of its shapes: every micro-batch is drawn first, to know them.
        while (d.batches.size() < std::size_t(c_.gradient_accumulation_steps)) draw();
        std::vector<std::array<int64_t, 3>> shapes;
        for (const LoadedBatch& lb : d.pending) {
          const Batch& b = lb.batch;
          shapes.push_back({b.batch, b.seq, b.pixel_values.defined() ? b.pixel_values.size(0) : 0});
        }
        alloc_->begin_stretch(prediction_for(shapes).layout);
      }
      return engine_->step(next, c_.gradient_accumulation_steps * split_, scaler_->scale());
    } catch (const OutOfMemory&) {
      if (planned && alloc_->stretch_open()) alloc_->end_stretch();
      const int64_t micro = c_.micro_batch_size / split_;
      const std::string snapshot = observers_->write_oom_snapshot();
      if (!snapshot.empty())
        std::printf("%s%sthe allocator at the out-of-memory error: %s (open it in pytorch.org/memory_viz)\n",
                    tty_ ? "\n" : "", comm_.world() > 1 ? str("rank ", comm_.rank(), ": ").c_str() : "",
                    snapshot.c_str());
      if (!c_.shrink_on_oom || micro <= 1) {
        observers_->end_step();
        throw;
      }
      split_ *= 2;
      if (lead_)
        std::printf(
            "%sstep %lld: out of memory with micro-batch %lld; halving it to micro-batch %lld x "
            "accumulation %lld (the same samples, the same global batch) and redoing the step\n",
            tty_ ? "\n" : "", (long long)(state_.step + 1), (long long)micro, (long long)(micro / 2),
            (long long)(c_.gradient_accumulation_steps * split_));
      ++state_.oom_recoveries;
      alloc_->empty_cache();
      alloc_->reset_peak_stats();  // the step's peak is the redone step's; the OOM stays counted
      start = alloc_->snapshot();
      d.pending.clear();
      d.shapes.clear();
      d.at = 0;
      for (const LoadedBatch& b : d.batches)
        for (LoadedBatch& part : split_batch(b, split_, c_)) d.pending.push_back(std::move(part));
    }
  }
}

bool Trainer::update(const Engine::StepStats& s, const Drawn& d, float lr) {
  const float loss_scale = s.loss_scale;
  const float grad_norm = s.scaled_norm / loss_scale;
  const bool overflow = !std::isfinite(s.scaled_norm);
  bool skipped = false;
  nonfinite_ = false;
  nonfinite_where_.clear();
  if (c_.precision == Precision::FP16) {
    const bool at_min = scaler_->scale() <= c_.loss_scale_min;  // the scale this step ran at could go no lower
    skipped = scaler_->update(overflow);
    skips_at_min_ = skipped && at_min ? skips_at_min_ + 1 : 0;
  } else if (overflow || !std::isfinite(s.loss)) {  // the same verdict on every rank: both are all-reduced
    nonfinite_ = skipped = true;
    ++nonfinite_steps_;
    nonfinite_where_ = engine_->diagnose_nonfinite(d.pending.front(), loss_scale / float(d.pending.size()));
  }
  if (skipped) {
    engine_->skip_update();
    if (!nonfinite_) ++state_.skipped_steps;
  } else {
    engine_->update(lr, optim::clip_coefficient(grad_norm, c_.max_grad_norm) / loss_scale);
  }
  if (c_.allocator == AllocatorKind::Planned) alloc_->end_stretch();
  return skipped;
}

void Trainer::record(const Engine::StepStats& s, const Drawn& d, const AllocatorSnapshot& start, float lr, bool skipped,
                     Clock::time_point t0) {
  const int rank = comm_.rank(), world = comm_.world();
  stop_agreed_ = agree_on_stop();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const std::string trace = observers_->end_step();  // before the dry run below, whose phases are not this step's
  if (!trace.empty() && lead_)
    std::printf("%sstep %lld: memory timeline in %s%s (open it in ui.perfetto.dev)\n", tty_ ? "\n" : "",
                (long long)(state_.step + 1), trace.c_str(), world > 1 ? " and the other ranks'" : "");
  StepRecord rec;
  rec.step = state_.step + 1;
  rec.loss = float(s.loss);
  rec.lr = lr;
  rec.loss_scale = s.loss_scale;
  rec.grad_norm = s.scaled_norm / rec.loss_scale;
  rec.skipped = skipped;
  if (nonfinite_)
    rec.nonfinite = nonfinite_where_.empty() ? "elsewhere (another rank's micro-batch)" : nonfinite_where_;
  rec.step_s = secs;
  rec.comm_exposed_s = collectives().exposed_seconds() - exposed_at_start_;
  rec.tokens = s.tokens;
  rec.tokens_per_s = double(s.tokens) / std::max(secs, 1e-9);
  rec.samples_per_s = double(c_.global_batch_size) / std::max(secs, 1e-9);
  const MemoryStats ms = alloc_->stats();
  const Prediction& predicted = prediction_for(d.shapes);
  rec.predicted_peak = predicted.peak_allocated;
  // The dry run's requests replayed from the state this step started in.
  rec.predicted_reserved = replay(start, *predicted.requests, alloc_->capacity(), predicted.layout).peak_reserved;
  rec.allocator = allocator_kind_name(c_.allocator);
  if (gpu_ >= 0) {
    const core::CudaMemInfo m = core::cuda_memory_now(gpu_);
    rec.device_free = m.free_bytes, rec.device_total = m.total_bytes;
  }
  rec.planned_peak = plan_.rank.peak_allocated;
  if (!skipped && (ms.allocated_bytes.peak != rec.predicted_peak || ms.reserved_bytes.peak != rec.predicted_reserved)) {
    ++mismatches_;
    rec.warnings.push_back(str("[memory] WARNING step ", rec.step, world > 1 ? str(" rank ", rank) : std::string(),
                               ": measured peak ", ms.allocated_bytes.peak, " B allocated / ", ms.reserved_bytes.peak,
                               " B reserved differs from the dry run of this step's shapes, ", rec.predicted_peak,
                               " B / ", rec.predicted_reserved,
                               " B. The planner's prediction is exact by design on the CPU: "
                               "this is a bug."));
    std::printf("%s%s\n", tty_ ? "\n" : "", rec.warnings.back().c_str());
  }
  if (!skipped && ms.allocated_bytes.peak > peak_step_.measured)
    peak_step_ = {rec.step, ms.allocated_bytes.peak, rec.predicted_peak, ms.at_peak};
  const MemoryStats host_stats = host_alloc_->stats();
  const int64_t rss = host_rss_bytes();
  const std::string leak = mlog_->leak_check(rec.step, ms, host_stats, rss);
  for (std::size_t at = 0; at < leak.size();) {
    const std::size_t nl = std::min(leak.find('\n', at), leak.size());
    rec.warnings.push_back(leak.substr(at, nl - at));
    at = nl + 1;
  }
  observers_->step(mlog_->write(rec, ms, host_stats, rss));
  if (nonfinite_ && !nonfinite_where_.empty())
    std::printf(
        "%s%sstep %lld: non-finite loss (%g) or gradient norm (%g); the first non-finite value came from %s. "
        "The step is skipped%s\n",
        tty_ ? "\n" : "", world > 1 ? str("rank ", rank, ": ").c_str() : "", (long long)rec.step, rec.loss,
        rec.grad_norm, nonfinite_where_.c_str(),
        c_.on_nonfinite == OnNonfinite::Stop ? " and the run stops (train.on_nonfinite: stop)" : "");
  else if (skipped && !nonfinite_ && lead_)
    std::printf("%sstep %lld: fp16 overflow at loss scale %g; step skipped\n", tty_ ? "\n" : "", (long long)rec.step,
                rec.loss_scale);
  if (!leak.empty())
    std::printf("%s%s%s\n", tty_ ? "\n" : "", world > 1 ? str("rank ", rank, ": ").c_str() : "", leak.c_str());
  while (skipped_reported_ < loader_->skipped().size()) {
    const std::string& what = loader_->skipped()[skipped_reported_++];
    if (lead_) std::printf("%sskipped bad sample: %s\n", tty_ ? "\n" : "", what.c_str());
  }
  report_truncation(d, rec.step);
  while (masked_reported_ < loader_->masked().size()) {
    const std::string& what = loader_->masked()[masked_reported_++];
    if (lead_)
      std::printf(
          "%swarning: %s: LLaVA's round lengths disagree with the tokens (its \"tokenization mismatch\"); "
          "every label masked, as LLaVA does\n",
          tty_ ? "\n" : "", what.c_str());
  }
  if (lead_ && (rec.step % c_.logging_steps == 0 || rec.step == total_ || tty_)) {
    // The ETA from the mean step time of this session's steps so far (evaluations and checkpoints included).
    const double elapsed = std::chrono::duration<double>(Clock::now() - loop_start_).count();
    const int64_t done = rec.step - first_step_;
    const double eta = done > 0 ? elapsed / double(done) * double(total_ - rec.step) : 0.0;
    const std::string line =
        str("step ", rec.step, "/", total_, " | loss ", rec.loss, " | lr ", lr, " | grad_norm ", rec.grad_norm,
            " | tok/s ", int64_t(rec.tokens_per_s), " | samples/s ", format_rate(rec.samples_per_s), " | mem ",
            format_bytes(double(ms.allocated_bytes.peak)), " peak / ", format_bytes(double(ms.reserved_bytes.peak)),
            " reserved", world > 1 ? str(" | comm ", format_ms(rec.comm_exposed_s), " exposed") : std::string(),
            " | ETA ", format_duration(eta));
    if (tty_)
      std::printf("\r%s %s", bar(rec.step, total_).c_str(), line.c_str());
    else
      std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
  state_.step = rec.step;
  state_.loader = loader_->position();
  state_.scaler = scaler_->state();
}

// Each rank evaluates its share in step with the others (ZeRO-3 gathers parameters collectively); rank 0
// reports the merged result.
void Trainer::report_truncation(const Drawn& d, int64_t step) {
  int64_t unlearnable = 0;
  for (const LoadedBatch& b : d.pending) unlearnable += b.no_labels_after_truncation;
  if (lead_ && unlearnable > 0 && unlearnable_ == 0)
    std::printf(
        "%swarning: step %lld: data.max_seq_len %lld cut off every answer of a micro-batch: it has no label to "
        "learn (loss and gradient 0). Raise data.max_seq_len (micro-batches like it are counted at the end)\n",
        tty_ ? "\n" : "", (long long)step, (long long)c_.max_seq_len);
  unlearnable_ += unlearnable;
  if (lead_ && loader_->images_dropped() > 0 && images_dropped_reported_ == 0)
    std::printf(
        "%swarning: step %lld: data.max_seq_len %lld cut a sample before its image's placeholders: the image is "
        "dropped with them, as LLaVA truncates (counted at the end)\n",
        tty_ ? "\n" : "", (long long)step, (long long)c_.max_seq_len);
  images_dropped_reported_ = loader_->images_dropped();
}

void Trainer::evaluate_now() {
  if (!eval_set_) return;
  EvalMemory memory(*alloc_, *predictor_, eval_predicted_);
  EvalOptions eo{c_.eval_samples, c_.eval_batch_size, c_.max_new_tokens, c_.ce_chunk_rows, &comm_};
  eo.pad_to_multiple_of = c_.pad_to_multiple_of;
  eo.max_seq_len = c_.max_seq_len;
  eo.watch = &memory;
  eo.on_bad_sample = c_.on_bad_sample;
  EvalResult r = evaluate(engine_->model(), *eval_set_, eo);
  // Each bad evaluation sample named once (every evaluation meets the same ones), as the loader names training's.
  for (const std::string& bad : r.bad_samples)
    if (lead_ && eval_bad_named_.insert(bad).second)
      std::printf("%sskipped bad evaluation sample: %s\n", tty_ ? "\n" : "", bad.c_str());
  const int64_t mismatches = memory.loss.mismatches + memory.generation.mismatches;
  if (mismatches)
    std::printf(
        "%s[memory] rank %d: %lld evaluation passes measured a peak other than their dry runs (loss pass %lld "
        "B measured / %lld B predicted, generation %lld / %lld)\n",
        tty_ ? "\n" : "", comm_.rank(), (long long)mismatches, (long long)memory.loss.measured,
        (long long)memory.loss.predicted, (long long)memory.generation.measured,
        (long long)memory.generation.predicted);
  if (!lead_) return;
  write_eval_line(*eval_log_, state_.step, r, memory);
  observers_->eval(state_.step, r);
  write_predictions(*predictions_log_, state_.step, r);
  std::printf("%sstep %lld | %s | memory: loss pass %s, generation %s (%s)\n", tty_ ? "\n" : "", (long long)state_.step,
              eval_summary(r).c_str(), format_bytes(double(memory.loss.measured)).c_str(),
              format_bytes(double(memory.generation.measured)).c_str(),
              mismatches ? "NOT as predicted" : "as predicted");
  for (const std::string& e : r.examples) std::printf("    %s\n", e.c_str());
  std::fflush(stdout);
}

void Trainer::report_incomplete_logs() const {
  for (const LogFile* log : {&mlog_->file(), static_cast<const LogFile*>(eval_log_.get()),
                             static_cast<const LogFile*>(predictions_log_.get())})
    if (log && !log->complete())
      std::printf("%sincomplete log: %s\n", comm_.world() > 1 ? str("rank ", comm_.rank(), ": ").c_str() : "",
                  log->incomplete().c_str());
}

void Trainer::write_report() {
  try {
    const std::string html = run_report_html(c_.output_dir);
    AtomicFile f(c_.output_dir + "/report.html");
    f.write(html.data(), html.size());
    f.commit();
    std::printf("run report: %s/report.html\n", c_.output_dir.c_str());
  } catch (const std::exception& e) {  // the run is done: a report that cannot be written is only reported
    std::printf("run report not written: %s\n", e.what());
  }
}

void Trainer::maybe_save_or_evaluate() {
  if (state_.step >= total_) return;  // finish() saves and evaluates the last step
  const bool save = c_.save_steps > 0 && state_.step % c_.save_steps == 0;
  const bool eval = c_.eval_steps > 0 && state_.step % c_.eval_steps == 0;
  if (save) engine_->save(state_);
  if (eval) evaluate_now();
  // Planned: what a checkpoint or an evaluation left cached goes back, so the steps reserve the states and
  // the arena only (the next step grows the arena again; its prediction replays from that state).
  if ((save || eval) && c_.allocator == AllocatorKind::Planned) alloc_->empty_cache();
}

const Prediction& Trainer::prediction_for(const std::vector<std::array<int64_t, 3>>& shapes) {
  return predicted_.get(shapes, [&] {
    ++dry_runs_;
    return predictor_->step(to_shapes(shapes));
  });
}

int Trainer::stop_on_nonfinite() {
  const std::optional<std::string> last = latest_checkpoint(c_.output_dir);
  const std::string kept = last ? str("the last checkpoint, ", *last, ", is from before it and was not overwritten")
                                : std::string("no checkpoint was written before it");
  if (lead_ && diverged())  // as DeepSpeed's loss scaler raises at its minimum scale
    std::printf(
        "%s[fp16] stopped at step %lld: the run diverged, %lld steps in a row overflowed at the minimum loss scale "
        "%g (memory.loss_scale.min; memory.loss_scale.max_skips_at_min: %lld); %s. Lower train.learning_rate or "
        "use memory.precision: bf16\n",
        tty_ ? "\n" : "", (long long)state_.step, (long long)skips_at_min_, double(c_.loss_scale_min),
        (long long)c_.loss_scale_max_skips_at_min, kept.c_str());
  else if (lead_)
    std::printf(
        "stopped at step %lld on a non-finite loss or gradient; %s. Lower train.learning_rate, "
        "check the data and weights, or set train.on_nonfinite: skip\n",
        (long long)state_.step, kept.c_str());
  comm_.barrier();
  return 1;
}

bool Trainer::agree_on_stop() {
  const double mine = stop_signal() ? 1.0 : 0.0;
  return (comm_.world() > 1 ? collectives().sum(mine) : mine) > 0;
}

int Trainer::stop() {
  if (tty_) std::printf("\n");
  const int sig = stop_signal();
  if (lead_)
    std::printf("stop requested (%s): saving the checkpoint of step %lld and exiting; --resume continues from it\n",
                sig ? strsignal(sig) : "on another rank", (long long)state_.step);
  engine_->save(state_);
  report_incomplete_logs();
  if (lead_) write_report();
  if (lead_)
    std::printf("stopped at step %lld of %lld; outputs in %s\n", (long long)state_.step, (long long)total_,
                c_.output_dir.c_str());
  comm_.barrier();
  return 0;
}

int Trainer::finish() {
  if (tty_) std::printf("\n");
  if (save_and_evaluate_at_end_) {
    engine_->save(state_);
    evaluate_now();
  }
  const int world = comm_.world();
  report_incomplete_logs();
  if (mismatches_)
    std::printf("%s[memory] %lld steps measured a peak other than predicted\n",
                world > 1 ? str("rank ", comm_.rank(), ": ").c_str() : "", (long long)mismatches_);
  if (lead_) {
    std::printf("every step's peak was predicted by a dry run of its shapes: %lld dry runs\n", (long long)dry_runs_);
    if (state_.oom_recoveries)
      std::printf("%lld out-of-memory errors recovered by halving the micro-batch (now %lld x accumulation %lld)\n",
                  (long long)state_.oom_recoveries, (long long)(c_.micro_batch_size / split_),
                  (long long)(c_.gradient_accumulation_steps * split_));
    if (!loader_->skipped().empty())
      std::printf("%zu bad samples (named above), skipped %lld times\n", loader_->skipped().size(),
                  (long long)loader_->skips());
    if (!loader_->masked().empty())
      std::printf("%zu samples trained with every label masked (LLaVA's tokenization mismatch, named above)\n",
                  loader_->masked().size());
    if (state_.skipped_steps)
      std::printf("%lld optimizer steps skipped on fp16 overflow\n", (long long)state_.skipped_steps);
    if (loader_->images_dropped())
      std::printf("%lld images dropped with their placeholders by data.max_seq_len %lld\n",
                  (long long)loader_->images_dropped(), (long long)c_.max_seq_len);
    if (unlearnable_)
      std::printf("%lld micro-batches had no label left after data.max_seq_len %lld cut them\n",
                  (long long)unlearnable_, (long long)c_.max_seq_len);
    if (nonfinite_steps_)
      std::printf("%lld steps skipped on a non-finite loss or gradient (named above)\n", (long long)nonfinite_steps_);
    std::printf("%s", alloc_->memory_summary().c_str());
    if (peak_step_.measured >= 0) {
      std::string cats;
      for (Category cat : kAllCategories)
        if (const int64_t b = peak_step_.at_peak[std::size_t(cat)])
          cats += str(cats.empty() ? "" : ", ", category_name(cat), " ", format_bytes(double(b)));
      const int64_t err = peak_step_.measured - peak_step_.predicted;
      std::printf(
          "peak step %lld: %s allocated (%s); predicted %s by its dry run, error %s%s%s; the plan's worst "
          "case %s\n",
          (long long)peak_step_.step, format_bytes(double(peak_step_.measured)).c_str(), cats.c_str(),
          format_bytes(double(peak_step_.predicted)).c_str(), err < 0 ? "-" : "",
          format_bytes(double(err < 0 ? -err : err)).c_str(), err == 0 ? " (exact)" : "",
          format_bytes(double(plan_.rank.peak_allocated)).c_str());
    }
    write_report();
    std::printf("done in %.1f s; outputs in %s\n", std::chrono::duration<double>(Clock::now() - t_start_).count(),
                c_.output_dir.c_str());
  }
  comm_.barrier();
  return 0;
}

}  // namespace

int run_training(const RunConfig& given, const TrainOptions& options, parallel::Communicator& comm) {
  comm.set_timeout(given.collective_timeout_s);  // parallel.timeout: a stopped rank ends the job, named
  std::unique_ptr<OutputDirLock> lock;           // rank 0's: one job writes an output directory at a time
  if (comm.rank() == 0) {
    fs::create_directories(given.output_dir);
    lock = std::make_unique<OutputDirLock>(given.output_dir);
    AtomicFile f(given.output_dir + "/config.yaml");
    f.write(given.resolved_yaml.data(), given.resolved_yaml.size());
    f.commit();
  }
  const StopSignals signals;        // from here on, SIGTERM/SIGINT stop after a step with a checkpoint
  Trainer t(given, options, comm);  // plan, pre-flight, data, engine started or resumed, loader
  while (t.step() < t.total()) {
    const auto t0 = Clock::now();
    AllocatorSnapshot start = t.begin_step();
    Trainer::Drawn drawn;
    const Engine::StepStats s = t.step_redone_on_oom(drawn, start);  // draw, forward, backward, reduce
    const float lr = t.lr();
    const bool skipped = t.update(s, drawn, lr);  // loss scale, clip, optimizer
    t.record(s, drawn, start, lr, skipped, t0);   // memory log, console
    if (t.stopped_on_nonfinite()) return t.stop_on_nonfinite();
    if (t.stop_requested()) return t.stop();
    t.maybe_save_or_evaluate();
  }
  return t.finish();
}

}  // namespace hr::train
