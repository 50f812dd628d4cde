// `headroom train CONFIG [--set key=value ...] [--print-config] [--resume]`, `headroom data synth ...`,
// `headroom eval CONFIG --checkpoint DIR [--predictions FILE]`.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/io/safetensors.h"
#include "core/ops/copy.h"
#include "core/ops/elementwise.h"
#include "core/ops/linear.h"
#include "data/image.h"
#include "data/synth.h"
#include "models/hf_config.h"
#include "models/weights.h"
#include "train/checkpoint.h"
#include "train/cli_args.h"
#include "train/commands.h"
#include "train/config.h"
#include "train/engine.h"
#include "train/evaluate.h"
#include "train/llava_args.h"
#include "train/planner.h"
#include "train/run_data.h"
#include "train/run_files.h"
#include "train/trainer.h"

namespace hr::train {

int cmd_train(const std::vector<std::string>& given) {
  // LLaVA's and TrainingArguments' flags (finetune.sh's command line) become overrides first.
  const LlavaArgs llava = translate_llava_args(given);
  Parsed p = parse(llava.rest, "train", {"--deepspeed"}, {"--print-config", "--resume"});
  if (p.options.count("--deepspeed")) p.sets.insert(p.sets.begin(), "deepspeed=" + p.options["--deepspeed"]);
  p.sets.insert(p.sets.begin(), llava.sets.begin(), llava.sets.end());
  if (!llava.not_acted_on.empty()) {
    std::string list;
    for (const std::string& f : llava.not_acted_on) list += (list.empty() ? "" : ", ") + f;
    std::fprintf(stderr, "[args] accepted, changing nothing here: %s\n", list.c_str());
  }
  if (p.flags.count("--print-config")) {
    std::printf("%s", load_config(p.config, p.sets).resolved_yaml.c_str());
    return 0;
  }
  auto comm = parallel::make_default();
  RunConfig c = load_config(p.config, p.sets, comm->world());
  return run_training(c, {p.flags.count("--resume") > 0}, *comm);
}

int cmd_data(const std::vector<std::string>& args) {
  HR_CHECK(!args.empty() && args[0] == "synth",
           "[data] usage: headroom data synth --out DIR [--train N] [--eval M] [--seed S] [--image-size PX] "
           "[--questions Q] [--captions F] [--aspect square|mixed|tall|wide]");
  Parsed p =
      parse({args.begin() + 1, args.end()}, "data synth",
            {"--out", "--train", "--eval", "--seed", "--image-size", "--questions", "--captions", "--aspect"}, {});
  HR_CHECK(p.options.count("--out"), "[data synth] --out DIR is required");
  data::SynthOptions o;
  o.out_dir = p.options["--out"];
  // The bounds of the data.synthetic.* keys; a count of samples up to what a data set file can index.
  constexpr int64_t kMaxSamples = int64_t(1) << 40, kMaxImage = 4096;
  o.train = integer_option(p, "data synth", "--train", 2000, 1, kMaxSamples);
  o.eval = integer_option(p, "data synth", "--eval", 200, 1, kMaxSamples);
  o.seed = uint64_t(integer_option(p, "data synth", "--seed", 0, 0, INT64_MAX));
  o.image_size = int(integer_option(p, "data synth", "--image-size", 32, 8, kMaxImage));
  o.questions = int(integer_option(p, "data synth", "--questions", 1, 1, 64));
  o.captions = number_option(p, "data synth", "--captions", 0, 0, 1);
  if (p.options.count("--aspect")) o.aspect = data::parse_synth_aspect(p.options["--aspect"], "[data synth] --aspect");
  const int64_t n = data::write_synthetic_vqa(o);
  std::printf("wrote %lld samples to %s (train.json, eval.json, images/)\n", (long long)n, o.out_dir.c_str());
  return 0;
}

namespace {

// The files a Hugging Face directory written from checkpoint `dir` carries beside its weights: the checkpoint's
// own tokenizer and preprocessor files, and the token ids its config.json was written with.
HfSidecar sidecar_of(const std::string& dir, const RunConfig& c) {
  HfSidecar side;
  side.max_shard_bytes = c.max_shard_bytes;
  std::vector<std::string> names(std::begin(kHfTokenizerFiles), std::end(kHfTokenizerFiles));
  names.push_back("preprocessor_config.json");
  for (const std::string& name : names)
    if (std::filesystem::is_regular_file(std::filesystem::path(dir) / name))
      side.files.push_back((std::filesystem::path(dir) / name).string());
  side.preprocessor_json = run_preprocessor_json(c);
  const std::string cfg = dir + "/config.json";
  if (std::filesystem::is_regular_file(cfg)) {
    const auto j = nlohmann::json::parse(std::ifstream(cfg), nullptr, false);
    if (j.is_object() && j.contains("text_config"))
      side.tokens = models::token_ids_from_hf(j["text_config"], cfg, "text_config.");
  }
  return side;
}

// headroom lora merge CKPT --out DIR: W += (alpha / r) B A for every adapted layer, written as a full model.
int lora_merge(const std::vector<std::string>& args) {
  Parsed p = parse(args, "lora merge", {"--out"}, {});
  HR_CHECK(!p.config.empty() && p.options.count("--out"), "[lora merge] usage: headroom lora merge CKPT --out DIR");
  const std::string dir = p.config, out = p.options["--out"];
  HR_CHECK(std::filesystem::exists(dir + "/config.yaml"), "[lora merge] ", dir,
           "/config.yaml is missing (is this a checkpoint-STEP directory?)");
  const RunConfig c = load_config(dir + "/config.yaml", {}, read_trainer_state(dir).world_size);
  HR_CHECK(c.lora_enable, "[lora merge] ", dir,
           " is not a LoRA run's checkpoint (its config.yaml has lora.enable: false)");
  std::string why;
  HR_CHECK(models::hf_expressible(c.model.config, &why), "[lora merge] ", out, ": ", why);
  // The model as it trained (ZeRO-3 shards are laid out by its parameters); a quantized base (lora.base_bits) is
  // then dequantized into a model in the model precision, which the merge writes.
  auto model = build_model(c, core::Device::cpu());
  load_model_weights(dir, *model);
  if (c.lora.quantizes_base()) {
    RunConfig full = c;
    full.lora.base_bits = 16;
    auto dequantized = build_model(full, core::Device::cpu());
    for (const auto& q : dequantized->params().all()) {
      const std::string bad = models::assign_param(*q, model->params().find(q->name)->data);
      HR_ASSERT(bad.empty(), "dequantizing ", q->name, ": ", bad);
    }
    model = std::move(dequantized);
  }
  core::ParamStore& store = model->params();
  const float s = c.lora.scale();
  int64_t merged = 0;
  for (const auto& a : store.all()) {
    if (a->role != core::ParamRole::LoraA) continue;
    const std::string layer = a->name.substr(0, a->name.size() - std::string(".lora_A.weight").size());
    core::Param* w = store.find(layer + ".weight");
    core::Param* b = store.find(layer + ".lora_B.weight");
    HR_ASSERT(w && b, "adapter ", a->name, " without its layer or its B");
    // In f32, then back to the model precision: (out, r) @ (r, in).
    const core::Tensor delta =
        core::matmul_forward(core::cast(b->data, core::DType::F32), core::cast(a->data, core::DType::F32));
    core::Tensor sum = core::cast(w->data, core::DType::F32);
    core::add_(sum, delta, s);
    core::copy_(w->data, sum);
    ++merged;
  }
  std::filesystem::create_directories(out);
  const HfSidecar side = sidecar_of(dir, c);
  models::write_hf_config(out, c.model.config, store.dtype(), side.tokens);
  write_hf_sidecar(out, side);
  save_model_weights(out, models::named_weights(store), c.max_shard_bytes);
  std::printf(
      "wrote %s: %lld adapted layers merged (W += %g x B A), %lld parameters in the llava-hf layout, with "
      "config.json and the tokenizer and preprocessor files\n",
      out.c_str(), (long long)merged, double(s), (long long)store.count() - [&] {
        int64_t n = 0;
        for (const auto& q : store.all()) n += models::is_lora(*q) ? q->numel() : 0;
        return n;
      }());
  return 0;
}

}  // namespace

int cmd_lora(const std::vector<std::string>& args) {
  HR_CHECK(!args.empty() && args[0] == "merge", "[lora] usage: headroom lora merge CKPT --out DIR");
  return lora_merge({args.begin() + 1, args.end()});
}

int cmd_ckpt(const std::vector<std::string>& args) {
  HR_CHECK(!args.empty() && args[0] == "consolidate",
           "[ckpt] usage: headroom ckpt consolidate DIR [--out FILE | --out OUT_DIR/]");
  Parsed p = parse({args.begin() + 1, args.end()}, "ckpt consolidate", {"--out"}, {});
  HR_CHECK(!p.config.empty(), "[ckpt consolidate] the checkpoint directory is required");
  const std::string dir = p.config;
  HR_CHECK(std::filesystem::exists(dir + "/config.yaml"), "[ckpt consolidate] ", dir,
           "/config.yaml is missing (is this a checkpoint-STEP directory?)");
  // The resolved config carries the global batch of the run's world size.
  RunConfig c = load_config(dir + "/config.yaml", {}, read_trainer_state(dir).world_size);
  const auto model = build_model(c, core::Device::meta());
  std::string out = p.options.count("--out") ? p.options["--out"] : dir + "/consolidated.safetensors";
  // --out DIR/ (or an existing directory): a Hugging Face model directory, model.safetensors and config.json.
  const bool to_dir = std::filesystem::is_directory(out) || (!out.empty() && out.back() == '/');
  if (to_dir) {
    std::filesystem::create_directories(out);
    std::string why;
    HR_CHECK(models::hf_expressible(c.model.config, &why), "[ckpt consolidate] ", out, ": ", why);
    // The checkpoint's own tokenizer and preprocessor files (carried there when it was written) come along.
    const HfSidecar side = sidecar_of(dir, c);
    models::write_hf_config(out, c.model.config, model->params().dtype(), side.tokens);
    write_hf_sidecar(out, side);
    consolidate_checkpoint(dir, *model, out, true, c.max_shard_bytes);
    std::printf(
        "wrote %s (%lld parameters in the llava-hf layout) with config.json, generation_config.json and the "
        "tokenizer and preprocessor files beside it\n",
        out.c_str(), (long long)model->params().count());
    return 0;
  }
  consolidate_checkpoint(dir, *model, out);
  std::printf("wrote %s (%lld parameters in the llava-hf layout)\n", out.c_str(), (long long)model->params().count());
  return 0;
}

int cmd_eval(const std::vector<std::string>& args) {
  Parsed p = parse(args, "eval", {"--checkpoint", "--predictions"}, {});
  // A run's resolved config.yaml names the global batch of its world size; evaluation has no use for it, and
  // must not refuse that config in one process.
  p.sets.insert(p.sets.begin(), "train.global_batch_size=0");
  RunConfig c = load_config(p.config, p.sets);
  HR_CHECK(p.options.count("--checkpoint"), "[eval] --checkpoint DIR (or a model .safetensors) is required");
  auto single = parallel::make_single_process();
  const DataPaths paths = resolve_data_paths(c, *single);
  HR_CHECK(!paths.eval_json.empty(), "[eval] the config names no data.eval_json to evaluate on");
  const data::DataOptions d = data_options(c, paths.eval_json, paths.image_folder);
  data::LlavaDataset eval_set(d, models::input_spec(c.model.config));
  const auto model = build_model(c, inference_device(c));
  load_inference_weights(*model, p.options["--checkpoint"]);
  EvalOptions eo{c.eval_samples, c.eval_batch_size, c.max_new_tokens, c.ce_chunk_rows};
  eo.pad_to_multiple_of = c.pad_to_multiple_of;
  eo.max_seq_len = c.max_seq_len;
  eo.on_bad_sample = c.on_bad_sample;
  EvalResult r = evaluate(*model, eval_set, eo);
  for (const std::string& bad : r.bad_samples) std::printf("skipped bad sample: %s\n", bad.c_str());
  std::printf("eval loss %.4f | accuracy %.2f%% over %lld samples%s\n", r.loss, 100.0 * r.accuracy,
              (long long)r.samples,
              r.skipped ? str(" (", r.skipped, " bad samples skipped, named above)").c_str() : "");
  for (const auto& [type, ct] : r.by_type)
    std::printf("  %-10s %.2f%% (%lld/%lld)\n", type.c_str(),
                100.0 * double(ct.first) / double(std::max<int64_t>(ct.second, 1)), (long long)ct.first,
                (long long)ct.second);
  if (p.options.count("--predictions")) {
    const std::string path = p.options["--predictions"];
    std::ofstream f(path);
    for (const EvalPrediction& e : r.predictions) f << prediction_line(e) << "\n";
    HR_CHECK(f.good(), "[eval] cannot write --predictions ", path);
    std::printf("wrote %zu predictions to %s\n", r.predictions.size(), path.c_str());
  }
  return 0;
}

}  // namespace hr::train
