// headroom command line: sub-command dispatch. Each command lives in its own file.
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/check.h"
#include "models/config.h"
#include "parallel/comm.h"
#include "train/commands.h"

namespace {

// The presets' names, wrapped under the help's description column.
std::string presets() {
  std::string out, line;
  for (const std::string& name : hr::models::preset_names()) {
    if (!line.empty() && line.size() + name.size() + 2 > 60) out += line + ",\n                       ", line.clear();
    line += (line.empty() ? "" : ", ") + name;
  }
  return out + line;
}

void usage(std::FILE* to) {
  std::fprintf(
      to,
      "usage: headroom <command> [options]\n"
      "\n"
      "commands:\n"
      "  train CONFIG [--set key=value ...] [--deepspeed DS.json] [--print-config] [--resume]\n"
      "                       train (the synthetic VQA set when data.train_json is empty)\n"
      "  plan CONFIG [--device NAME | --capacity BYTES] [--world-size N] [--set key=value ...]\n"
      "       [--json] [--explain] [--max-micro-batch] [--trace FILE] [--snapshot FILE] [--deepspeed DS.json]\n"
      "       [--image-size HxW] [--data-steps N]\n"
      "                       predict every rank's peak memory by category before anything is\n"
      "                       allocated, fill `auto` strategy keys, suggest fixes when it does not fit\n"
      "                       (devices: a100-40g a100-80g h100-80g h200-141g l4-24g rtx4090-24g\n"
      "                       v100-32g cpu:<capacity>)\n"
      "                       --trace: the dry run's memory timeline for ui.perfetto.dev; --snapshot:\n"
      "                       the allocator at its peak for pytorch.org/memory_viz; --image-size: AnyRes\n"
      "                       images of that size; --data-steps: every rank's first N steps of the\n"
      "                       run's data, each dry-run at its own shapes, against the worst case\n"
      "  report RUN_DIR [--out FILE.html] [--png FILE.png]\n"
      "                       one self-contained HTML page of a run: memory by category per step,\n"
      "                       predicted against measured peaks, loss, accuracy, tokens/s, the plan\n"
      "  ckpt consolidate DIR [--out FILE | --out OUT_DIR/]\n"
      "                       one llava-hf safetensors model from a checkpoint's shards (any ZeRO stage);\n"
      "                       to a directory: a Hugging Face model directory transformers opens\n"
      "  lora merge CKPT --out DIR\n"
      "                       a LoRA run's checkpoint with its adapters folded in (W += alpha/r B A):\n"
      "                       a Hugging Face model directory\n"
      "  eval CONFIG --checkpoint DIR [--predictions FILE] [--set key=value ...]\n"
      "                       eval loss and exact-match accuracy of greedy answers\n"
      "  generate CONFIG --checkpoint DIR [--image FILE] [--prompt TEXT] [--max-new-tokens N]\n"
      "       [--temperature T] [--top-p P] [--top-k K] [--seed S] [--stop TEXT] [--json] [--no-cache]\n"
      "                       answer a question about an image (no --prompt: one question per line on\n"
      "                       stdin, the conversation kept, as LLaVA's CLI); temperature 0 is greedy\n"
      "  data synth --out DIR [--train N] [--eval M] [--seed S] [--image-size PX]\n"
      "       [--questions Q] [--captions F] [--aspect square|mixed|tall|wide]\n"
      "                       write the synthetic VQA set (LLaVA JSON + PNG)\n"
      "  bench CONFIG [--steps N] [--warmup W] [--set key=value ...]\n"
      "                       W + N training steps (no evaluation, no checkpoint), then JSON: step time,\n"
      "                       tokens/s, model GFLOP/s, peak RSS, the CPU; scripts/torch_twin.py times\n"
      "                       the same model in PyTorch from that JSON\n"
      "  info                 build features, devices and threads\n"
      "  demo oom [--capacity BYTES]\n"
      "                       run linear layers on a capped CPU device until it runs out, and show\n"
      "                       the out-of-memory report and the memory summary\n"
      "  model info PRESET|CONFIG.yaml\n"
      "                       parameter counts by module (presets: %s)\n"
      "  debug grads --config CFG --weights W.safetensors --batch B.safetensors --out G.safetensors\n"
      "              [--dtype f32|bf16] [--logits]\n"
      "                       one forward and backward; writes loss, logits and every parameter gradient\n"
      "  debug batch CONFIG --out B.safetensors [--count N] [--eval] [--set key=value ...]\n"
      "                       the first samples of the config's data as its pipeline makes them, collated\n"
      "                       into the batch file debug grads reads\n"
      "  help                 this text\n",
      presets().c_str());
}

// Each sub-command and the function that runs it (with the arguments after its name).
struct Command {
  const char* name;
  int (*run)(const std::vector<std::string>& args);
};

constexpr Command kCommands[] = {
    {"train", hr::train::cmd_train},       {"data", hr::train::cmd_data},     {"eval", hr::train::cmd_eval},
    {"generate", hr::train::cmd_generate}, {"ckpt", hr::train::cmd_ckpt},     {"lora", hr::train::cmd_lora},
    {"plan", hr::train::cmd_plan},         {"report", hr::train::cmd_report}, {"info", hr::train::cmd_info},
    {"demo", hr::train::cmd_demo},         {"model", hr::train::cmd_model},   {"debug", hr::train::cmd_debug},
    {"bench", hr::train::cmd_bench},
};

const Command* find_command(const std::string& name) {
  for (const Command& c : kCommands)
    if (name == c.name) return &c;
  return nullptr;
}

// The command's exit status. An error ends the whole job: under mpirun the other ranks may be waiting in a
// collective.
int run(const Command& command, const std::vector<std::string>& args) {
  try {
    return command.run(args);
  } catch (const hr::parallel::EveryRankError& e) {
    // Every rank is here with its own account of it: each prints before any ends the job.
    std::fprintf(stderr, "headroom: %s%s\n", hr::parallel::rank_prefix().c_str(), e.what());
    std::fflush(stderr);
    hr::parallel::barrier_all();
    hr::parallel::abort_all(1);
    return 1;
  } catch (const std::exception& e) {
    // Take the whole job down, not just this rank.
    std::fprintf(stderr, "headroom: %s%s\n", hr::parallel::rank_prefix().c_str(), e.what());
    std::fflush(stderr);
    hr::parallel::abort_all(1);
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "help" || args[0] == "--help" || args[0] == "-h") {
    usage(args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  const std::string cmd = args[0];
  args.erase(args.begin());
  // A file-size limit (ulimit -f) makes a write fail with EFBIG, reported like a full disk, instead of
  // killing the process mid-checkpoint.
  std::signal(SIGXFSZ, SIG_IGN);
  const Command* command = find_command(cmd);
  if (!command) {
    std::fprintf(stderr, "headroom: unknown command '%s'\n\n", cmd.c_str());
    usage(stderr);
    return 2;
  }
  return run(*command, args);
}
