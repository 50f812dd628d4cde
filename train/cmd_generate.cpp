// `headroom generate CONFIG --checkpoint DIR [--image FILE] [--prompt TEXT] ...`: asks a trained model about an
// image, once (--prompt) or turn after turn on stdin as LLaVA's CLI does, in the config's conversation template.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "data/anyres.h"
#include "data/conversation.h"
#include "data/image.h"
#include "models/anyres.h"
#include "train/checkpoint.h"
#include "train/cli_args.h"
#include "train/commands.h"
#include "train/config.h"
#include "train/engine.h"
#include "train/generate.h"
#include "train/planner.h"
#include "train/run_files.h"

namespace hr::train {

namespace {

// One exchange of the conversation so far, as a prompt (the template up to the assistant's answer).
data::Example make_prompt(const RunConfig& c, const data::Tokenizer& tok, const std::vector<data::Turn>& history,
                          const data::ModelImage& image) {
  const models::LlavaConfig& m = c.model.config;
  std::vector<data::Turn> turns = history;
  turns.push_back({false, ""});
  const data::Tokenized t =
      data::apply_template(c.chat_template, turns, tok, image.tokens, c.system_prompt, m.ignore_index);
  data::Example e;
  e.id = "prompt";
  e.prompt = t.prompt;
  if (t.images) {
    e.images.push_back(image.pixels);
    e.image_tokens.push_back(image.tokens);
    if (m.anyres.on()) e.image_sizes.push_back(image.size);
  }
  return e;
}

}  // namespace

int cmd_generate(const std::vector<std::string>& args) {
  Parsed p = parse(args, "generate",
                   {"--checkpoint", "--image", "--prompt", "--max-new-tokens", "--temperature", "--top-p", "--top-k",
                    "--seed", "--stop"},
                   {"--json", "--no-cache"});
  p.sets.insert(p.sets.begin(), "train.global_batch_size=0");  // as in eval: the run's batch is of no use here
  const RunConfig c = load_config(p.config, p.sets);
  HR_CHECK(p.options.count("--checkpoint"), "[generate] --checkpoint DIR (or a model .safetensors) is required");
  // The sampling options, checked before anything loads, with transformers' bounds: a temperature >= 0, top_p in
  // (0, 1] (0 is refused: it keeps no token), top_k >= 0 (0: off).
  GenerationOptions g;
  g.max_new_tokens = integer_option(p, "generate", "--max-new-tokens", c.max_new_tokens, 1, int64_t(1) << 20);
  g.temperature = float(number_option(p, "generate", "--temperature", 0, 0, 1e6));
  g.do_sample = g.temperature > 0.f;  // LLaVA's CLI: temperature 0 is greedy
  if (!g.do_sample) g.temperature = 1.f;
  g.top_p = float(number_option(p, "generate", "--top-p", 1, 0, 1));
  HR_CHECK(g.top_p > 0.f, "[generate] --top-p '", p.options["--top-p"], "' keeps no token; give a number in (0, 1]");
  g.top_k = integer_option(p, "generate", "--top-k", 0, 0, INT64_MAX);
  g.seed = p.options.count("--seed") ? uint64_t(integer_option(p, "generate", "--seed", 0, 0, INT64_MAX)) : c.seed;
  const auto model = build_model(c, inference_device(c));
  load_inference_weights(*model, p.options["--checkpoint"]);

  data::ModelImage image;
  if (p.options.count("--image"))
    image = data::load_model_image(p.options["--image"], models::input_spec(c.model.config), c.aspect,
                                   run_image_processor(c), run_image_norm(c), c.max_image_tokens);
  const auto tok = load_run_tokenizer(c);
  g.tokenizer = tok.get();
  g.eos_token_id = tok->eos();
  if (p.options.count("--stop")) g.stop.push_back(p.options["--stop"]);
  g.use_cache = !p.flags.count("--no-cache");
  const bool json = p.flags.count("--json") > 0;

  std::vector<data::Turn> history;
  auto ask = [&](const std::string& question) {
    // The image goes with the first question, as LLaVA's CLI sends it.
    history.push_back({true, history.empty() && image.pixels.defined() ? "<image>\n" + question : question});
    const data::Example prompt = make_prompt(c, *tok, history, image);
    const GenerationResult r = generate(*model, {prompt}, g);
    history.push_back({false, r.text[0]});
    if (json) {
      const nlohmann::json j = {{"prompt", question},
                                {"prompt_ids", prompt.prompt},
                                {"answer", r.text[0]},
                                {"tokens", r.tokens[0]},
                                {"finish", finish_name(r.finish[0])},
                                {"prompt_tokens", r.prompt_tokens},
                                {"new_tokens", r.new_tokens},
                                {"kv_cache_bytes", r.cache_bytes},
                                {"seconds", r.seconds},
                                {"tokens_per_s", r.seconds > 0 ? double(r.new_tokens) / r.seconds : 0.0}};
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::printf("%s\n", r.text[0].c_str());
    }
    std::fflush(stdout);
  };
  if (p.options.count("--prompt")) {
    ask(p.options["--prompt"]);
    return 0;
  }
  // Interactive: one question per line until an empty line or the end of input.
  for (std::string line;;) {
    if (!json) std::printf("USER: "), std::fflush(stdout);
    if (!std::getline(std::cin, line) || line.empty()) break;
    if (!json) std::printf("ASSISTANT: "), std::fflush(stdout);
    ask(line);
  }
  return 0;
}

}  // namespace hr::train
