// Fuzzes the config's values, key by key: each NUL-separated record of the input is one `--set KEY=VALUE`, its first
// byte choosing KEY among every key of the schema and the model section's sizes, the rest being VALUE (numbers at
// and past every bound, .nan, .inf, 4294967297, 1e300, ...). A config that loads must hold what the rest of headroom
// assumes of it: counts within their bounds, finite rates and epsilons, betas below 1, model sizes whose bytes fit
// in 64 bits. A value that breaks one of these and still loads is a finding (trap), as is any exception but
// hr::Error.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "train/config.h"

using namespace hr;

namespace {

std::vector<std::string> fuzzed_keys() {
  std::vector<std::string> keys = train::config_keys();
  for (const char* k :
       {"model.llm.vocab_size", "model.llm.hidden_size", "model.llm.num_hidden_layers", "model.llm.num_attention_heads",
        "model.llm.num_key_value_heads", "model.llm.intermediate_size", "model.llm.rms_norm_eps",
        "model.llm.rope_theta", "model.vision.hidden_size", "model.vision.num_hidden_layers",
        "model.vision.num_attention_heads", "model.vision.intermediate_size", "model.vision.image_size",
        "model.vision.patch_size", "model.vision.num_channels", "model.vision.layer_norm_eps",
        "model.vision.select_layer", "model.image_token_index"})
    keys.push_back(k);
  return keys;
}

void check(bool holds) {
  if (!holds) __builtin_trap();
}

// What the trainer, the loader and the kernels take for granted of a loaded config.
void check_invariants(const train::RunConfig& c) {
  check(c.threads >= 0 && c.threads <= 1024 && c.num_workers >= 0 && c.num_workers <= 256 && c.prefetch >= 0);
  check(std::isfinite(c.num_train_epochs) && c.num_train_epochs > 0);
  for (float v : {c.learning_rate, c.max_grad_norm, c.warmup_ratio, c.vision_lr, c.projector_lr,
                  c.optimizer.weight_decay, c.optimizer.eps, c.optimizer.momentum})
    check(std::isfinite(v) && v >= 0);
  check(c.optimizer.beta1 >= 0 && c.optimizer.beta1 < 1 && c.optimizer.beta2 >= 0 && c.optimizer.beta2 < 1);
  check(std::isfinite(c.loss_scale_min) && c.loss_scale_min > 0 && c.loss_scale_min <= c.loss_scale_initial &&
        std::isfinite(c.loss_scale_initial) && c.loss_scale_hysteresis >= 1);
  check(std::isfinite(c.collective_timeout_s) && c.collective_timeout_s > 0 && !c.output_dir.empty());
  check(c.micro_batch_size >= 1 && c.gradient_accumulation_steps >= 1 && c.global_batch_size >= 1);
  const models::LlavaConfig& m = c.model.config;
  check(m.llm.intermediate > 0 && m.vision.intermediate > 0 && m.llm.layers > 0 && m.vision.channels > 0);
  check(std::isfinite(m.llm.rope_theta) && m.llm.rope_theta > 0 && std::isfinite(m.llm.rms_norm_eps));
  check(m.parameter_count() > 0 && m.parameter_count() <= INT64_MAX / 16);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<std::string> keys = fuzzed_keys();
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> sets = {"model.preset=tiny"};
  for (std::size_t start = 0; start < input.size();) {
    std::size_t end = input.find('\0', start);
    if (end == std::string::npos) end = input.size();
    if (end > start) {
      const std::string& key = keys[static_cast<unsigned char>(input[start]) % keys.size()];
      sets.push_back(key + "=" + input.substr(start + 1, end - start - 1));
    }
    start = end + 1;
  }
  try {
    check_invariants(train::load_config_text("", "fuzz.yaml", sets, 1 + int(size % 3)));
  } catch (const Error&) {
  }
  return 0;
}
