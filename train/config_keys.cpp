// The run configuration's keys: every YAML key below `model` with its default and its setter, which checks the
// value and names the key when it is wrong.
#include "train/config_keys.h"

#include <cmath>
#include <limits>

#include "core/check.h"

namespace hr::train::key_schema {

void bad_value(const std::string& key, const YAML::Node& n, const std::string& want) {
  throw Error(str("[config] ", key, ": '", YAML::Dump(n), "' is not ", want));
}

namespace {

// Bounds of the counts held as ints: beyond them a machine cannot run the count (libgomp segfaults at 100,000
// threads, 40,000 loader threads end in std::terminate) and a 64-bit value would wrap.
constexpr int64_t kMaxThreads = 1024, kMaxWorkers = 256, kMaxPrefetch = 1 << 20, kMaxHysteresis = 1 << 20,
                  kMaxLayersEvery = 1 << 20;

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
PaddingFree parse_padding_free(const std::string& s) {
  if (s == "auto") return PaddingFree::Auto;
  if (s == "true" || s == "on") return PaddingFree::On;
  if (s == "false" || s == "off") return PaddingFree::Off;
  throw Error("'" + s + "' is not one of: auto, true, false");
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
      // square: every image image_size x image_size; mixed: 1:1, 2:1, 1:2, 3:1, 1:3, 3:2 and 2:3 (AnyRes's inputs);
      // tall or wide: those of the mixed ratios
      {"data.synthetic.aspect", "square",
       [](RunConfig& c, const YAML::Node& n, const std::string& k) {
         const std::string s = get<std::string>(n, k, "a string");
         if (s != "square" && s != "mixed" && s != "tall" && s != "wide")
           bad_value(k, n, "one of: square, mixed, tall, wide");
         c.synth_aspect = data::parse_synth_aspect(s, k);
       }},
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
      {"data.max_image_tokens", "0", i64(&RunConfig::max_image_tokens, 0)},
      {"data.num_workers", "2", count(&RunConfig::num_workers, 0, kMaxWorkers)},
      {"data.prefetch", "16", count(&RunConfig::prefetch, 0, kMaxPrefetch)},
      {"data.on_bad_sample", "skip", choice(&RunConfig::on_bad_sample, data::parse_on_bad_sample)},
      {"train.on_nonfinite", "stop", choice(&RunConfig::on_nonfinite, parse_on_nonfinite)},
      {"train.padding_free", "auto", choice(&RunConfig::padding_free, parse_padding_free)},
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
         const std::string s = get<std::string>(n, k, "a string");
         c.optimizer_auto = s == "auto";
         try {
           c.optimizer.kind = c.optimizer_auto ? optim::OptimizerKind::AdamW : optim::parse_optimizer(s);
         } catch (const Error&) {
           bad_value(k, n, "one of: adamw, sgd, adafactor, adamw_8bit, auto");
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
      {"memory.offload_activations.vision", "none", activation_offload(true, false)},
      {"memory.offload_activations.llm", "none", activation_offload(false, true)},
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
      {"memory.allocator", "auto",
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

}  // namespace

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

Setter activation_offload(bool vision, bool llm) {
  return [=](RunConfig& c, const YAML::Node& n, const std::string& key) {
    const std::string s = get<std::string>(n, key, "a string");
    const bool auto_ = s == "auto";
    if (!auto_ && s != "none" && s != "false" && s != "cpu") bad_value(key, n, "one of: none, cpu, auto");
    const bool on = s == "cpu";
    if (vision) c.vision_ckpt.offload = on, c.vision_act_offload_auto = auto_;
    if (llm) c.llm_ckpt.offload = on, c.llm_act_offload_auto = auto_;
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
  // Also valid as one value for both groups.
  std::vector<std::string> v = {"memory.gradient_checkpointing", "memory.offload_activations"};
  for (const Key& k : schema()) v.push_back(k.path);
  return v;
}

}  // namespace hr::train::key_schema
