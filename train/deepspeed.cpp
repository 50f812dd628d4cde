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
  void walk(const json& obj, const std::string& prefix,
            const std::map<std::string, std::function<void(const json&, const std::string&)>>& keys) {
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

  std::function<void(const json&, const std::string&)> ignored() {
    return [this](const json&, const std::string& key) { ignore(key); };
  }
  // "auto" keeps headroom's value; otherwise `apply` maps the value.
  std::function<void(const json&, const std::string&)> unless_auto(
      std::function<void(const json&, const std::string&)> apply) {
    return [apply](const json& v, const std::string& key) {
      if (!is_auto(v)) apply(v, key);
    };
  }

  void offload(const json& v, const std::string& key, const char* target) {
    walk(v, key,
         {{"device",
           [&](const json& d, const std::string& k) {
             const std::string dev = d.is_string() ? d.get<std::string>() : "";
             if (dev == "cpu" || dev == "none")
               set(target, dev);
             else if (dev == "nvme")
               fail(k, "NVMe offload is not supported (headroom offloads to host memory: \"cpu\")");
             else
               fail(k, str("expected \"cpu\", \"none\" or \"nvme\"; got ", d.dump()));
           }},
          {"pin_memory", ignored()},
          {"nvme_path", ignored()},
          {"buffer_count", ignored()},
          {"buffer_size", ignored()},
          {"max_in_cpu", ignored()},
          {"fast_init", ignored()},
          {"ratio", ignored()}});
  }

  void read(const json& root) {
    json batch = json::object();  // the triplet, as given
    int bf16 = -1, fp16 = -1;     // enabled: -1 auto (or absent), 0 false, 1 true
    walk(
        root, "",
        {{"train_batch_size",
          [&](const json& v, const std::string& k) {
            batch["global"] = v;
            if (!is_auto(v)) set("train.global_batch_size", std::to_string(integer(v, k)));
          }},
         {"train_micro_batch_size_per_gpu",
          [&](const json& v, const std::string& k) {
            batch["micro"] = v;
            if (!is_auto(v)) set("train.micro_batch_size", std::to_string(integer(v, k)));
          }},
         {"gradient_accumulation_steps",
          [&](const json& v, const std::string& k) {
            batch["accumulation"] = v;
            if (!is_auto(v)) set("train.gradient_accumulation_steps", std::to_string(integer(v, k)));
          }},
         {"gradient_clipping", unless_auto([&](const json& v, const std::string& k) {
            set("train.max_grad_norm", json(number(v, k)).dump());
          })},
         {"bf16",
          [&](const json& v, const std::string& k) {
            walk(
                v, k,
                {{"enabled", unless_auto([&](const json& e, const std::string& kk) { bf16 = boolean(e, kk) ? 1 : 0; })},
                 {"immediate_grad_update", ignored()}});
          }},
         {"fp16",
          [&](const json& v, const std::string& k) {
            walk(
                v, k,
                {{"enabled", unless_auto([&](const json& e, const std::string& kk) { fp16 = boolean(e, kk) ? 1 : 0; })},
                 {"auto_cast", ignored()},
                 {"loss_scale", unless_auto([&](const json& e, const std::string& kk) {
                    if (number(e, kk) != 0) fail(kk, "a static loss scale is not supported; 0 (dynamic) is");
                  })},
                 {"initial_scale_power", unless_auto([&](const json& e, const std::string& kk) {
                    // 2^power must be a finite f32 (the scale is one): at most 2^127.
                    set("memory.loss_scale.initial", json(std::ldexp(1.0, int(integer(e, kk, 0, 127)))).dump());
                  })},
                 {"loss_scale_window", unless_auto([&](const json& e, const std::string& kk) {
                    set("memory.loss_scale.window", std::to_string(integer(e, kk)));
                  })},
                 {"hysteresis", unless_auto([&](const json& e, const std::string& kk) {
                    set("memory.loss_scale.hysteresis", std::to_string(integer(e, kk)));
                  })},
                 {"consecutive_hysteresis", ignored()},
                 {"min_loss_scale", unless_auto([&](const json& e, const std::string& kk) {
                    set("memory.loss_scale.min", json(number(e, kk)).dump());
                  })}});
          }},
         {"data_types",
          [&](const json& v, const std::string& k) {
            walk(v, k, {{"grad_accum_dtype", unless_auto([&](const json& e, const std::string& kk) {
                           const std::string t = e.is_string() ? e.get<std::string>() : e.dump();
                           if (t == "fp32")
                             set("memory.grad_accum_dtype", "fp32");
                           else if (t == "bf16" || t == "fp16")
                             set("memory.grad_accum_dtype", "model");  // the 16-bit precision's own
                           else
                             fail(kk, str("expected fp32, bf16 or fp16; got ", e.dump()));
                         })}});
          }},
         {"zero_optimization",
          [&](const json& v, const std::string& k) {
            walk(v, k,
                 {{"stage",
                   [&](const json& s, const std::string& kk) {
                     const int64_t stage = integer(s, kk);
                     if (stage < 0 || stage > 3) fail(kk, str("expected 0 to 3; got ", stage));
                     set("memory.zero_stage", std::to_string(stage));
                   }},
                  {"offload_optimizer",
                   [&](const json& o, const std::string& kk) { offload(o, kk, "memory.offload_optimizer"); }},
                  {"offload_param",
                   [&](const json& o, const std::string& kk) { offload(o, kk, "memory.offload_params"); }},
                  {"reduce_bucket_size", unless_auto([&](const json& b, const std::string& kk) {
                     // DeepSpeed counts elements; headroom's buckets are bytes of f32 gradients.
                     set("parallel.bucket_size", std::to_string(integer(b, kk, 1, kMaxInteger / 4) * 4));
                   })},
                  {"allgather_bucket_size", ignored()},
                  {"allgather_partitions", ignored()},
                  {"reduce_scatter", ignored()},
                  {"overlap_comm",
                   [&](const json& b, const std::string& kk) {
                     if (!b.is_boolean()) fail(kk, str("expected true or false; got ", b.dump()));
                     set("parallel.overlap_comm", b.get<bool>() ? "true" : "false");
                   }},
                  {"contiguous_gradients", ignored()},
                  {"sub_group_size", ignored()},
                  {"round_robin_gradients", ignored()},
                  {"stage3_prefetch_bucket_size", ignored()},
                  {"stage3_param_persistence_threshold", ignored()},
                  {"stage3_max_live_parameters", ignored()},
                  {"stage3_max_reuse_distance", ignored()},
                  {"stage3_gather_16bit_weights_on_model_save", ignored()},
                  {"gather_16bit_weights_on_model_save", ignored()},
                  {"ignore_unused_parameters", ignored()},
                  {"elastic_checkpoint", ignored()},
                  {"load_from_fp32_weights", ignored()}});
          }},
         {"optimizer",
          [&](const json& v, const std::string& k) {
            walk(v, k,
                 {{"type",
                   [&](const json& t, const std::string& kk) {
                     const std::string type = t.is_string() ? t.get<std::string>() : t.dump();
                     if (type == "AdamW" || type == "Adam")
                       set("train.optimizer", "adamw");
                     else
                       fail(kk, str("optimizer '", type,
                                    "' is not supported here (AdamW is; headroom's SGD and "
                                    "Adafactor are chosen with train.optimizer)"));
                   }},
                  {"params", [&](const json& p, const std::string& kk) {
                     walk(p, kk,
                          {{"lr", unless_auto([&](const json& x, const std::string& q) {
                              set("train.learning_rate", json(number(x, q)).dump());
                            })},
                           {"weight_decay", unless_auto([&](const json& x, const std::string& q) {
                              set("train.weight_decay", json(number(x, q)).dump());
                            })},
                           {"eps", unless_auto([&](const json& x, const std::string& q) {
                              set("train.adam_epsilon", json(number(x, q)).dump());
                            })},
                           {"betas", unless_auto([&](const json& x, const std::string& q) {
                              if (!x.is_array() || x.size() != 2)
                                fail(q, str("expected [beta1, beta2]; got ", x.dump()));
                              set("train.adam_beta1", json(number(x[0], q)).dump());
                              set("train.adam_beta2", json(number(x[1], q)).dump());
                            })},
                           {"torch_adam", ignored()},
                           {"adam_w_mode", ignored()}});
                   }}});
          }},
         {"scheduler",
          [&](const json& v, const std::string& k) {
            walk(v, k,
                 {{"type",
                   [&](const json& t, const std::string& kk) {
                     const std::string type = t.is_string() ? t.get<std::string>() : t.dump();
                     if (type == "WarmupLR")
                       set("train.lr_scheduler_type", "constant");
                     else if (type == "WarmupDecayLR")
                       set("train.lr_scheduler_type", "linear");
                     else if (type == "WarmupCosineLR")
                       set("train.lr_scheduler_type", "cosine");
                     else
                       fail(kk, str("scheduler '", type,
                                    "' is not supported (WarmupLR, WarmupDecayLR and "
                                    "WarmupCosineLR are: warmup, then constant, linear or cosine)"));
                   }},
                  {"params", [&](const json& p, const std::string& kk) {
                     walk(p, kk,
                          {{"warmup_num_steps", unless_auto([&](const json& x, const std::string& q) {
                              set("train.warmup_steps", std::to_string(integer(x, q)));
                            })},
                           {"warmup_max_lr", unless_auto([&](const json& x, const std::string& q) {
                              set("train.learning_rate", json(number(x, q)).dump());
                            })},
                           {"warmup_min_lr", unless_auto([&](const json& x, const std::string& q) {
                              if (number(x, q) != 0)
                                fail(q, "warmup from a learning rate other than 0 is not supported");
                            })},
                           {"total_num_steps", unless_auto([&](const json& x, const std::string& q) {
                              set("train.max_steps", std::to_string(integer(x, q)));
                            })},
                           {"warmup_type", ignored()},
                           {"cos_min_ratio", ignored()},
                           {"warmup_min_ratio", ignored()}});
                   }}});
          }},
         {"steps_per_print", ignored()},
         {"wall_clock_breakdown", ignored()},
         {"zero_allow_untested_optimizer", ignored()},
         {"prescale_gradients", ignored()},
         {"gradient_predivide_factor", ignored()},
         {"communication_data_type", ignored()},
         {"activation_checkpointing", ignored()},
         {"flops_profiler", ignored()},
         {"tensorboard", ignored()},
         {"wandb", ignored()},
         {"memory_breakdown", ignored()},
         {"dump_state", ignored()}});
    if (bf16 == 1 && fp16 == 1) fail("bf16.enabled", "and fp16.enabled are both true; choose one");
    if (bf16 == 1) set("memory.precision", "bf16");
    if (fp16 == 1) set("memory.precision", "fp16");
    if (bf16 == 0 && fp16 == 0) set("memory.precision", "fp32");  // both off: full precision, as in DeepSpeed
    // DeepSpeed's rule: train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps * world.
    if (batch.size() == 3 && !is_auto(batch["global"]) && !is_auto(batch["micro"]) && !is_auto(batch["accumulation"])) {
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
  }
};

}  // namespace

DeepSpeedConfig read_deepspeed(const std::string& path, int world_size) {
  const std::string text = core::read_text_file(path, "deepspeed", "--deepspeed");
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(str("[deepspeed] ", path, ": not valid JSON: ", e.what()));
  }
  Reader r{path, world_size, {}};
  r.read(root);
  return std::move(r.out);
}

}  // namespace hr::train
