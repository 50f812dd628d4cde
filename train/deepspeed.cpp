// DeepSpeed JSON keys and what each becomes in headroom's config.
#include "train/deepspeed.h"

#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/io/text_file.h"
#include "core/suggest.h"

namespace hr::train {

namespace {

using json = nlohmann::json;

bool is_auto(const json& v) {
  return v.is_string() && v.get<std::string>() == "auto";
}

struct Reader {
  std::string path;
  int world = 1;
  DeepSpeedConfig out;
  // What is settled only once every key is read: the batch triplet as given (global, micro, accumulation), for
  // the check of their product, and whether bf16 and fp16 are enabled (-1 auto or absent, 0 false, 1 true).
  json batch = json::object();
  int bf16 = -1, fp16 = -1;

  // What a key's value becomes (the value and the key's full dotted name), by key.
  using Handler = std::function<void(const json&, const std::string&)>;
  using Keys = std::map<std::string, Handler>;

  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    throw Error(str("[deepspeed] ", path, ": ", key, ": ", why));
  }
  void set(const std::string& key, const std::string& value) { out.sets.emplace_back(key, value); }
  void ignore(const std::string& key) { out.not_acted_on.push_back(key); }

  double number(const json& v, const std::string& key) const {
    if (v.is_number() && std::isfinite(v.get<double>())) return v.get<double>();
    fail(key, str("expected a number or \"auto\"; got ", v.dump()));
  }
  // A whole number in [lo, hi]: 1e30 or 3e18 would not survive the conversion (or the scaling after it) and reach
  // headroom's keys as garbage.
  int64_t integer(const json& v, const std::string& key, int64_t lo = 0, int64_t hi = kMaxInteger) const {
    const double d = number(v, key);
    if (d != std::floor(d)) fail(key, str("expected a whole number; got ", v.dump()));
    if (d < double(lo) || d > double(hi)) fail(key, str(v.dump(), " is outside [", lo, ", ", hi, "]"));
    return v.is_number_integer() ? v.get<int64_t>() : int64_t(d);
  }
  static constexpr int64_t kMaxInteger = int64_t(1) << 53;  // exact in a double, and far past any real count
  bool boolean(const json& v, const std::string& key) const {
    if (v.is_boolean()) return v.get<bool>();
    fail(key, str("expected true, false or \"auto\"; got ", v.dump()));
  }

  // Walks an object: each key to its handler, unknown keys an error naming the closest known one.
  void walk(const json& obj, const std::string& prefix, const Keys& keys) {
    if (!obj.is_object()) fail(prefix.empty() ? "(top level)" : prefix, "expected an object");
    std::vector<std::string> names;
    for (const auto& [k, h] : keys) names.push_back(k);
    for (const auto& [k, v] : obj.items()) {
      const std::string full = prefix.empty() ? k : prefix + "." + k;
      auto it = keys.find(k);
      if (it == keys.end()) {
        const std::string close = closest_match(k, names);
        fail(full, str("unknown DeepSpeed key", close.empty() ? std::string() : str("; did you mean '", close, "'?")));
      }
      it->second(v, full);
    }
  }

  Handler ignored() {
    return [this](const json&, const std::string& key) { ignore(key); };
  }
  // `keys`, and `names` taken without being acted on (each listed in not_acted_on).
  Keys with_ignored(Keys keys, std::initializer_list<const char*> names) {
    for (const char* n : names) keys.emplace(n, ignored());
    return keys;
  }
  // "auto" keeps headroom's value; otherwise `apply` maps the value.
  static Handler unless_auto(Handler apply) {
    return [apply](const json& v, const std::string& key) {
      if (!is_auto(v)) apply(v, key);
    };
  }
  // A number (an integer) that becomes headroom's key `target` as it is, unless "auto".
  Handler number_to(const char* target) {
    return unless_auto([this, target](const json& v, const std::string& k) { set(target, json(number(v, k)).dump()); });
  }
  Handler integer_to(const char* target) {
    return unless_auto(
        [this, target](const json& v, const std::string& k) { set(target, std::to_string(integer(v, k))); });
  }
  // A section read by one of the members below.
  Handler section(void (Reader::*read_section)(const json&, const std::string&)) {
    return [this, read_section](const json& v, const std::string& k) { (this->*read_section)(v, k); };
  }

  // A key of the triplet: kept for that check, and headroom's `target` unless "auto".
  Handler batch_key(const char* slot, const char* target) {
    return [this, slot, target](const json& v, const std::string& k) {
      batch[slot] = v;
      if (!is_auto(v)) set(target, std::to_string(integer(v, k)));
    };
  }

  void bf16_section(const json& v, const std::string& k) {
    walk(v, k,
         with_ignored({{"enabled",
                        unless_auto([this](const json& e, const std::string& kk) { bf16 = boolean(e, kk) ? 1 : 0; })}},
                      {"immediate_grad_update"}));
  }

  void fp16_section(const json& v, const std::string& k) {
    walk(v, k,
         with_ignored(
             {{"enabled", unless_auto([this](const json& e, const std::string& kk) { fp16 = boolean(e, kk) ? 1 : 0; })},
              {"loss_scale", unless_auto([this](const json& e, const std::string& kk) {
                 if (number(e, kk) != 0) fail(kk, "a static loss scale is not supported; 0 (dynamic) is");
               })},
              {"initial_scale_power", unless_auto([this](const json& e, const std::string& kk) {
                 // 2^power must be a finite f32 (the scale is one): at most 2^127.
                 set("memory.loss_scale.initial", json(std::ldexp(1.0, int(integer(e, kk, 0, 127)))).dump());
               })},
              {"loss_scale_window", integer_to("memory.loss_scale.window")},
              {"hysteresis", integer_to("memory.loss_scale.hysteresis")},
              {"min_loss_scale", number_to("memory.loss_scale.min")}},
             {"auto_cast", "consecutive_hysteresis"}));
  }

  void data_types(const json& v, const std::string& k) {
    walk(v, k, {{"grad_accum_dtype", unless_auto([this](const json& e, const std::string& kk) {
                   const std::string t = e.is_string() ? e.get<std::string>() : e.dump();
                   if (t == "fp32")
                     set("memory.grad_accum_dtype", "fp32");
                   else if (t == "bf16" || t == "fp16")
                     set("memory.grad_accum_dtype", "model");  // the 16-bit precision's own
                   else
                     fail(kk, str("expected fp32, bf16 or fp16; got ", e.dump()));
                 })}});
  }

  // activation_checkpointing.cpu_checkpointing: the checkpoints on the host (the checkpointing itself is the
  // model's: memory.gradient_checkpointing).
  void activation_checkpointing(const json& v, const std::string& k) {
    walk(v, k,
         with_ignored({{"cpu_checkpointing", unless_auto([this](const json& e, const std::string& kk) {
                          set("memory.offload_activations", boolean(e, kk) ? "cpu" : "none");
                        })}},
                      {"partition_activations", "contiguous_memory_optimization", "number_checkpoints",
                       "synchronize_checkpoint_boundary", "profile"}));
  }

  void offload(const json& v, const std::string& key, const char* target) {
    walk(v, key,
         with_ignored({{"device",
                        [this, target](const json& d, const std::string& k) {
                          const std::string dev = d.is_string() ? d.get<std::string>() : "";
                          if (dev == "cpu" || dev == "none")
                            set(target, dev);
                          else if (dev == "nvme")
                            fail(k, "NVMe offload is not supported (headroom offloads to host memory: \"cpu\")");
                          else
                            fail(k, str("expected \"cpu\", \"none\" or \"nvme\"; got ", d.dump()));
                        }}},
                      {"pin_memory", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "fast_init", "ratio"}));
  }

  void zero_optimization(const json& v, const std::string& k) {
    walk(v, k,
         with_ignored({{"stage",
                        [this](const json& s, const std::string& kk) {
                          const int64_t stage = integer(s, kk);
                          if (stage < 0 || stage > 3) fail(kk, str("expected 0 to 3; got ", stage));
                          set("memory.zero_stage", std::to_string(stage));
                        }},
                       {"offload_optimizer",
                        [this](const json& o, const std::string& kk) { offload(o, kk, "memory.offload_optimizer"); }},
                       {"offload_param",
                        [this](const json& o, const std::string& kk) { offload(o, kk, "memory.offload_params"); }},
                       {"reduce_bucket_size", unless_auto([this](const json& b, const std::string& kk) {
                          // DeepSpeed counts elements; headroom's buckets are bytes of f32 gradients.
                          set("parallel.bucket_size", std::to_string(integer(b, kk, 1, kMaxInteger / 4) * 4));
                        })},
                       {"overlap_comm",
                        [this](const json& b, const std::string& kk) {
                          if (!b.is_boolean()) fail(kk, str("expected true or false; got ", b.dump()));
                          set("parallel.overlap_comm", b.get<bool>() ? "true" : "false");
                        }}},
                      {"allgather_bucket_size", "allgather_partitions", "reduce_scatter", "contiguous_gradients",
                       "sub_group_size", "round_robin_gradients", "stage3_prefetch_bucket_size",
                       "stage3_param_persistence_threshold", "stage3_max_live_parameters", "stage3_max_reuse_distance",
                       "stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
                       "ignore_unused_parameters", "elastic_checkpoint", "load_from_fp32_weights"}));
  }

  void optimizer_type(const json& t, const std::string& k) {
    const std::string type = t.is_string() ? t.get<std::string>() : t.dump();
    if (type == "AdamW" || type == "Adam")
      set("train.optimizer", "adamw");
    else
      fail(k, str("optimizer '", type,
                  "' is not supported here (AdamW is; headroom's SGD and "
                  "Adafactor are chosen with train.optimizer)"));
  }

  void optimizer_params(const json& p, const std::string& k) {
    walk(p, k,
         with_ignored({{"lr", number_to("train.learning_rate")},
                       {"weight_decay", number_to("train.weight_decay")},
                       {"eps", number_to("train.adam_epsilon")},
                       {"betas", unless_auto([this](const json& x, const std::string& q) {
                          if (!x.is_array() || x.size() != 2) fail(q, str("expected [beta1, beta2]; got ", x.dump()));
                          set("train.adam_beta1", json(number(x[0], q)).dump());
                          set("train.adam_beta2", json(number(x[1], q)).dump());
                        })}},
                      {"torch_adam", "adam_w_mode"}));
  }

  void optimizer(const json& v, const std::string& k) {
    walk(v, k, {{"type", section(&Reader::optimizer_type)}, {"params", section(&Reader::optimizer_params)}});
  }

  void scheduler_type(const json& t, const std::string& k) {
    const std::string type = t.is_string() ? t.get<std::string>() : t.dump();
    if (type == "WarmupLR")
      set("train.lr_scheduler_type", "constant");
    else if (type == "WarmupDecayLR")
      set("train.lr_scheduler_type", "linear");
    else if (type == "WarmupCosineLR")
      set("train.lr_scheduler_type", "cosine");
    else
      fail(k, str("scheduler '", type,
                  "' is not supported (WarmupLR, WarmupDecayLR and "
                  "WarmupCosineLR are: warmup, then constant, linear or cosine)"));
  }

  void scheduler_params(const json& p, const std::string& k) {
    walk(p, k,
         with_ignored({{"warmup_num_steps", integer_to("train.warmup_steps")},
                       {"warmup_max_lr", number_to("train.learning_rate")},
                       {"warmup_min_lr", unless_auto([this](const json& x, const std::string& q) {
                          if (number(x, q) != 0) fail(q, "warmup from a learning rate other than 0 is not supported");
                        })},
                       {"total_num_steps", integer_to("train.max_steps")}},
                      {"warmup_type", "cos_min_ratio", "warmup_min_ratio"}));
  }

  void scheduler(const json& v, const std::string& k) {
    walk(v, k, {{"type", section(&Reader::scheduler_type)}, {"params", section(&Reader::scheduler_params)}});
  }

  // bf16.enabled and fp16.enabled as memory.precision: one of them, or fp32 when both are off (as in DeepSpeed).
  void set_precision() {
    if (bf16 == 1 && fp16 == 1) fail("bf16.enabled", "and fp16.enabled are both true; choose one");
    if (bf16 == 1) set("memory.precision", "bf16");
    if (fp16 == 1) set("memory.precision", "fp16");
    if (bf16 == 0 && fp16 == 0) set("memory.precision", "fp32");
  }

  // DeepSpeed's rule: train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps * world.
  void check_batch() const {
    if (batch.size() != 3 || is_auto(batch["global"]) || is_auto(batch["micro"]) || is_auto(batch["accumulation"]))
      return;
    const int64_t g = integer(batch["global"], "train_batch_size"),
                  m = integer(batch["micro"], "train_micro_batch_size_per_gpu"),
                  a = integer(batch["accumulation"], "gradient_accumulation_steps");
    int64_t product = 0;
    if (__builtin_mul_overflow(m, a, &product) || __builtin_mul_overflow(product, int64_t(world), &product) ||
        g != product)
      throw Error(str("[deepspeed] ", path,
                      ": Check batch related parameters. train_batch_size is not equal to "
                      "micro_batch_per_gpu * gradient_acc_step * world_size ",
                      g, " != ", m, " * ", a, " * ", world));
  }

  void read(const json& root) {
    walk(root, "",
         with_ignored({{"train_batch_size", batch_key("global", "train.global_batch_size")},
                       {"train_micro_batch_size_per_gpu", batch_key("micro", "train.micro_batch_size")},
                       {"gradient_accumulation_steps", batch_key("accumulation", "train.gradient_accumulation_steps")},
                       {"gradient_clipping", number_to("train.max_grad_norm")},
                       {"bf16", section(&Reader::bf16_section)},
                       {"fp16", section(&Reader::fp16_section)},
                       {"data_types", section(&Reader::data_types)},
                       {"zero_optimization", section(&Reader::zero_optimization)},
                       {"optimizer", section(&Reader::optimizer)},
                       {"scheduler", section(&Reader::scheduler)},
                       {"activation_checkpointing", section(&Reader::activation_checkpointing)}},
                      {"steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer", "prescale_gradients",
                       "gradient_predivide_factor", "communication_data_type", "flops_profiler", "tensorboard", "wandb",
                       "memory_breakdown", "dump_state"}));
    set_precision();
    check_batch();
  }
};

}  // namespace

DeepSpeedConfig read_deepspeed(const std::string& path, int world_size) {
  return deepspeed_from_text(core::read_text_file(path, "deepspeed", "--deepspeed"), path, world_size);
}

DeepSpeedConfig deepspeed_from_text(const std::string& text, const std::string& name, int world_size) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(str("[deepspeed] ", name, ": not valid JSON: ", e.what()));
  }
  Reader r{name, world_size, {}};
  r.read(root);
  return std::move(r.out);
}

}  // namespace hr::train
