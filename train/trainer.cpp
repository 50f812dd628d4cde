// The training loop.
#include "train/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/io/atomic_file.h"
#include "core/memory/device_memory.h"
#include "core/ops/reduce.h"
#include "models/data/synth.h"
#include "models/weights.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/memory_log.h"

namespace hr::train {

namespace fs = std::filesystem;
using namespace hr::core;
using namespace hr::models;
using Clock = std::chrono::steady_clock;

void ensure_synthetic_data(const RunConfig& c, const std::string& dir) {
  const std::string stamp = str("train=", c.synth_train, " eval=", c.synth_eval, " seed=", c.synth_seed,
                                " size=", c.synth_image_size, "\n");
  const std::string stamp_path = dir + "/synthetic.txt";
  std::ifstream in(stamp_path);
  std::string have((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (have == stamp) return;
  std::printf("writing the synthetic VQA set to %s (%lld train, %lld eval)\n", dir.c_str(), (long long)c.synth_train,
              (long long)c.synth_eval);
  write_synthetic_vqa({dir, c.synth_train, c.synth_eval, c.synth_seed, int(c.synth_image_size)});
  AtomicFile f(stamp_path);
  f.write(stamp.data(), stamp.size());
  f.commit();
}

namespace {

DType param_dtype(Precision p) {
  return p == Precision::FP32 ? DType::F32 : p == Precision::BF16 ? DType::BF16 : DType::F16;
}

std::string bar(int64_t done, int64_t total) {
  const int width = 24;
  const int fill = int(double(done) / double(std::max<int64_t>(total, 1)) * width);
  return "[" + std::string(std::size_t(fill), '=') + (fill < width ? ">" : "") +
         std::string(std::size_t(std::max(0, width - fill - 1)), ' ') + "]";
}

void write_eval_line(const std::string& path, int64_t step, const EvalResult& r) {
  nlohmann::json j = {{"step", step}, {"loss", r.loss}, {"accuracy", r.accuracy}, {"samples", r.samples}};
  nlohmann::json by = nlohmann::json::object();
  for (const auto& [type, ct] : r.by_type) by[type] = ct.second ? double(ct.first) / double(ct.second) : 0.0;
  j["accuracy_by_type"] = by;
  std::ofstream(path, std::ios::app) << j.dump() << "\n";
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

int run_training(const RunConfig& c, const TrainOptions& topt) {
  const auto t_start = Clock::now();
  fs::create_directories(c.output_dir);
  {
    AtomicFile f(c.output_dir + "/config.yaml");
    f.write(c.resolved_yaml.data(), c.resolved_yaml.size());
    f.commit();
  }
  if (c.threads > 0) omp_set_num_threads(c.threads);
  HR_CHECK(c.device == "cpu", "[train] device.type '", c.device,
           "': training runs on the CPU back-end in this build (the CUDA back-end has GEMM and element-wise kernels "
           "only)");
  const Device dev = Device::cpu();
  configure_device(dev, {c.memory_limit});
  auto alloc = allocator_for(dev);

  // Data.
  std::string train_json = c.train_json, eval_json = c.eval_json, images = c.image_folder;
  if (train_json.empty()) {
    const std::string dir = c.output_dir + "/data";
    ensure_synthetic_data(c, dir);
    train_json = dir + "/train.json";
    eval_json = eval_json.empty() ? dir + "/eval.json" : eval_json;
    images = images.empty() ? dir : images;
  }
  DataOptions dopt{train_json, images, c.chat_template, c.system_prompt, c.aspect, c.max_seq_len, c.blank_images};
  LlavaDataset train_set(dopt, c.model.config);
  std::unique_ptr<LlavaDataset> eval_set;
  if (!eval_json.empty()) {
    DataOptions e = dopt;
    e.json_path = eval_json;
    eval_set = std::make_unique<LlavaDataset>(e, c.model.config);
  }

  // Model and optimizer.
  Llava model(c.model.config, dev, param_dtype(c.precision),
              c.vision_fp32 ? std::optional<DType>(DType::F32) : std::nullopt);
  const bool vision = c.stage == Stage::Full && !c.model.freeze_vision;
  const bool projector = !c.model.freeze_projector;
  const bool llm = c.stage != Stage::Pretrain && !c.model.freeze_llm;
  model.set_trainable(vision, projector, llm);
  if (c.init_weights.empty()) init_weights(model.params(), c.seed);
  else load_weights(model.params(), Checkpoint::open(c.init_weights), MissingWeights::Error);
  optim::Optimizer optimizer(model.params(), c.optimizer);
  if (c.vision_lr > 0.f) optimizer.set_lr_ratio("vision_tower.", c.vision_lr / c.learning_rate);

  // Schedule.
  const int64_t per_epoch = std::max<int64_t>(1, train_set.size() / c.global_batch_size);
  const int64_t total = c.max_steps > 0 ? c.max_steps : std::max<int64_t>(1, int64_t(std::ceil(c.num_train_epochs * double(per_epoch))));
  optim::Schedule sched{c.scheduler, c.learning_rate,
                        c.warmup_steps >= 0 ? c.warmup_steps : int64_t(std::ceil(c.warmup_ratio * double(total))), total};
  optim::LossScaler scaler(c.precision == Precision::FP16 ? c.loss_scale_initial : 1.f, c.loss_scale_window,
                           c.loss_scale_hysteresis, c.loss_scale_min);

  TrainerState state;
  if (topt.resume) {
    if (auto last = latest_checkpoint(c.output_dir)) {
      state = load_checkpoint(*last, model, optimizer);
      scaler.load(state.scaler);
      std::printf("resumed from %s at step %lld\n", last->c_str(), (long long)state.step);
    } else {
      std::printf("no checkpoint in %s: starting from scratch\n", c.output_dir.c_str());
    }
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
  DataLoader loader(train_set, lopt, state.loader);

  const bool tty = c.progress_bar == ProgressBar::On || (c.progress_bar == ProgressBar::Auto && isatty(STDOUT_FILENO));
  std::printf("training %s (%s, stage %s): %lld parameters, %lld trainable; %lld steps of %lld samples "
              "(micro %lld x accumulation %lld); precision %s\n",
              c.model.config.name.c_str(), projector_name(c.model.config.projector), stage_name(c.stage),
              (long long)model.params().count(), (long long)model.params().count(true), (long long)total,
              (long long)c.global_batch_size, (long long)c.micro_batch_size, (long long)c.gradient_accumulation_steps,
              precision_name(c.precision));
  std::fflush(stdout);

  MemoryLog mlog(c.output_dir + "/memory.jsonl", c.leak_window);
  ModelOptions mopt;
  mopt.vision_policy = c.vision_ckpt;
  mopt.llm_policy = c.llm_ckpt;
  mopt.ce_chunk_rows = c.ce_chunk_rows;
  EvalOptions eopt{c.eval_samples, c.eval_batch_size, c.max_new_tokens, c.ce_chunk_rows};
  auto run_eval = [&](int64_t step) {
    if (!eval_set) return;
    EvalResult r = evaluate(model, *eval_set, eopt);
    write_eval_line(c.output_dir + "/eval.jsonl", step, r);
    std::printf("%sstep %lld | %s\n", tty ? "\n" : "", (long long)step, eval_summary(r).c_str());
    for (const std::string& e : r.examples) std::printf("    %s\n", e.c_str());
    std::fflush(stdout);
  };
  std::size_t skipped_reported = 0;

  for (int64_t step = state.step; step < total; ++step) {
    const auto t0 = Clock::now();
    alloc->reset_peak_stats();
    model.params().zero_grad();
    double loss_sum = 0;
    int64_t tokens = 0;
    const float loss_scale = scaler.scale();
    for (int64_t micro = 0; micro < c.gradient_accumulation_steps; ++micro) {
      LoadedBatch lb = loader.next();
      tokens += lb.tokens;
      LlavaState st;
      loss_sum += model.forward(lb.batch, st, mopt);
      model.backward(st, loss_scale / float(c.gradient_accumulation_steps));
    }
    std::vector<Tensor> grads;
    for (const auto& p : model.params().all())
      if (p->grad.defined()) grads.push_back(p->grad);
    const float scaled_norm = grads.empty() ? 0.f : global_norm(grads).item();
    const float grad_norm = scaled_norm / loss_scale;
    const bool overflow = !std::isfinite(scaled_norm);
    bool skipped = false;
    if (c.precision == Precision::FP16) {
      skipped = scaler.update(overflow);
    } else {
      HR_CHECK(!overflow, "[train] step ", step + 1, ": the gradient norm is not finite (loss ",
               loss_sum / double(c.gradient_accumulation_steps), "); lower train.learning_rate or use bf16/fp32");
    }
    const float lr = sched.lr(step);
    if (!skipped) optimizer.step(lr, optim::clip_coefficient(grad_norm, c.max_grad_norm) / loss_scale);
    else ++state.skipped_steps;
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
    mlog.write(rec, ms);
    if (skipped) std::printf("%sstep %lld: fp16 overflow at loss scale %g; step skipped\n", tty ? "\n" : "", (long long)(step + 1), loss_scale);
    const std::string leak = mlog.leak_check(step + 1, ms);
    if (!leak.empty()) std::printf("%s%s\n", tty ? "\n" : "", leak.c_str());
    while (skipped_reported < loader.skipped().size())
      std::printf("%sskipped bad sample: %s\n", tty ? "\n" : "", loader.skipped()[skipped_reported++].c_str());
    if ((step + 1) % c.logging_steps == 0 || step + 1 == total || tty) {
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
      save_checkpoint(c.output_dir, model, optimizer, state, c.save_total_limit);
    if (c.eval_steps > 0 && state.step % c.eval_steps == 0 && state.step < total) run_eval(state.step);
  }
  if (tty) std::printf("\n");
  save_checkpoint(c.output_dir, model, optimizer, state, c.save_total_limit);
  run_eval(state.step);
  if (!loader.skipped().empty()) std::printf("%zu bad samples skipped (named above)\n", loader.skipped().size());
  if (state.skipped_steps) std::printf("%lld optimizer steps skipped on fp16 overflow\n", (long long)state.skipped_steps);
  std::printf("%s", alloc->memory_summary().c_str());
  std::printf("done in %.1f s; outputs in %s\n", std::chrono::duration<double>(Clock::now() - t_start).count(),
              c.output_dir.c_str());
  return 0;
}

}  // namespace hr::train
