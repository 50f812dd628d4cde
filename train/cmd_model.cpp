// `headroom model info PRESET|CONFIG`: parameter counts by module, built on the meta device (no memory).
#include <cstdio>
#include <map>

#include "models/llava.h"
#include "models/model_spec.h"
#include "train/commands.h"
#include "train/config.h"

namespace hr::train {

using namespace hr::core;
using namespace hr::models;

namespace {

// The module group a parameter is counted under in the table.
std::string group_of(const std::string& name) {
  auto starts = [&](const char* p) { return name.rfind(p, 0) == 0; };
  if (starts("vision_tower.vision_model.encoder.layers.")) return "vision_tower encoder layers";
  if (starts("vision_tower.vision_model.embeddings.")) return "vision_tower embeddings";
  if (starts("vision_tower.")) return "vision_tower norms";
  if (starts("multi_modal_projector.")) return "multi_modal_projector";
  if (starts("language_model.model.embed_tokens.")) return "language_model embed_tokens";
  if (starts("language_model.model.layers.")) return "language_model layers";
  if (starts("language_model.lm_head.")) return "language_model lm_head";
  return "language_model norm";
}

std::string with_commas(int64_t v) {
  std::string s = std::to_string(v), out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

}  // namespace

int cmd_model(const std::vector<std::string>& args) {
  HR_CHECK(args.size() == 2 && args[0] == "info", "[model] usage: headroom model info PRESET|CONFIG.yaml");
  const std::string what = args[1];
  const bool is_file =
      what.size() > 5 && (what.substr(what.size() - 5) == ".yaml" || what.substr(what.size() - 4) == ".yml");
  ModelSpec spec;
  if (is_file)  // the whole config, as train reads it: a run's own checkpoint-N/config.yaml too
    spec = load_config(what, {"train.global_batch_size=0"}).model;
  else
    spec.config = preset(what);
  Llava model(spec.config, Device::meta(), spec.dtype);
  model.set_trainable({.vision = !spec.freeze_vision, .projector = !spec.freeze_projector, .llm = !spec.freeze_llm});
  std::map<std::string, int64_t> groups;
  std::vector<std::string> order;
  for (const auto& p : model.params().all()) {
    const std::string g = group_of(p->name);
    if (!groups.count(g)) order.push_back(g);
    groups[g] += p->count();
  }
  const LlavaConfig& c = spec.config;
  std::printf(
      "model %s: vision %lldx%lld (%lld layers, %lld px / %lld), projector %s, llm %lld layers x %lld "
      "(%lld heads, %lld kv), vocab %lld\n",
      c.name.c_str(), (long long)c.vision.hidden, (long long)c.vision.intermediate, (long long)c.vision.layers,
      (long long)c.vision.image_size, (long long)c.vision.patch, projector_name(c.projector), (long long)c.llm.layers,
      (long long)c.llm.hidden, (long long)c.llm.heads, (long long)c.llm.kv_heads, (long long)c.llm.vocab);
  std::printf("  %-32s %18s %12s\n", "module", "parameters", "bf16 bytes");
  for (const std::string& g : order)
    std::printf("  %-32s %18s %12s\n", g.c_str(), with_commas(groups[g]).c_str(),
                format_bytes(2.0 * double(groups[g])).c_str());
  const int64_t total = model.params().count(), trainable = model.params().count(core::ParamStore::Counting::Trainable);
  std::printf("  %-32s %18s %12s\n", "total", with_commas(total).c_str(), format_bytes(2.0 * double(total)).c_str());
  std::printf("  %-32s %18s\n", "trainable", with_commas(trainable).c_str());
  return 0;
}

}  // namespace hr::train
