// Run configuration: schema, overrides, validation, derived values.
#include "train/config.h"

#include <unistd.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>

#include "core/check.h"
#include "core/io/text_file.h"
#include "core/suggest.h"
#include "train/deepspeed.h"

namespace hr::train {

OnNonfinite parse_on_nonfinite(const std::string& s) {
  if (s == "stop") return OnNonfinite::Stop;
  if (s == "skip") return OnNonfinite::Skip;
  throw Error(str("[config] train.on_nonfinite '", s, "' is not one of: stop, skip"));
}

namespace {

// Bounds on the batch keys, checked before anything is sized from them: the products must not overflow, and
// one micro-batch's inputs (token ids and labels, pixel values) must fit in this machine's memory.
void check_batch_bounds(const RunConfig& c, int world) {
  const auto& m = c.model.config;
  m.llm.check_window(c.max_seq_len, "data.max_seq_len");
  int64_t tokens = 0, per_step = 0, pixels = 0, images = 0, bytes = 0;
  const bool overflow =
      __builtin_mul_overflow(c.micro_batch_size, c.max_seq_len, &tokens) ||
      __builtin_mul_overflow(c.micro_batch_size, c.gradient_accumulation_steps, &per_step) ||
      __builtin_mul_overflow(per_step, int64_t(world), &per_step) ||
      __builtin_mul_overflow(c.micro_batch_size, c.max_images_per_sample, &images) ||
      __builtin_mul_overflow(images, m.vision.channels * m.vision.image_size * m.vision.image_size, &pixels) ||
      __builtin_mul_overflow(tokens, int64_t(16), &bytes) || pixels > INT64_MAX / 4 ||
      __builtin_add_overflow(bytes, pixels * 4, &bytes);
  HR_CHECK(!overflow, "[config] train.micro_batch_size ", c.micro_batch_size, " with max_seq_len ", c.max_seq_len,
           ", gradient_accumulation_steps ", c.gradient_accumulation_steps, " and world size ", world,
           ": the batch's sizes overflow 64 bits");
  const double host = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  HR_CHECK(host <= 0 || double(bytes) <= host, "[config] train.micro_batch_size ", c.micro_batch_size,
           ": one micro-batch's inputs (", tokens, " tokens of max_seq_len ", c.max_seq_len, ", ", images,
           " images) take ", format_bytes(double(bytes)), ", more than this machine's ", format_bytes(host),
           " of memory");
}

// Bounds of the counts held as ints: beyond them a machine cannot run the count (libgomp segfaults at 100,000
// threads, 40,000 loader threads end in std::terminate) and a 64-bit value would wrap.
constexpr int64_t kMaxThreads = 1024, kMaxWorkers = 256, kMaxPrefetch = 1 << 20, kMaxHysteresis = 1 << 20,
                  kMaxLayersEvery = 1 << 20;

using Setter = std::function<void(RunConfig&, const YAML::Node&, const std::string& key)>;

struct Key {
  const char* path;
  const char* fallback;  // default as YAML text
  Setter set;
};

[[noreturn]] void bad_value(const std::string& key, const YAML::Node& n, const std::string& want) {
  throw Error(str("[config] ", key, ": '", YAML::Dump(n), "' is not ", want));
}

template <typename T>
T get(const YAML::Node& n, const std::string& key, const char* want) {
  try {
    return n.as<T>();
  } catch (const YAML::Exception&) {
    bad_value(key, n, want);
  }
}

enum class Ends : uint8_t { Closed, OpenAbove, OpenBelow };  // [lo, hi], [lo, hi), (lo, hi]

template <typename E>
Setter choice(E RunConfig::*field, E (*parse)(const std::string&)) {
  return [=](RunConfig& c, const YAML::Node& n, const std::string& key) {
    const std::string s = get<std::string>(n, key, "a string");
    try {
      c.*field = parse(s);
    } catch (const Error& e) {
      // Re-word the parser's message around the full key.
      std::string msg = e.what();
      const std::size_t at = msg.find(" is not one of: ");
      throw Error(str("[config] ", key, ": '", s, "'", at == std::string::npos ? " is invalid" : msg.substr(at)));
    }
  };
}

Setter i64(int64_t RunConfig::*f, int64_t min) {
  return [=](RunConfig& c, const YAML::Node& n, const std::string& key) {
    const int64_t v = get<int64_t>(n, key, "an integer");
    if (v < min) bad_value(key, n, str("an integer >= ", min));
    c.*f = v;
  };
}
// A finite number in [lo, hi] (hi infinite: no upper end), or the error naming the key and the range. Read as
// a double: .nan, .inf and 1e300 (infinite as a float) are refused by name instead of reaching the optimizer.
double number_in(const YAML::Node& n, const std::string& key, double lo, double hi, Ends ends = Ends::Closed) {
  const double v = get<double>(n, key, "a number");
  const bool above = ends == Ends::OpenBelow ? v > lo : v >= lo, below = ends == Ends::OpenAbove ? v < hi : v <= hi;
  if (std::isfinite(v) && std::abs(v) <= double(std::numeric_limits<float>::max()) && above && below) return v;
  if (std::isinf(hi)) bad_value(key, n, str("a finite number ", ends == Ends::OpenBelow ? "> " : ">= ", lo));
  bad_value(
      key, n,
      str("a number in ", ends == Ends::OpenBelow ? "(" : "[", lo, ", ", hi, ends == Ends::OpenAbove ? ")" : "]"));
}

constexpr double kNoLimit = std::numeric_limits<double>::infinity();

Setter f32(float RunConfig::*f, float min, double max = kNoLimit) {
  return [=](RunConfig& c, const YAML::Node& n, const std::string& key) { c.*f = float(number_in(n, key, min, max)); };
}
// An optimizer hyper-parameter, bounded as PyTorch's optimizers check theirs.
Setter opt(float optim::OptimizerConfig::*f, double lo, double hi, Ends ends = Ends::Closed) {
  return [=](RunConfig& c, const YAML::Node& n, const std::string& key) {
    c.optimizer.*f = float(number_in(n, key, lo, hi, ends));
  };
}
// A count held as an int (threads, workers, ...): bounded before the narrowing, so 4294967297 is refused instead of
// wrapping to 1, and a count no machine can run (40,000 loader threads) is refused instead of aborting.
Setter count(int RunConfig::*f, int64_t min, int64_t max) {
  return [=](RunConfig& c, const YAML::Node& n, const std::string& key) {
    const int64_t v = get<int64_t>(n, key, "an integer");
    if (v < min || v > max) bad_value(key, n, str("an integer from ", min, " to ", max));
    c.*f = int(v);
  };
}
Setter flag(bool RunConfig::*f) {
  return [=](RunConfig& c, const YAML::Node& n, const std::string& key) { c.*f = get<bool>(n, key, "true or false"); };
}
// A string; a null (`key:` or `--set key=` with nothing after it) is the empty string, not "null".
Setter text(std::string RunConfig::*f) {
  return [=](RunConfig& c, const YAML::Node& n, const std::string& key) {
    c.*f = n.IsNull() ? std::string() : get<std::string>(n, key, "a string");
  };
}

GradAccum parse_grad_accum(const std::string& s) {
  if (s == "auto") return GradAccum::Auto;
  if (s == "fp32") return GradAccum::Fp32;
  if (s == "model") return GradAccum::Model;
  throw Error(str("[config] memory.grad_accum_dtype '", s, "' is not one of: auto, fp32, model"));
}

Precision parse_precision(const std::string& s) {
  if (s == "fp32" || s == "f32" || s == "float32") return Precision::FP32;
  if (s == "bf16" || s == "bfloat16") return Precision::BF16;
  if (s == "fp16" || s == "f16" || s == "float16") return Precision::FP16;
  throw Error("'" + s + "' is not one of: fp32, bf16, fp16");
}
Stage parse_stage(const std::string& s) {
  if (s == "pretrain") return Stage::Pretrain;
  if (s == "finetune") return Stage::Finetune;
  if (s == "full") return Stage::Full;
  throw Error("'" + s + "' is not one of: pretrain, finetune, full");
}
ProgressBar parse_bar(const std::string& s) {
  if (s == "auto") return ProgressBar::Auto;
  if (s == "true" || s == "on") return ProgressBar::On;
  if (s == "false" || s == "off") return ProgressBar::Off;
  throw Error("'" + s + "' is not one of: auto, true, false");
}

parallel::Offload parse_offload(const YAML::Node& n, const std::string& key) {
  const std::string s = get<std::string>(n, key, "a string");
  if (s == "none" || s == "false") return parallel::Offload::None;
  if (s == "cpu") return parallel::Offload::Cpu;
  bad_value(key, n, "one of: none, cpu");
}

Setter checkpointing(bool vision, bool llm) {
  return [=](RunConfig& c, const YAML::Node& n, const std::string& key) {
    const std::string s = get<std::string>(n, key, "a string");
    models::CheckpointKind k = models::CheckpointKind::None;
    const bool auto_ = s == "auto";
    try {
      if (!auto_) k = models::parse_checkpoint(s);
    } catch (const Error&) {
      throw Error(str("[config] ", key, ": '", s, "' is not one of: none, selective, full, auto"));
    }
    if (vision) c.vision_ckpt.kind = k, c.vision_ckpt_auto = auto_;
    if (llm) c.llm_ckpt.kind = k, c.llm_ckpt_auto = auto_;
  };
}

// run.*, device.* and model.*.
std::vector<Key> run_device_model_keys() {
  return {
      {"run.output_dir", "runs/default",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         c.output_dir = n.IsNull() ? std::string() : get<std::string>(n, k, "a string");
         if (c.output_dir.empty()) bad_value(k, n, "a directory name (it is empty)");
       }},
      {"run.seed", "42",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         c.seed = get<uint64_t>(n, k, "a non-negative integer");
       }},
      {"device.type", "cpu",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         c.device = get<std::string>(n, k, "a string");
         if (c.device != "cpu" && c.device.rfind("cuda", 0) != 0) bad_value(k, n, "one of: cpu, cuda, cuda:N");
       }},
      {"device.memory_limit", "0",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         c.memory_limit = parse_bytes(get<std::string>(n, k, "a size"), k);
       }},
      {"device.threads", "0", count(&RunConfig::threads, 0, kMaxThreads)},
      {"model.weights", "''", text(&RunConfig::init_weights)},
  };
}

// data.*.
std::vector<Key> data_keys() {
  return {
      {"data.train_json", "''", text(&RunConfig::train_json)},
      {"data.eval_json", "''", text(&RunConfig::eval_json)},
      {"data.image_folder", "''", text(&RunConfig::image_folder)},
      {"data.synthetic.train", "4000", i64(&RunConfig::synth_train, 1)},
      {"data.synthetic.eval", "200", i64(&RunConfig::synth_eval, 1)},
      {"data.synthetic.image_size", "32", i64(&RunConfig::synth_image_size, 8)},
      {"data.synthetic.questions", "1", i64(&RunConfig::synth_questions, 1)},
      {"data.synthetic.captions", "0",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         c.synth_captions = get<double>(n, k, "a number");
         if (!(c.synth_captions >= 0 && c.synth_captions <= 1)) bad_value(k, n, "a fraction in [0, 1]");
       }},
      {"data.synthetic.seed", "0",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         c.synth_seed = get<uint64_t>(n, k, "a non-negative integer");
       }},
      {"data.template", "vicuna_v1", choice(&RunConfig::chat_template, data::parse_template)},
      {"data.system_prompt", "default",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         const std::string s = get<std::string>(n, k, "a string");
         c.system_prompt = s;
       }},
      {"data.tokenizer", "auto",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         c.tokenizer = get<std::string>(n, k, "a string");
       }},
      {"data.image_aspect_ratio", "pad", choice(&RunConfig::aspect, data::parse_aspect)},
      {"data.max_seq_len", "2048", i64(&RunConfig::max_seq_len, 2)},
      {"data.group_by_modality_length", "false", flag(&RunConfig::group_by_modality_length)},
      {"data.pad_to_max_length", "false", flag(&RunConfig::pad_to_max_length)},
      {"data.pad_to_multiple_of", "auto",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         if (n.IsScalar() && n.Scalar() == "auto") {
           c.pad_to_multiple_of = 0;
           return;
         }
         const int64_t v = get<int64_t>(n, k, "auto or a positive integer");
         if (v < 1 || v > (int64_t(1) << 20)) bad_value(k, n, "auto or an integer from 1 to 1048576");
         c.pad_to_multiple_of = v;
       }},
      {"data.blank_images", "false", flag(&RunConfig::blank_images)},
      {"data.allow_outside_image_folder", "false", flag(&RunConfig::allow_outside_image_folder)},
      {"data.max_images_per_sample", "1", i64(&RunConfig::max_images_per_sample, 0)},
      {"data.num_workers", "2", count(&RunConfig::num_workers, 0, kMaxWorkers)},
      {"data.prefetch", "16", count(&RunConfig::prefetch, 0, kMaxPrefetch)},
      {"data.on_bad_sample", "skip", choice(&RunConfig::on_bad_sample, data::parse_on_bad_sample)},
      {"train.on_nonfinite", "stop", choice(&RunConfig::on_nonfinite, parse_on_nonfinite)},
  };
}

// train.*.
std::vector<Key> train_keys() {
  return {
      {"train.stage", "full", choice(&RunConfig::stage, parse_stage)},
      {"train.micro_batch_size", "4",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         c.micro_auto = n.IsScalar() && n.Scalar() == "auto";
         if (!c.micro_auto) i64(&RunConfig::micro_batch_size, 1)(c, n, k);
       }},
      {"train.gradient_accumulation_steps", "1", i64(&RunConfig::gradient_accumulation_steps, 1)},
      {"train.global_batch_size", "0", i64(&RunConfig::global_batch_size, 0)},
      {"train.max_steps", "0", i64(&RunConfig::max_steps, 0)},
      {"train.num_train_epochs", "1",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         c.num_train_epochs = number_in(n, k, 0, kNoLimit, Ends::OpenBelow);
       }},
      {"train.optimizer", "adamw",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         try {
           c.optimizer.kind = optim::parse_optimizer(get<std::string>(n, k, "a string"));
         } catch (const Error&) {
           bad_value(k, n, "one of: adamw, sgd, adafactor");
         }
       }},
      {"train.learning_rate", "0.001", f32(&RunConfig::learning_rate, 0.f)},
      {"train.mm_vision_tower_lr", "0", f32(&RunConfig::vision_lr, 0.f)},
      {"train.mm_projector_lr", "0", f32(&RunConfig::projector_lr, 0.f)},
      // torch.optim's checks: weight_decay >= 0, betas in [0, 1), eps >= 0, momentum >= 0.
      {"train.weight_decay", "0", opt(&optim::OptimizerConfig::weight_decay, 0, kNoLimit)},
      {"train.adam_beta1", "0.9", opt(&optim::OptimizerConfig::beta1, 0, 1, Ends::OpenAbove)},
      {"train.adam_beta2", "0.999", opt(&optim::OptimizerConfig::beta2, 0, 1, Ends::OpenAbove)},
      {"train.adam_epsilon", "1e-8", opt(&optim::OptimizerConfig::eps, 0, kNoLimit)},
      {"train.momentum", "0.9", opt(&optim::OptimizerConfig::momentum, 0, kNoLimit)},
      {"train.lr_scheduler_type", "cosine", choice(&RunConfig::scheduler, optim::parse_schedule)},
      {"train.warmup_ratio", "0", f32(&RunConfig::warmup_ratio, 0.f, 1.0)},
      {"train.warmup_steps", "-1", i64(&RunConfig::warmup_steps, -1)},
      {"train.max_grad_norm", "1.0", f32(&RunConfig::max_grad_norm, 0.f)},
      {"train.eval_steps", "0", i64(&RunConfig::eval_steps, 0)},
      {"train.eval_samples", "0", i64(&RunConfig::eval_samples, 0)},
      {"train.eval_batch_size", "16", i64(&RunConfig::eval_batch_size, 1)},
      {"train.max_new_tokens", "12", i64(&RunConfig::max_new_tokens, 1)},
      {"train.save_steps", "0", i64(&RunConfig::save_steps, 0)},
      {"train.save_total_limit", "2", i64(&RunConfig::save_total_limit, 1)},
      {"train.max_shard_size", "5GB",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         c.max_shard_bytes = parse_bytes(get<std::string>(n, k, "a size"), k);
         if (c.max_shard_bytes == 0) bad_value(k, n, "a positive size such as 5GB or 500MB");
       }},
  };
}

// memory.*, parallel.* and log.*.
std::vector<Key> memory_parallel_log_keys() {
  return {
      {"memory.precision", "fp32", choice(&RunConfig::precision, parse_precision)},
      {"memory.vision_precision", "same",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         const std::string s = get<std::string>(n, k, "a string");
         if (s != "same" && s != "fp32") bad_value(k, n, "one of: same, fp32");
         c.vision_fp32 = s == "fp32";
       }},
      {"memory.gradient_checkpointing.vision", "none", checkpointing(true, false)},
      {"memory.gradient_checkpointing.llm", "none", checkpointing(false, true)},
      {"memory.gradient_checkpointing.every", "1",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         const int64_t v = get<int64_t>(n, k, "an integer");
         if (v < 1 || v > kMaxLayersEvery) bad_value(k, n, str("an integer from 1 to ", kMaxLayersEvery));
         c.vision_ckpt.every = c.llm_ckpt.every = int(v);
       }},
      {"memory.loss_scale.initial", "65536", f32(&RunConfig::loss_scale_initial, 1.f)},
      {"memory.loss_scale.window", "1000", i64(&RunConfig::loss_scale_window, 1)},
      {"memory.loss_scale.hysteresis", "2", count(&RunConfig::loss_scale_hysteresis, 1, kMaxHysteresis)},
      {"memory.loss_scale.min", "1",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         c.loss_scale_min = float(number_in(n, k, 0, kNoLimit, Ends::OpenBelow));
       }},
      // A diverged fp16 run: this many steps in a row skipped on overflow at the minimum scale stop it (0: never).
      {"memory.loss_scale.max_skips_at_min", "2", i64(&RunConfig::loss_scale_max_skips_at_min, 0)},
      {"memory.ce_chunk_rows", "0", i64(&RunConfig::ce_chunk_rows, 0)},
      {"memory.grad_accum_dtype", "auto", choice(&RunConfig::grad_accum, parse_grad_accum)},
      {"memory.leak_window", "50", i64(&RunConfig::leak_window, 2)},
      {"memory.zero_stage", "0",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         const std::string s = get<std::string>(n, k, "a string");
         if (s == "auto")
           c.zero_auto = true;
         else if (s.size() == 1 && s[0] >= '0' && s[0] <= '3')
           c.zero.stage = s[0] - '0', c.zero_auto = false;
         else
           bad_value(k, n, "one of: 0, 1, 2, 3, auto");
       }},
      {"memory.offload_optimizer", "none",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         c.offload_auto = n.IsScalar() && n.Scalar() == "auto";
         if (!c.offload_auto) c.zero.offload_optimizer = parse_offload(n, k);
       }},
      {"memory.budget", "0.95",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         c.budget = get<float>(n, k, "a number");
         if (!(c.budget > 0.f && c.budget <= 1.f)) bad_value(k, n, "a fraction in (0, 1]");
       }},
      {"memory.preflight", "true", flag(&RunConfig::preflight)},
      {"memory.allocator", "caching",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         const std::string s = get<std::string>(n, k, "a string");
         c.allocator_auto = s == "auto";
         if (s == "caching")
           c.allocator = core::AllocatorKind::Caching;
         else if (s == "expandable")
           c.allocator = core::AllocatorKind::Expandable;
         else if (s == "planned" || s == "auto")
           c.allocator = core::AllocatorKind::Planned;
         else
           bad_value(k, n, "one of: caching, expandable, planned, auto");
       }},
      {"memory.on_oom", "fail",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         const std::string s = get<std::string>(n, k, "a string");
         if (s != "fail" && s != "shrink_micro_batch") bad_value(k, n, "one of: fail, shrink_micro_batch");
         c.shrink_on_oom = s == "shrink_micro_batch";
       }},
      {"memory.trace_steps", "[]",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         if (n.IsScalar())
           c.trace_steps = {get<int64_t>(n, k, "a step number or a list of them")};
         else
           c.trace_steps = get<std::vector<int64_t>>(n, k, "a list of step numbers");
         for (int64_t s : c.trace_steps)
           if (s < 1) bad_value(k, n, "a list of step numbers >= 1");
       }},
      {"memory.trace_clock", "time",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         const std::string s = get<std::string>(n, k, "a string");
         if (s != "time" && s != "events") bad_value(k, n, "one of: time, events");
         c.trace_event_clock = s == "events";
       }},
      {"memory.snapshot_on_oom", "false", flag(&RunConfig::snapshot_on_oom)},
      {"memory.offload_params", "none",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) { c.zero.offload_params = parse_offload(n, k); }},
      {"parallel.bucket_size", "25MiB",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         c.zero.bucket_bytes = int64_t(parse_bytes(get<std::string>(n, k, "a size"), k));
         if (c.zero.bucket_bytes <= 0) bad_value(k, n, "a positive size");
       }},
      {"parallel.overlap_comm", "true",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         c.zero.overlap_comm = get<bool>(n, k, "true or false");
       }},
      {"parallel.backend", "nccl",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         const std::string s = get<std::string>(n, k, "a string");
         if (s != "nccl" && s != "mpi") bad_value(k, n, "one of: nccl, mpi");
         c.gpu_collectives_over_mpi = s == "mpi";
       }},
      {"parallel.prefetch_groups", "1",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         c.prefetch_auto = n.IsScalar() && n.Scalar() == "auto";
         if (c.prefetch_auto) return;
         const int64_t v = get<int64_t>(n, k, "a count of groups (0 turns prefetching off) or auto");
         if (v < 0 || v > 8) bad_value(k, n, "a count from 0 to 8");
         c.zero.prefetch_groups = int(v);
       }},
      // PyTorch's init_process_group(timeout=...) and DeepSpeed's: a collective that has not finished after this many
      // seconds ends the job, naming the rank and the collective (a stopped or hung rank).
      {"parallel.timeout", "1800",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         c.collective_timeout_s = number_in(n, k, 0, kNoLimit, Ends::OpenBelow);
       }},
      {"log.logging_steps", "10", i64(&RunConfig::logging_steps, 1)},
      {"log.progress_bar", "auto", choice(&RunConfig::progress_bar, parse_bar)},
      // Hugging Face's key: a name or a list of names of the integrations to report to.
      {"log.report_to", "none",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         std::vector<std::string> names;
         if (n.IsSequence())
           names = get<std::vector<std::string>>(n, k, "a list of names");
         else
           names = {get<std::string>(n, k, "a name or a list of names")};
         c.tensorboard = false;
         for (const std::string& s : names) {
           if (s == "tensorboard" || s == "all")
             c.tensorboard = true;
           else if (s != "none")
             bad_value(k, n, "tensorboard, all, none, or a list of them");
         }
       }},
      {"log.tensorboard_dir", "''", text(&RunConfig::tensorboard_dir)},
  };
}

// lora.*: PEFT's LoraConfig (r, lora_alpha, lora_dropout, target_modules, bias) on the language model.
std::vector<Key> lora_keys() {
  return {
      {"lora.enable", "false", flag(&RunConfig::lora_enable)},
      {"lora.r", "64",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         c.lora.r = get<int64_t>(n, k, "an integer");
         if (c.lora.r < 1) bad_value(k, n, "a rank >= 1");
       }},
      {"lora.alpha", "16",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         c.lora.alpha = float(number_in(n, k, 0, kNoLimit, Ends::OpenBelow));
       }},
      {"lora.dropout", "0.05",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         c.lora.dropout = get<float>(n, k, "a number");
         if (!(c.lora.dropout >= 0.f && c.lora.dropout < 1.f)) bad_value(k, n, "a probability in [0, 1)");
       }},
      // LLaVA's find_all_linear_names: every linear layer of the language model but lm_head.
      {"lora.target_modules", "all-linear",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         const std::vector<std::string> all = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                               "gate_proj", "up_proj", "down_proj"};
         std::vector<std::string> names;
         if (n.IsSequence())
           names = get<std::vector<std::string>>(n, k, "a list of layer names");
         else
           names = {get<std::string>(n, k, "all-linear or a list of layer names")};
         if (names == std::vector<std::string>{"all-linear"}) names = all;
         for (const std::string& s : names)
           if (std::find(all.begin(), all.end(), s) == all.end())
             bad_value(k, n, "all-linear, or a list of: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj");
         c.lora.targets = names;
       }},
      // The language model has no biases: every choice trains the same (PEFT's bias applies to none).
      {"lora.bias", "none",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         const std::string s = get<std::string>(n, k, "a string");
         if (s != "none" && s != "lora_only" && s != "all") bad_value(k, n, "one of: none, lora_only, all");
       }},
      // QLoRA: the decoder layers' frozen linear weights held quantized (bitsandbytes' load_in_8bit / load_in_4bit).
      {"lora.base_bits", "16",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         c.lora.base_bits = get<int>(n, k, "16, 8 or 4");
         if (c.lora.base_bits != 16 && c.lora.base_bits != 8 && c.lora.base_bits != 4) bad_value(k, n, "16, 8 or 4");
       }},
      {"lora.quant_type", "nf4",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         const std::string s = get<std::string>(n, k, "nf4 or fp4");
         if (s != "nf4" && s != "fp4") bad_value(k, n, "nf4 or fp4");
         c.lora.quant_type = core::parse_quant_type(s);
       }},
      {"lora.double_quant", "true",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         c.lora.double_quant = get<bool>(n, k, "true or false");
       }},
  };
}

const std::vector<Key>& schema() {
  static const std::vector<Key> keys = [] {
    std::vector<Key> all;
    for (auto section : {run_device_model_keys, data_keys, train_keys, memory_parallel_log_keys, lora_keys})
      for (Key& k : section()) all.push_back(std::move(k));
    return all;
  }();
  return keys;
}

const Key* find_key(const std::string& path) {
  for (const Key& k : schema())
    if (path == k.path) return &k;
  return nullptr;
}

std::vector<std::string> all_paths() {
  std::vector<std::string> v = {"memory.gradient_checkpointing"};  // also valid as one value for both groups
  for (const Key& k : schema()) v.push_back(k.path);
  return v;
}

// Visits every leaf of `node` outside `model` (the model section has its own parser, except model.weights).
void walk(const YAML::Node& node, const std::string& prefix,
          const std::function<void(const std::string&, const YAML::Node&)>& f) {
  for (const auto& kv : node) {
    const std::string key = prefix.empty() ? kv.first.as<std::string>() : prefix + "." + kv.first.as<std::string>();
    if (key == "model") continue;
    // memory.gradient_checkpointing may be a scalar (both groups) or a map per group.
    if (kv.second.IsMap())
      walk(kv.second, key, f);
    else
      f(key, kv.second);
  }
}

void set_path(YAML::Node root, const std::string& path, const YAML::Node& value) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  for (std::size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', start)) {
    parts.push_back(path.substr(start, dot - start));
    start = dot + 1;
  }
  parts.push_back(path.substr(start));
  std::vector<YAML::Node> chain = {root};
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    YAML::Node next = chain.back()[parts[i]];
    if (!next.IsMap()) {
      chain.back()[parts[i]] = YAML::Node(YAML::NodeType::Map);
      next = chain.back()[parts[i]];
    }
    chain.push_back(next);
  }
  chain.back()[parts.back()] = value;
}

// The node at a dotted path, or an undefined node when any part is missing.
YAML::Node lookup(const YAML::Node& root, const std::string& path) {
  YAML::Node n;
  n.reset(root);  // reset, not assignment: assigning a Node would overwrite the value it refers to
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!n.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    const YAML::Node& cn = n;
    YAML::Node next = cn[part];
    if (!next.IsDefined()) return YAML::Node(YAML::NodeType::Undefined);
    n.reset(next);
    if (dot == std::string::npos) return n;
    start = dot + 1;
  }
}

bool has_path(const YAML::Node& root, const std::string& path) {
  return lookup(root, path).IsDefined();
}

constexpr int64_t kMaxConfigNodes = 100'000;  // a real config has hundreds; aliases can make a tree look endless

// yaml-cpp keeps the first of two equal keys in a mapping and says nothing, so `train:` twice would drop a
// whole section. Every mapping key must be a scalar that appears once; a repeat names both lines. Aliased
// subtrees are visited once per use: the node budget stops an alias bomb before anything copies it.
void check_keys(const YAML::Node& node, const std::string& prefix, const std::string& where, int64_t& budget) {
  HR_CHECK(--budget >= 0, "[config] ", where, ": more than ", kMaxConfigNodes,
           " YAML nodes (aliases nested too deep?)");
  if (node.IsSequence()) {
    for (const YAML::Node& item : node) check_keys(item, prefix, where, budget);
    return;
  }
  if (!node.IsMap()) return;
  std::map<std::string, int> line_of;
  for (const auto& kv : node) {
    const int line = kv.first.Mark().line + 1;
    HR_CHECK(kv.first.IsScalar(), "[config] ", where, ": line ", line, ": a key ",
             prefix.empty() ? std::string("at the top level") : "under '" + prefix + "'", " is not a plain name");
    const std::string key = prefix.empty() ? kv.first.Scalar() : prefix + "." + kv.first.Scalar();
    const auto [seen, fresh] = line_of.emplace(kv.first.Scalar(), line);
    HR_CHECK(fresh, "[config] ", where, ": duplicate key '", key, "' at lines ", seen->second, " and ", line);
    check_keys(kv.second, key, where, budget);
  }
}

const RunConfig& defaults() {
  static const RunConfig c = [] {
    RunConfig d;
    for (const Key& k : schema()) k.set(d, YAML::Load(k.fallback), k.path);
    return d;
  }();
  return c;
}

// The schema's defaults as YAML nodes, in schema order; never handed out uncloned, so never changed.
const std::vector<YAML::Node>& default_nodes() {
  static const std::vector<YAML::Node> nodes = [] {
    std::vector<YAML::Node> n;
    for (const Key& k : schema()) n.push_back(YAML::Load(k.fallback));
    return n;
  }();
  return nodes;
}

// Events of a YAML parse, only to see where each document starts.
struct DocumentStarts : YAML::EventHandler {
  YAML::Mark start;
  void OnDocumentStart(const YAML::Mark& mark) override { start = mark; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// yaml-cpp 0.7 cannot read a ',' (or a flow end) where a document would start, as in "," or "- a\n,": its parser
// reports an empty document there without moving on, and LoadAll collects them until memory runs out. Each
// document must start past the previous one's start; the first that does not is named.
void check_documents_advance(const std::string& yaml, const std::string& where) {
  std::istringstream in(yaml);
  YAML::Parser parser(in);
  DocumentStarts starts;
  int previous = -1;
  while (parser.HandleNextDocument(starts)) {
    HR_CHECK(starts.start.pos > previous, "[config] ", where, ": line ", starts.start.line + 1, ", column ",
             starts.start.column + 1, ": '", yaml.substr(std::size_t(starts.start.pos), 1),
             "' cannot begin a YAML document (a ',' or a closing bracket outside any [...] or {...})");
    previous = starts.start.pos;
  }
}

// The config's one YAML document (an empty text: an empty mapping).
YAML::Node parse_document(const std::string& yaml, const std::string& where) {
  YAML::Node root(YAML::NodeType::Map);
  try {
    check_documents_advance(yaml, where);
    // Every document: yaml-cpp's Load reads the first and drops what follows a '---' line without a word.
    const std::vector<YAML::Node> docs = YAML::LoadAll(yaml);
    for (std::size_t i = 1; i < docs.size(); ++i)
      HR_CHECK(docs[i].IsNull(), "[config] ", where, ": holds ", docs.size(), " YAML documents (document ", i + 1,
               ", after a '---' line, begins at line ", docs[i].Mark().line + 1,
               "); a config is one document and the others would be ignored");
    root = docs.empty() ? YAML::Node() : docs.front();
  } catch (const YAML::Exception& e) {
    throw Error(str("[config] ", where, ": ", e.what()));
  }
  if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  HR_CHECK(root.IsMap(), "[config] ", where, ": the top level must be a mapping of sections");
  return root;
}

// The DeepSpeed JSON a run reads (`deepspeed: FILE` at the top level, taken out of `root`, or the last
// --deepspeed FILE, which wins); empty when none.
std::string take_deepspeed(YAML::Node root, const std::vector<std::string>& overrides) {
  std::string deepspeed;
  if (root["deepspeed"]) {
    deepspeed = get<std::string>(root["deepspeed"], "deepspeed", "a file name");
    root.remove("deepspeed");
  }
  for (const std::string& o : overrides)
    if (o.rfind("deepspeed=", 0) == 0) deepspeed = o.substr(10);
  return deepspeed;
}

// Each --set key=value over `root` (the deepspeed= ones are taken already), its value checked as the file's are.
void apply_overrides(YAML::Node root, const std::vector<std::string>& overrides, int64_t& budget) {
  for (const std::string& o : overrides) {
    if (o.rfind("deepspeed=", 0) == 0) continue;
    const std::size_t eq = o.find('=');
    HR_CHECK(eq != std::string::npos && eq > 0, "[config] --set '", o, "': expected key=value");
    YAML::Node value;
    try {
      value = YAML::Load(o.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      throw Error(str("[config] --set ", o, ": value is not valid YAML: ", e.what()));
    }
    check_keys(value, o.substr(0, eq), "--set " + o, budget);
    set_path(root, o.substr(0, eq), value);
  }
}

void check_sections(const YAML::Node& root, const std::string& where) {
  static const std::vector<std::string> sections = {"run",    "device",   "model", "data", "train",
                                                    "memory", "parallel", "log",   "lora"};
  for (const auto& kv : root) {
    const std::string s = kv.first.as<std::string>();
    if (std::find(sections.begin(), sections.end(), s) == sections.end())
      throw Error(str("[config] ", where, ": unknown section '", s, "'", did_you_mean(s, sections),
                      " (sections: run, device, model, data, train, memory, parallel, log, lora)"));
  }
}

// Every key outside the model section onto `c`; an unknown key names the closest known one.
void set_keys(RunConfig& c, const YAML::Node& root, const std::string& where) {
  const std::vector<std::string> paths = all_paths();
  walk(root, "", [&](const std::string& key, const YAML::Node& value) {
    if (key == "memory.gradient_checkpointing") {  // one policy for both groups
      checkpointing(true, true)(c, value, key);
      return;
    }
    const Key* k = find_key(key);
    if (!k) {
      const std::string close = closest_match(key, paths);
      throw Error(
          str("[config] ", where, ": unknown key '", key, "'", close.empty() ? "" : "; did you mean '" + close + "'?"));
    }
    k->set(c, value, key);
  });
}

// The model section: model.weights and LLaVA's stage-1 projector (loaded over the weights) are the run's; the
// rest is the model's own spec.
void read_model_section(RunConfig& c, const YAML::Node& root, const std::string& where) {
  YAML::Node model = root["model"] ? YAML::Clone(root["model"]) : YAML::Node(YAML::NodeType::Map);
  if (model.IsMap() && model["weights"]) {
    c.init_weights = get<std::string>(model["weights"], "model.weights", "a string");
    model.remove("weights");
  }
  if (model.IsMap() && model["pretrain_mm_mlp_adapter"]) {
    c.projector_weights =
        get<std::string>(model["pretrain_mm_mlp_adapter"], "model.pretrain_mm_mlp_adapter", "a file name");
    model.remove("pretrain_mm_mlp_adapter");
  }
  c.model = models::parse_model_spec(model, where);
}

// The keys whose values are valid alone but not together, then the values that follow from others.
void check_and_derive(RunConfig& c) {
  HR_CHECK(c.loss_scale_min <= c.loss_scale_initial, "[config] memory.loss_scale.min ", c.loss_scale_min,
           " is above memory.loss_scale.initial ", c.loss_scale_initial);
  HR_CHECK(c.lora_enable || !c.lora.quantizes_base(), "[config] lora.base_bits: ", c.lora.base_bits,
           " quantizes the frozen base of a LoRA run; set lora.enable: true (or lora.base_bits: 16)");
  if (c.init_weights.empty()) c.init_weights = c.model.name_or_path;  // a Hugging Face directory's own weights
  if (c.pad_to_multiple_of == 0) c.pad_to_multiple_of = c.device.rfind("cuda", 0) == 0 ? 64 : 1;
  if (c.grad_accum == GradAccum::Auto)
    c.grad_accum = c.precision == Precision::BF16 ? GradAccum::Fp32 : GradAccum::Model;
}

// A global batch given with at most one of micro-batch and accumulation: the other inferred; given with both,
// their product checked.
void infer_from_global(RunConfig& c, const YAML::Node& root, int world_size) {
  const int64_t g = c.global_batch_size, w = world_size;
  if (has_path(root, "train.micro_batch_size") && has_path(root, "train.gradient_accumulation_steps")) {
    HR_CHECK(c.micro_batch_size * c.gradient_accumulation_steps * w == g, "[config] train.global_batch_size ", g,
             " disagrees with micro_batch_size ", c.micro_batch_size, " x gradient_accumulation_steps ",
             c.gradient_accumulation_steps, " x world size ", w);
  } else if (has_path(root, "train.gradient_accumulation_steps")) {
    HR_CHECK(g % (c.gradient_accumulation_steps * w) == 0, "[config] train.global_batch_size ", g,
             " is not a multiple of gradient_accumulation_steps x world size ", c.gradient_accumulation_steps * w);
    c.micro_batch_size = g / (c.gradient_accumulation_steps * w);
  } else {
    HR_CHECK(g % (c.micro_batch_size * w) == 0, "[config] train.global_batch_size ", g,
             " is not a multiple of micro_batch_size x world size ", c.micro_batch_size * w);
    c.gradient_accumulation_steps = g / (c.micro_batch_size * w);
  }
}

// Global batch = micro x accumulation x world size: infer one from the other two, refuse a contradiction.
void resolve_batch(RunConfig& c, const YAML::Node& root, int world_size) {
  check_batch_bounds(c, world_size);  // the given values, before they are multiplied below
  if (c.micro_auto) {                 // the planner picks micro and accumulation for the global batch
    HR_CHECK(c.global_batch_size > 0, "[config] train.micro_batch_size: auto needs train.global_batch_size");
    HR_CHECK(c.global_batch_size % world_size == 0, "[config] train.global_batch_size ", c.global_batch_size,
             " is not a multiple of the world size ", world_size);
    c.micro_batch_size = 1;
    c.gradient_accumulation_steps = c.global_batch_size / world_size;
  } else if (c.global_batch_size > 0) {
    infer_from_global(c, root, world_size);
  }
  check_batch_bounds(c, world_size);
  c.global_batch_size = c.micro_batch_size * c.gradient_accumulation_steps * world_size;
}

// The resolved configuration: every key with its value (given or default), the derived ones as resolved.
std::string resolved_yaml(const RunConfig& c, const YAML::Node& root) {
  YAML::Node resolved(YAML::NodeType::Map);
  for (std::size_t i = 0; i < schema().size(); ++i) {
    const Key& k = schema()[i];
    YAML::Node given = lookup(root, k.path);
    set_path(resolved, k.path, given.IsDefined() ? given : YAML::Clone(default_nodes()[i]));
  }
  set_path(resolved, "memory.gradient_checkpointing.vision", YAML::Node(models::checkpoint_name(c.vision_ckpt.kind)));
  set_path(resolved, "memory.gradient_checkpointing.llm", YAML::Node(models::checkpoint_name(c.llm_ckpt.kind)));
  set_path(resolved, "train.global_batch_size", YAML::Node(c.global_batch_size));
  set_path(resolved, "data.pad_to_multiple_of", YAML::Node(c.pad_to_multiple_of));
  set_path(resolved, "memory.grad_accum_dtype", YAML::Node(c.grad_accum == GradAccum::Fp32 ? "fp32" : "model"));
  set_path(resolved, "train.micro_batch_size", YAML::Node(c.micro_batch_size));
  set_path(resolved, "train.gradient_accumulation_steps", YAML::Node(c.gradient_accumulation_steps));
  if (root["model"]) resolved["model"] = YAML::Clone(root["model"]);
  resolved["model"]["weights"] = c.init_weights;
  return YAML::Dump(resolved) + "\n";
}

}  // namespace

std::vector<std::string> config_keys() {
  std::vector<std::string> keys;
  for (const Key& k : schema()) keys.push_back(k.path);
  return keys;
}

const char* precision_name(Precision p) {
  return p == Precision::FP32 ? "fp32" : p == Precision::BF16 ? "bf16" : "fp16";
}
const char* stage_name(Stage s) {
  return s == Stage::Pretrain ? "pretrain" : s == Stage::Finetune ? "finetune" : "full";
}

RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides, int world_size) {
  if (path.empty()) return load_config_text("", "(defaults)", overrides, world_size);
  return load_config_text(core::read_text_file(path, "config"), path, overrides, world_size);
}

RunConfig load_config_text(const std::string& yaml, const std::string& where, const std::vector<std::string>& overrides,
                           int world_size) {
  YAML::Node root = parse_document(yaml, where);
  int64_t budget = kMaxConfigNodes;
  check_keys(root, "", where, budget);
  // DeepSpeed JSON: its keys land on headroom's before the --set overrides, which still win.
  const std::string deepspeed = take_deepspeed(root, overrides);
  DeepSpeedConfig ds;
  if (!deepspeed.empty()) {
    ds = read_deepspeed(deepspeed, world_size);
    for (const auto& [key, value] : ds.sets) set_path(root, key, YAML::Load(value));
  }
  apply_overrides(root, overrides, budget);
  check_sections(root, where);
  // Defaults first (parsed once per process), then what the file and overrides say.
  RunConfig c = defaults();
  c.deepspeed = deepspeed;
  c.deepspeed_not_acted_on = ds.not_acted_on;
  set_keys(c, root, where);
  read_model_section(c, root, where);
  check_and_derive(c);
  resolve_batch(c, root, world_size);
  c.resolved_yaml = resolved_yaml(c, root);
  return c;
}

}  // namespace hr::train
