// `headroom debug grads`: load weights and one batch, run forward and backward, write the loss, optionally
// the logits, and every parameter gradient under the parameter's name, for comparison with a reference.
// `headroom debug batch`: the first samples of a config's data as its pipeline makes them (tokenizer, template,
// images), collated into the batch file `debug grads` reads.
#include <cstdio>

#include "core/io/safetensors.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "models/llava.h"
#include "models/model_spec.h"
#include "models/weights.h"
#include "train/checkpoint.h"
#include "train/cli_args.h"
#include "train/commands.h"
#include "train/config.h"
#include "train/run_data.h"

namespace hr::train {

using namespace hr::core;
using namespace hr::models;

namespace {

// debug grads' options.
struct GradsArgs {
  std::string config, weights, batch, out;
  DType dtype = DType::F32;
  bool logits = false;  // also write the logits
};

GradsArgs parse_grads_args(const std::vector<std::string>& args) {
  GradsArgs a;
  for (std::size_t i = 0; i < args.size(); ++i) {
    auto value = [&](const char* flag) {
      HR_CHECK(i + 1 < args.size(), "[debug grads] ", flag, " needs a value");
      return args[++i];
    };
    if (args[i] == "--config")
      a.config = value("--config");
    else if (args[i] == "--weights")
      a.weights = value("--weights");
    else if (args[i] == "--batch")
      a.batch = value("--batch");
    else if (args[i] == "--out")
      a.out = value("--out");
    else if (args[i] == "--dtype")
      a.dtype = parse_dtype(value("--dtype"));
    else if (args[i] == "--logits")
      a.logits = true;
    else
      throw Error(str("[debug grads] unknown option '", args[i],
                      "'; allowed: --config --weights --batch --out --dtype --logits"));
  }
  HR_CHECK(!a.config.empty() && !a.weights.empty() && !a.batch.empty() && !a.out.empty(),
           "[debug grads] --config, --weights, --batch and --out are all required");
  return a;
}

int debug_grads(const std::vector<std::string>& args) {
  const GradsArgs a = parse_grads_args(args);
  // The whole config, as train reads it (a run's own checkpoint-N/config.yaml too: its model.weights, its batch of
  // several ranks, which one process must not refuse). LoRA adapters as its lora.* keys make them, without dropout
  // (a parity check compares one forward).
  const RunConfig run = load_config(a.config, {"train.global_batch_size=0"}, 1);
  ModelSpec spec = run.model;
  if (run.lora_enable) spec.config.llm.lora = run.lora, spec.config.llm.lora.dropout = 0.f;
  Llava model(spec.config, Device::cpu(), a.dtype);
  model.set_trainable({.vision = !spec.freeze_vision, .projector = !spec.freeze_projector, .llm = !spec.freeze_llm});
  load_weights(model.params(), Checkpoint::open(a.weights));
  load_adapters_in(a.weights, model);
  Batch batch = data::read_batch_file(a.batch);
  ModelOptions opt;
  opt.return_logits = a.logits;
  LlavaState st;
  const float loss = model.forward(batch, st, opt);
  model.backward(st);
  NamedTensors result = {{"loss", Tensor::full({}, loss, DType::F32, Device::cpu())}};
  if (a.logits) result.emplace_back("logits", st.logits);
  for (auto& nt : named_grads(model.params())) result.push_back(nt);
  save_safetensors(a.out, result);
  std::printf("loss %.6f; wrote %zu gradients to %s\n", loss, result.size() - (a.logits ? 2 : 1), a.out.c_str());
  return 0;
}

}  // namespace

int debug_batch(const std::vector<std::string>& args) {
  Parsed p = parse(args, "debug batch", {"--out", "--count"}, {"--eval"});
  HR_CHECK(!p.config.empty() && p.options.count("--out"),
           "[debug batch] usage: headroom debug batch CONFIG --out "
           "B.safetensors [--count N] [--eval] [--set key=value ...]");
  p.sets.insert(p.sets.begin(), "train.global_batch_size=0");
  const RunConfig c = load_config(p.config, p.sets);
  const bool eval = p.flags.count("--eval") > 0;
  HR_CHECK(!(eval ? c.eval_json : c.train_json).empty(), "[debug batch] ", p.config, " names no data.",
           eval ? "eval_json" : "train_json");
  const data::DataOptions d = data_options(c, eval ? c.eval_json : c.train_json, c.image_folder);
  const data::LlavaDataset set(d, input_spec(c.model.config));
  const int64_t count = integer_option(p, "debug batch", "--count", 4, 1, int64_t(1) << 20);
  std::vector<data::Example> examples;
  int64_t seq = 0;
  for (int64_t i = 0; i < std::min(count, set.size()); ++i) {
    examples.push_back(set.get(i));
    seq = std::max<int64_t>(seq, int64_t(examples.back().ids.size()));
  }
  HR_CHECK(!examples.empty(), "[debug batch] ", set.path(), " has no samples");
  const Batch b = data::collate(examples, seq, c.model.config.ignore_index);
  data::write_batch_file(p.options["--out"], b);
  std::printf("wrote %lld samples (%lld positions) from %s with %s to %s\n", (long long)b.batch, (long long)b.seq,
              set.path().c_str(), set.tokenizer().describe().c_str(), p.options["--out"].c_str());
  return 0;
}

int cmd_debug(const std::vector<std::string>& args) {
  if (!args.empty() && args[0] == "batch") return debug_batch({args.begin() + 1, args.end()});
  HR_CHECK(!args.empty() && args[0] == "grads",
           "[debug] usage: headroom debug grads --config CFG --weights W.safetensors --batch B.safetensors --out "
           "G.safetensors [--dtype f32|bf16] [--logits] | headroom debug batch CONFIG --out B.safetensors [--count N] "
           "[--eval]");
  return debug_grads({args.begin() + 1, args.end()});
}

}  // namespace hr::train
