// `headroom bench CONFIG [--steps N] [--warmup W] [--set key=value ...]`: the config's training run for W + N
// steps (no evaluation, no checkpoint), then one JSON object on stdout: step time, tokens/s, the model's FLOPs
// and the GFLOP/s they make, peak RSS, the CPU, and the Hugging Face config of the model, so that
// scripts/torch_twin.py can time the same model and batch in PyTorch. The run's own console output goes to
// stderr.
#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <oneapi/dnnl/dnnl.hpp>

#include "core/backend/cpu/cpu_kernels.h"
#include "models/hf_config.h"
#include "train/cli_args.h"
#include "train/commands.h"
#include "train/config.h"
#include "train/engine.h"
#include "train/planner.h"
#include "train/trainer.h"

namespace hr::train {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The first processor's entries of /proc/cpuinfo: name, vendor, family, model, and the flags that decide what the
// bf16 GEMMs run on.
json cpu_json() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  std::map<std::string, std::string> first;
  while (std::getline(f, line) && !line.empty()) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    first[key] = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
  }
  auto number = [&](const char* k) -> json {
    try {
      return first.count(k) ? json(std::stoll(first[k])) : json(nullptr);
    } catch (const std::exception&) {
      return nullptr;
    }
  };
  const std::string flags = " " + first["flags"] + " ";
  auto has = [&](const char* flag) { return flags.find(str(" ", flag, " ")) != std::string::npos; };
  return {{"name", first.count("model name") ? first["model name"] : "unknown"},
          {"vendor", first.count("vendor_id") ? first["vendor_id"] : "unknown"},
          {"family", number("cpu family")},
          {"model", number("model")},
          {"avx512_bf16", has("avx512_bf16")},
          {"amx_bf16", has("amx_bf16")}};
}

// What oneDNN's bf16 GEMMs run on at `isa`.
const char* bf16_path(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::avx512_core_amx:
      return "AMX tiles";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "AVX512-BF16 dot products";
    case dnnl::cpu_isa::avx512_core:
    case dnnl::cpu_isa::avx512_core_vnni:
      return "AVX-512, bf16 widened to f32 (no AVX512-BF16)";
    default:
      return "AVX2, bf16 widened to f32 (no AVX-512)";
  }
}

// What a bf16 attention's tile products run on here (core/backend/cpu/attention_bf16.h).
const char* bf16_attention_path() {
  if (cpu::amx_tiles_present()) return "AMX tiles (AVX512-BF16 dot products at tile edges)";
  if (cpu::bf16_tiles_present()) return "AVX512-BF16 dot products";
  return "f32 tiles, bf16 widened (no AVX512-BF16)";
}

const char* isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "other";
  }
}

// Standard output to stderr while the run prints; restored when the scope ends.
class StdoutToStderr {
 public:
  StdoutToStderr() {
    std::fflush(stdout);
    saved_ = dup(1);
    dup2(2, 1);
  }
  ~StdoutToStderr() {
    std::fflush(stdout);
    dup2(saved_, 1);
    close(saved_);
  }
  StdoutToStderr(const StdoutToStderr&) = delete;
  StdoutToStderr& operator=(const StdoutToStderr&) = delete;

 private:
  int saved_ = -1;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

json hf_config_of(const RunConfig& c) {
  std::string why;
  if (!models::hf_expressible(c.model.config, &why)) return json{{"not_expressible", why}};
  const fs::path dir = fs::path(c.output_dir) / "hf_config";
  fs::create_directories(dir);
  models::write_hf_config(dir.string(), c.model.config, param_dtype(c.precision));
  return json::parse(std::ifstream(dir / "config.json"));
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / double(v.size());
}

// --steps (at least 1) or --warmup (at least 0); `fallback` when absent.
int64_t count(const Parsed& p, const char* k, int64_t fallback) {
  if (!p.options.count(k)) return fallback;
  const int64_t v = std::stoll(p.options.at(k));
  HR_CHECK(v >= (std::string(k) == "--steps" ? 1 : 0), "[bench] ", k, " ", v, " is out of range");
  return v;
}

// The config's own --set overrides, then the bench's: `steps` steps, no evaluation, no checkpoint, no progress bar,
// the run in `out_dir`.
std::vector<std::string> bench_sets(std::vector<std::string> sets, int64_t steps, const std::string& out_dir) {
  for (const std::string& s :
       {str("train.max_steps=", steps), std::string("train.eval_steps=0"), std::string("train.save_steps=0"),
        std::string("log.progress_bar=false"), str("run.output_dir=", out_dir)})
    sets.push_back(s);
  return sets;
}

// The run, its console output on stderr: standard output is the JSON's alone.
int run_quietly(const RunConfig& c, parallel::Communicator& comm) {
  StdoutToStderr quiet;
  TrainOptions o;
  o.finish = false;
  return run_training(c, o, comm);
}

// What rank 0's memory log says (ranks step together): the device's memory over the whole run (the caching
// allocator's peaks) and the steps the plan predicted byte for byte, which the GPU peer's
// torch.cuda.max_memory_allocated / max_memory_reserved are set beside; the time, exposed communication and
// tokens (and labelled tokens) of each step after the warm-up.
struct BenchLog {
  std::vector<double> step_s, exposed_s, tokens, loss_tokens, flops;
  int64_t peak_allocated = 0, peak_reserved = 0, exact_steps = 0, logged_steps = 0;
};

BenchLog read_bench_log(const std::string& log, int64_t warmup) {
  std::ifstream f(log);
  HR_CHECK(f, "[bench] ", log, " is missing");
  BenchLog b;
  std::string line;
  while (std::getline(f, line)) {
    const json j = json::parse(line);
    b.peak_allocated = std::max(b.peak_allocated, j.value("peak_allocated", int64_t(0)));
    b.peak_reserved = std::max(b.peak_reserved, j.value("peak_reserved", int64_t(0)));
    ++b.logged_steps;
    if (j.contains("predicted_peak") && j["predicted_peak"].is_number() &&
        j["predicted_peak"].get<int64_t>() == j.value("peak_allocated", int64_t(-1)))
      ++b.exact_steps;
    if (j.value("step", int64_t(0)) <= warmup) continue;
    b.step_s.push_back(j.at("step_s").get<double>());
    b.exposed_s.push_back(j.value("comm_exposed_s", 0.0));
    b.tokens.push_back(double(j.at("tokens").get<int64_t>()));
    b.loss_tokens.push_back(double(j.at("loss_tokens").get<int64_t>()));
    b.flops.push_back(j.at("flops").get<double>());
  }
  HR_CHECK(!b.step_s.empty(), "[bench] ", log, " has no step after the ", warmup, " warm-up steps");
  return b;
}

// What ran: the config, the machine, and the strategies and batch of the plan.
json setup_json(const std::string& config, const RunConfig& c, const Plan& plan, int world, int64_t warmup) {
  const json cpu = cpu_json();
  return {
      {"config", config},
      {"model", c.model.config.name},
      {"cpu", cpu.at("name")},
      {"cpu_id", cpu},
      {"isa", isa_name(dnnl::get_effective_cpu_isa())},
      {"bf16_gemm", bf16_path(dnnl::get_effective_cpu_isa())},
      {"bf16_attention", bf16_attention_path()},
      {"device", run_device_of(c).name()},
      {"world_size", world},
      {"threads_per_rank", omp_get_max_threads()},
      {"precision", precision_name(c.precision)},
      {"stage", stage_name(c.stage)},
      {"checkpointing",
       {{"vision", models::checkpoint_name(plan.config.vision_ckpt.kind)},
        {"llm", models::checkpoint_name(plan.config.llm_ckpt.kind)},
        {"llm_last_block_kept", plan.config.llm_ckpt.keep_last}}},
      {"zero_stage", plan.config.zero.stage},
      // train.padding_free: the LLM ran only the positions the loss reads (tokens_per_step still counts the batch's).
      {"padding_free", c.padding_free == PaddingFree::On},
      {"micro_batch_size", plan.config.micro_batch_size},
      {"gradient_accumulation_steps", plan.config.gradient_accumulation_steps},
      {"global_batch_size", plan.config.global_batch_size},
      {"max_seq_len", c.max_seq_len},
      {"images_per_sample", c.max_images_per_sample},
      {"learning_rate", c.learning_rate},
      {"warmup_steps", warmup},
  };
}

// How fast: the step times, the tokens, and the FLOPs (over every rank): the model's over the batch as the config
// shapes it (the planner's count: every position of every padded row, as the peers run it; MFU's numerator), and
// what the step's matrix products ran (the memory log's `flops`: only the positions padding-free keeps, the last
// layer's tails, lm_head over the labelled rows, checkpointing's recompute), which is what the machine achieved.
json speed_json(const BenchLog& b, const Plan& plan, int world) {
  const double t = median(b.step_s);
  const double model_flops = plan.time.model_flops * double(world), ran_flops = median(b.flops);
  return {
      {"steps", int64_t(b.step_s.size())},
      {"step_ms",
       {{"median", 1e3 * t},
        {"mean", 1e3 * mean(b.step_s)},
        {"min", 1e3 * *std::min_element(b.step_s.begin(), b.step_s.end())},
        {"max", 1e3 * *std::max_element(b.step_s.begin(), b.step_s.end())}}},
      // Rank 0's time standing still for collectives (what overlap did not hide), per step.
      {"comm_exposed_ms",
       {{"median", 1e3 * median(b.exposed_s)},
        {"max", 1e3 * *std::max_element(b.exposed_s.begin(), b.exposed_s.end())}}},
      {"tokens_per_step", median(b.tokens)},
      // Of them, the labelled ones: the twin labels as many (only they go through lm_head here).
      {"loss_tokens_per_step", median(b.loss_tokens)},
      {"tokens_per_s", median(b.tokens) / t},
      {"model_gflop_per_step", model_flops / 1e9},
      {"ran_gflop_per_step", ran_flops / 1e9},
      {"achieved_gflops", ran_flops / 1e9 / t},
  };
}

// How much memory: the device's peaks, the steps predicted exactly, the peak RSS of rank 0 and of every rank.
json memory_json(const BenchLog& b, double rss, double rss_all) {
  return {
      {"peak_allocated_mib", double(b.peak_allocated) / 1048576.0},
      {"peak_reserved_mib", double(b.peak_reserved) / 1048576.0},
      {"steps_predicted_exactly", str(b.exact_steps, " / ", b.logged_steps)},
      {"peak_rss_mib", rss / 1048576.0},
      {"peak_rss_mib_all_ranks", rss_all / 1048576.0},
  };
}

}  // namespace

int cmd_bench(const std::vector<std::string>& args) {
  const Parsed p = parse(args, "bench", {"--steps", "--warmup"}, {});
  HR_CHECK(!p.config.empty(), "[bench] usage: headroom bench CONFIG [--steps N] [--warmup W] [--set key=value ...]");
  const int64_t steps = count(p, "--steps", 20), warmup = count(p, "--warmup", 3);
  auto comm = parallel::make_default();
  const int world = comm->world(), rank = comm->rank();
  const std::string out_dir = load_config(p.config, p.sets, world).output_dir + "/bench";
  const RunConfig c = load_config(p.config, bench_sets(p.sets, warmup + steps, out_dir), world);
  // A fresh directory: the memory log of an earlier bench there would be appended to, and its steps counted.
  if (rank == 0) std::filesystem::remove_all(out_dir);
  comm->barrier();
  const int status = run_quietly(c, *comm);
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const double rss = double(usage.ru_maxrss) * 1024.0, rss_all = comm->sum(rss);
  if (status != 0 || rank != 0) return status;
  const BenchLog log = read_bench_log(out_dir + (world == 1 ? "/memory.jsonl" : "/memory.rank0.jsonl"), warmup);
  const Plan plan = chosen_plan(search_plans(c, run_device(c), world), c);  // the plan the run took (run_plan.cpp)
  json out = setup_json(p.config, c, plan, world, warmup);  // an object's keys print sorted, however merged
  out.update(speed_json(log, plan, world));
  out.update(memory_json(log, rss, rss_all));
  out["hf_config"] = hf_config_of(c);
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace hr::train
