// The training loop.
#include "train/trainer.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <map>
#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/io/atomic_file.h"
#include "core/memory/device_memory.h"
#include "core/ops/reduce.h"
#include "data/synth.h"
#include "models/weights.h"
#include "train/checkpoint.h"
#include "train/engine.h"
#include "train/planner.h"
#include "train/evaluate.h"
#include "train/memory_log.h"

namespace hr::train {

namespace fs = std::filesystem;
using namespace hr::core;
using namespace hr::models;
using namespace hr::data;
using Clock = std::chrono::steady_clock;

void ensure_synthetic_data(const RunConfig& c, const std::string& dir) {
  const std::string stamp =
      str("train=", c.synth_train, " eval=", c.synth_eval, " seed=", c.synth_seed, " size=", c.synth_image_size,
          c.synth_questions > 1 ? str(" questions=", c.synth_questions) : std::string(),
          c.synth_captions > 0 ? str(" captions=", c.synth_captions) : std::string(), "\n");
  const std::string stamp_path = dir + "/synthetic.txt";
  std::ifstream in(stamp_path);
  std::string have((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (have == stamp) return;
  std::printf("writing the synthetic VQA set to %s (%lld train, %lld eval)\n", dir.c_str(), (long long)c.synth_train,
              (long long)c.synth_eval);
  write_synthetic_vqa({dir, c.synth_train, c.synth_eval, c.synth_seed, int(c.synth_image_size), int(c.synth_questions),
                       c.synth_captions});
  AtomicFile f(stamp_path);
  f.write(stamp.data(), stamp.size());
  f.commit();
}

namespace {

std::string bar(int64_t done, int64_t total) {
  const int width = 24;
  const int fill = int(double(done) / double(std::max<int64_t>(total, 1)) * width);
  std::string s(std::size_t(width + 2), ' ');
  s.front() = '[';
  s.back() = ']';
  for (int i = 0; i < fill && i < width; ++i) s[std::size_t(1 + i)] = '=';
  if (fill < width) s[std::size_t(1 + fill)] = '>';
  return s;
}

void write_eval_line(const std::string& path, int64_t step, const EvalResult& r) {
  nlohmann::json j = {{"step", step}, {"loss", r.loss}, {"accuracy", r.accuracy}, {"samples", r.samples}};
  nlohmann::json by = nlohmann::json::object();
  for (const auto& [type, ct] : r.by_type) by[type] = ct.second ? double(ct.first) / double(ct.second) : 0.0;
  j["accuracy_by_type"] = by;
  std::ofstream(path, std::ios::app) << j.dump() << "\n";
}

// Every evaluated sample's answer, one line each, tagged with the step: what a confusion matrix is made from.
void write_predictions(const std::string& path, int64_t step, const EvalResult& r) {
  std::ofstream f(path, std::ios::app);
  for (const EvalPrediction& p : r.predictions) f << prediction_line(p, step) << "\n";
}

// Splits a loader batch into `parts` micro-batches of consecutive samples (after an out-of-memory error).
std::vector<LoadedBatch> split_batch(const LoadedBatch& lb, int64_t parts, const RunConfig& c) {
  if (parts == 1) return {lb};
  std::vector<LoadedBatch> out;
  const int64_t n = int64_t(lb.examples.size()), per = (n + parts - 1) / parts;
  for (int64_t start = 0; start < n; start += per) {
    LoadedBatch b;
    b.examples.assign(lb.examples.begin() + start, lb.examples.begin() + std::min(n, start + per));
    int64_t seq = 0;
    for (const Example& e : b.examples) seq = std::max<int64_t>(seq, int64_t(e.ids.size())), b.tokens += int64_t(e.ids.size());
    b.batch = collate(b.examples, c.pad_to_max_length ? c.max_seq_len : seq, c.model.config.ignore_index);
    out.push_back(std::move(b));
  }
  return out;
}

std::vector<MicroShape> to_shapes(const std::vector<std::array<int64_t, 3>>& v) {
  std::vector<MicroShape> out;
  for (const auto& a : v) out.push_back({a[0], a[1], a[2]});
  return out;
}

std::string eval_summary(const EvalResult& r) {
  std::string s = str("eval loss ", r.loss, " | accuracy ", 100.0 * r.accuracy, "% (");
  bool first = true;
  for (const auto& [type, ct] : r.by_type) {
    s += str(first ? "" : ", ", type, " ", ct.second ? 100.0 * double(ct.first) / double(ct.second) : 0.0, "%");
    first = false;
  }
  return s + str(") over ", r.samples, " samples");
}

}  // namespace

int run_training(const RunConfig& given, const TrainOptions& topt, parallel::Communicator& comm) {
  const auto t_start = Clock::now();
  const int rank = comm.rank(), world = comm.world();
  const bool lead = rank == 0;  // prints, writes eval.jsonl, plan.json and the resolved config
  if (lead) {
    fs::create_directories(given.output_dir);
    AtomicFile f(given.output_dir + "/config.yaml");
    f.write(given.resolved_yaml.data(), given.resolved_yaml.size());
    f.commit();
  }
  use_cpu_threads(given, world);

  // The plan, before a byte is allocated: every `auto` filled, the peak predicted; what does not fit stops here.
  const DevicePreset device = run_device(given);
  const Search search = search_plans(given, device, world);
  const Plan plan = search.ranked.front();
  const RunConfig& c = plan.config;
  if (lead) {
    std::printf("%s", plan_table(plan).c_str());
    if (search.any_auto) std::printf("%s", search_explanation(search, 5).c_str());
    AtomicFile f(c.output_dir + "/plan.json");
    const std::string text = plan_json(plan);
    f.write(text.data(), text.size());
    f.commit();
    std::fflush(stdout);
  }
  if (!plan.fits) {
    std::string fixes;
    for (const Plan& f : suggest_fixes(c, device, world))
      fixes += str("\n  --set ", f.decisions_changed, ": peak ", format_bytes(double(f.total_predicted())), ", step ",
                   f.time.total(), " s");
    const std::string msg = str("[plan] the run does not fit: predicted ", format_bytes(double(plan.total_predicted())),
                                " per rank against ", format_bytes(double(plan.usable + plan.runtime_reserve)), " (",
                                int(c.budget * 100 + 0.5f), "% of ", format_bytes(double(plan.capacity)),
                                "). The cheapest changes that fit:", fixes.empty() ? std::string("\n  (none of the single changes tried)") : fixes);
    if (c.preflight) throw Error(msg + "\n(memory.preflight: false starts it anyway)");
    if (lead) std::printf("%s\nstarting anyway (memory.preflight: false): expect an out-of-memory error\n", msg.c_str());
  }
  // Every step is also dry-run at its own shapes: the prediction beside each measured peak.
  auto predictor = std::make_unique<Predictor>(c, world, rank, Backend::CPU);
  std::map<std::vector<std::array<int64_t, 3>>, Prediction> predicted;
  int64_t mismatches = 0;
  HR_CHECK(c.device == "cpu", "[train] device.type '", c.device,
           "': training runs on the CPU back-end in this build (the CUDA back-end has GEMM and element-wise kernels "
           "only)");
  const Device dev = Device::cpu();
  configure_device(dev, {c.memory_limit});
  auto alloc = allocator_for(dev);

  // Data: rank 0 writes the synthetic set; the others wait for it.
  std::string train_json = c.train_json, eval_json = c.eval_json, images = c.image_folder;
  if (train_json.empty()) {
    const std::string dir = c.output_dir + "/data";
    if (lead) ensure_synthetic_data(c, dir);
    comm.barrier();
    train_json = dir + "/train.json";
    eval_json = eval_json.empty() ? dir + "/eval.json" : eval_json;
    images = images.empty() ? dir : images;
  }
  DataOptions dopt{train_json, images, c.chat_template, c.system_prompt, c.aspect, c.max_seq_len, c.blank_images};
  LlavaDataset train_set(dopt, models::input_spec(c.model.config));
  std::unique_ptr<LlavaDataset> eval_set;
  if (!eval_json.empty()) {
    DataOptions e = dopt;
    e.json_path = eval_json;
    eval_set = std::make_unique<LlavaDataset>(e, models::input_spec(c.model.config));
  }

  // Model: initialised (same seed on every rank) or resumed in full, then sharded by the ZeRO stage.
  Engine engine(c, dev, comm);
  Llava& model = engine.model();
  std::optional<std::string> resume_dir;
  if (topt.resume) resume_dir = latest_checkpoint(c.output_dir);
  TrainerState state;
  if (resume_dir) {
    state = read_trainer_state(*resume_dir);
    load_model_weights(*resume_dir, model);
  } else if (c.init_weights.empty()) {
    init_weights(model.params(), c.seed);
  } else {
    load_weights(model.params(), Checkpoint::open(c.init_weights), MissingWeights::Error);
  }
  engine.shard();
  parallel::Zero& zero = engine.zero();

  // Schedule.
  const int64_t per_epoch = std::max<int64_t>(1, train_set.size() / c.global_batch_size);
  const int64_t total = c.max_steps > 0 ? c.max_steps : std::max<int64_t>(1, int64_t(std::ceil(c.num_train_epochs * double(per_epoch))));
  optim::Schedule sched{c.scheduler, c.learning_rate,
                        c.warmup_steps >= 0 ? c.warmup_steps : int64_t(std::ceil(c.warmup_ratio * double(total))), total};
  optim::LossScaler scaler(c.precision == Precision::FP16 ? c.loss_scale_initial : 1.f, c.loss_scale_window,
                           c.loss_scale_hysteresis, c.loss_scale_min);

  if (resume_dir) {
    load_optimizer_state(*resume_dir, zero, state.optimizer_steps);
    scaler.load(state.scaler);
    if (lead)
      std::printf("resumed from %s at step %lld (written by %d rank%s at ZeRO stage %d)\n", resume_dir->c_str(),
                  (long long)state.step, state.world_size, state.world_size == 1 ? "" : "s", state.zero_stage);
  } else if (topt.resume && lead) {
    std::printf("no checkpoint in %s: starting from scratch\n", c.output_dir.c_str());
  }
  LoaderOptions lopt;
  lopt.micro_batch = c.micro_batch_size;
  lopt.workers = c.num_workers;
  lopt.prefetch = std::max<int>(c.prefetch, int(c.micro_batch_size));
  lopt.seed = c.seed;
  lopt.group_by_modality_length = c.group_by_modality_length;
  lopt.pad_to_max_seq_len = c.pad_to_max_length;
  lopt.max_seq_len = c.max_seq_len;
  lopt.on_bad_sample = c.on_bad_sample;
  lopt.rank = rank;
  lopt.world = world;
  DataLoader loader(train_set, lopt, state.loader);

  // Under an MPI launcher stdout is the launcher's pipe or pty, whatever the user's terminal is: plain lines
  // unless the bar is asked for.
  const bool terminal = isatty(STDOUT_FILENO) && !parallel::launched_by_mpi();
  const bool tty = lead && (c.progress_bar == ProgressBar::On || (c.progress_bar == ProgressBar::Auto && terminal));
  if (lead) {
    std::printf("training %s (%s, stage %s): %lld parameters, %lld trainable; %lld steps of %lld samples "
                "(micro %lld x accumulation %lld x %d rank%s); precision %s; ZeRO stage %d%s%s\n",
                c.model.config.name.c_str(), projector_name(c.model.config.projector), stage_name(c.stage),
                (long long)model.params().count(), (long long)model.params().count(true), (long long)total,
                (long long)c.global_batch_size, (long long)c.micro_batch_size, (long long)c.gradient_accumulation_steps,
                world, world == 1 ? "" : "s", precision_name(c.precision), c.zero.stage,
                c.zero.offload_optimizer == parallel::Offload::Cpu ? ", optimizer offloaded to the host" : "",
                c.zero.offload_params == parallel::Offload::Cpu ? ", parameters offloaded to the host" : "");
    std::fflush(stdout);
  }

  const std::string mlog_name = world == 1 ? std::string("memory.jsonl") : str("memory.rank", rank, ".jsonl");
  MemoryLog mlog(str(c.output_dir, "/", mlog_name), c.leak_window);
  EvalOptions eopt{c.eval_samples, c.eval_batch_size, c.max_new_tokens, c.ce_chunk_rows, &comm};
  // Each rank evaluates its share in step with the others (ZeRO-3 gathers parameters collectively); rank 0
  // reports the merged result.
  auto run_eval = [&](int64_t step) {
    if (!eval_set) return;
    EvalResult r = evaluate(model, *eval_set, eopt);
    if (!lead) return;
    write_eval_line(c.output_dir + "/eval.jsonl", step, r);
    write_predictions(c.output_dir + "/eval_predictions.jsonl", step, r);
    std::printf("%sstep %lld | %s\n", tty ? "\n" : "", (long long)step, eval_summary(r).c_str());
    for (const std::string& e : r.examples) std::printf("    %s\n", e.c_str());
    std::fflush(stdout);
  };
  auto host_alloc = allocator_for(Device::host());
  std::size_t skipped_reported = 0;
  int64_t split = 1;  // micro-batches per loader batch: doubled by each recovered out-of-memory error

  for (int64_t step = state.step; step < total; ++step) {
    const auto t0 = Clock::now();
    alloc->reset_peak_stats();
    host_alloc->reset_peak_stats();
    // Where the allocator starts this step from: what it has cached depends on every earlier step, eval and
    // checkpoint, and so does the step's reserved peak.
    AllocatorSnapshot start = alloc->snapshot();
    const float loss_scale = scaler.scale();
    // This step's batches from the loader, each split in `split` micro-batches (after an OOM was recovered).
    std::vector<LoadedBatch> drawn;
    std::vector<LoadedBatch> pending;
    std::vector<std::array<int64_t, 3>> shapes;
    std::size_t at = 0;
    auto next = [&] {
      if (at == pending.size()) {
        drawn.push_back(loader.next());
        for (LoadedBatch& b : split_batch(drawn.back(), split, c)) pending.push_back(std::move(b));
      }
      LoadedBatch& lb = pending[at++];
      const Batch& b = lb.batch;
      shapes.push_back({b.batch, b.seq, b.pixel_values.defined() ? b.pixel_values.size(0) : 0});
      return lb;
    };
    Engine::Accumulated acc;
    for (;;) {
      try {
        acc = engine.accumulate(next, c.gradient_accumulation_steps * split, loss_scale);
        break;
      } catch (const OutOfMemory& e) {
        const int64_t micro = c.micro_batch_size / split;
        if (!c.shrink_on_oom || micro <= 1) throw;
        split *= 2;
        if (lead)
          std::printf("%sstep %lld: out of memory with micro-batch %lld; re-planned with micro-batch %lld x "
                      "accumulation %lld (the same samples, the same global batch) and redoing the step\n",
                      tty ? "\n" : "", (long long)(step + 1), (long long)micro, (long long)(micro / 2),
                      (long long)(c.gradient_accumulation_steps * split));
        ++state.oom_recoveries;
        alloc->empty_cache();
        alloc->reset_peak_stats();  // the step's peak is the redone step's; the OOM stays counted
        start = alloc->snapshot();
        pending.clear();
        shapes.clear();
        at = 0;
        for (const LoadedBatch& d : drawn)
          for (LoadedBatch& b : split_batch(d, split, c)) pending.push_back(std::move(b));
      }
    }
    double loss_sum = acc.loss_sum;
    int64_t tokens = acc.tokens;
    const float scaled_norm = acc.scaled_norm;
    const float grad_norm = scaled_norm / loss_scale;
    const bool overflow = !std::isfinite(scaled_norm);
    if (world > 1) {
      loss_sum = comm.sum(loss_sum) / world;
      tokens = int64_t(comm.sum(double(tokens)));
    }
    bool skipped = false;
    if (c.precision == Precision::FP16) {
      skipped = scaler.update(overflow);
    } else {
      HR_CHECK(!overflow, "[train] step ", step + 1, ": the gradient norm is not finite (loss ",
               loss_sum / double(c.gradient_accumulation_steps), "); lower train.learning_rate or use bf16/fp32");
    }
    const float lr = sched.lr(step);
    if (!skipped) {
      engine.update(lr, optim::clip_coefficient(grad_norm, c.max_grad_norm) / loss_scale);
    } else {
      engine.skip_update();
      ++state.skipped_steps;
    }
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    StepRecord rec;
    rec.step = step + 1;
    rec.loss = float(loss_sum / double(c.gradient_accumulation_steps));
    rec.lr = lr;
    rec.grad_norm = grad_norm;
    rec.loss_scale = loss_scale;
    rec.skipped = skipped;
    rec.tokens_per_s = double(tokens) / std::max(secs, 1e-9);
    const MemoryStats ms = alloc->stats();
    auto it = predicted.find(shapes);
    if (it == predicted.end()) it = predicted.emplace(shapes, predictor->step(to_shapes(shapes))).first;
    rec.predicted_peak = it->second.peak_allocated;
    // The dry run's requests replayed from the state this step started in.
    rec.predicted_reserved = replay(start, *it->second.requests, alloc->capacity()).peak_reserved;
    rec.planned_peak = plan.rank.peak_allocated;
    if (!skipped && (ms.allocated_bytes.peak != rec.predicted_peak || ms.reserved_bytes.peak != rec.predicted_reserved)) {
      ++mismatches;
      std::printf("%s[memory] WARNING step %lld%s: measured peak %lld B allocated / %lld B reserved differs from the "
                  "dry run of this step's shapes, %lld B / %lld B. The planner's prediction is exact by design on "
                  "the CPU: this is a bug.\n",
                  tty ? "\n" : "", (long long)(step + 1), world > 1 ? str(" rank ", rank).c_str() : "",
                  (long long)ms.allocated_bytes.peak, (long long)ms.reserved_bytes.peak, (long long)rec.predicted_peak,
                  (long long)rec.predicted_reserved);
    }
    mlog.write(rec, ms, host_alloc->stats());
    if (skipped && lead) std::printf("%sstep %lld: fp16 overflow at loss scale %g; step skipped\n", tty ? "\n" : "", (long long)(step + 1), loss_scale);
    const std::string leak = mlog.leak_check(step + 1, ms);
    if (!leak.empty()) std::printf("%s%s%s\n", tty ? "\n" : "", world > 1 ? str("rank ", rank, ": ").c_str() : "", leak.c_str());
    while (skipped_reported < loader.skipped().size()) {
      const std::string& what = loader.skipped()[skipped_reported++];
      if (lead) std::printf("%sskipped bad sample: %s\n", tty ? "\n" : "", what.c_str());
    }
    if (lead && ((step + 1) % c.logging_steps == 0 || step + 1 == total || tty)) {
      const std::string line = str("step ", step + 1, "/", total, " | loss ", rec.loss, " | lr ", lr, " | grad_norm ",
                                   grad_norm, " | tok/s ", int64_t(rec.tokens_per_s), " | mem ",
                                   format_bytes(double(ms.allocated_bytes.peak)), " peak / ",
                                   format_bytes(double(ms.reserved_bytes.peak)), " reserved");
      if (tty) std::printf("\r%s %s", bar(step + 1, total).c_str(), line.c_str());
      else std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    }
    state.step = step + 1;
    state.loader = loader.position();
    state.scaler = scaler.state();
    if (c.save_steps > 0 && state.step % c.save_steps == 0 && state.step < total)
      save_checkpoint(c.output_dir, model, zero, state, c.save_total_limit, comm, c.resolved_yaml);
    if (c.eval_steps > 0 && state.step % c.eval_steps == 0 && state.step < total) run_eval(state.step);
  }
  if (tty) std::printf("\n");
  save_checkpoint(c.output_dir, model, zero, state, c.save_total_limit, comm, c.resolved_yaml);
  run_eval(state.step);
  if (mismatches) std::printf("%s[memory] %lld steps measured a peak other than predicted\n", world > 1 ? str("rank ", rank, ": ").c_str() : "", (long long)mismatches);
  if (lead) {
    if (state.oom_recoveries) std::printf("%lld out-of-memory errors recovered by halving the micro-batch (now %lld x accumulation %lld)\n",
                                          (long long)state.oom_recoveries, (long long)(c.micro_batch_size / split),
                                          (long long)(c.gradient_accumulation_steps * split));
    if (!loader.skipped().empty()) std::printf("%zu bad samples skipped (named above)\n", loader.skipped().size());
    if (state.skipped_steps) std::printf("%lld optimizer steps skipped on fp16 overflow\n", (long long)state.skipped_steps);
    std::printf("%s", alloc->memory_summary().c_str());
    std::printf("done in %.1f s; outputs in %s\n", std::chrono::duration<double>(Clock::now() - t_start).count(),
                c.output_dir.c_str());
  }
  comm.barrier();
  return 0;
}

}  // namespace hr::train
