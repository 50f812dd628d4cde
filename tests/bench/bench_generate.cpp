// Generation on the CPU: tokens/s with the KV cache against whole-sequence decoding, 64 new tokens after a
// prompt of the 576-token class (an image and a long question), on a model of the quickstart's dimensions; and
// an evaluation of the synthetic set (every sample decoded: random weights settle nothing in the loss pass)
// with and without the cache. Random weights: speed does not depend on them, and no </s> ends a row early.
#include <benchmark/benchmark.h>

#include <filesystem>

#include "data/synth.h"
#include "models/weights.h"
#include "train/evaluate.h"
#include "train/generate.h"

using namespace hr;
using namespace hr::core;
using namespace hr::models;
using namespace hr::data;
using namespace hr::train;

namespace {

LlavaConfig quickstart() {
  LlavaConfig c;
  c.name = "quickstart";
  c.vision = {128, 3, 4, 512, 24, 8, 3, 1e-5f, 0, FeatureSelect::Patch};
  c.llm = {384, 192, 4, 6, 2, 512, 1e-5f, 10000.f, {}};
  c.image_token_id = 383;
  return c;
}

const Llava& model() {
  static const auto m = [] {
    auto p = std::make_unique<Llava>(quickstart(), Device::cpu(), DType::F32);
    init_weights(p->params(), 1);
    return p;
  }();
  return *m;
}

void BM_Generate(benchmark::State& state) {
  const bool cached = state.range(0) != 0;
  const int64_t prompt_len = state.range(1), new_tokens = 64;
  const LlavaConfig& c = model().config();
  Example e;
  e.id = "bench";
  e.prompt = {ByteTokenizer::kBos};
  e.prompt.insert(e.prompt.end(), std::size_t(c.vision.tokens_per_image()), c.image_token_id);
  while (int64_t(e.prompt.size()) < prompt_len)
    e.prompt.push_back(ByteTokenizer::kByteOffset + 'a' + int64_t(e.prompt.size()) % 26);
  e.images.push_back(Tensor::zeros({3, c.vision.image_size, c.vision.image_size}, DType::F32, Device::host()));
  GenerationOptions g;
  g.max_new_tokens = new_tokens;
  g.eos_token_id = -1;
  g.use_cache = cached;
  int64_t produced = 0;
  for (auto _ : state) produced += generate(model(), {e}, g).new_tokens;
  state.counters["tokens_per_s"] = benchmark::Counter(double(produced), benchmark::Counter::kIsRate);
}

void BM_Evaluate(benchmark::State& state) {
  const std::string dir = std::filesystem::temp_directory_path().string() + "/hr_bench_generate_eval";
  std::filesystem::remove_all(dir);
  write_synthetic_vqa({dir, 1, 64, 5, 24});
  DataOptions d;
  d.json_path = dir + "/eval.json";
  d.image_folder = dir;
  d.system_prompt = "";
  d.max_seq_len = 96;
  LlavaDataset set(d, input_spec(model().config()));
  EvalOptions o;
  o.use_cache = state.range(0) != 0;
  for (auto _ : state) benchmark::DoNotOptimize(evaluate(model(), set, o).accuracy);
  state.counters["samples_per_s"] =
      benchmark::Counter(double(set.size()), benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK(BM_Generate)
    ->ArgNames({"cached", "prompt"})
    ->Args({1, 576})
    ->Args({0, 576})
    ->Args({1, 64})
    ->Args({0, 64})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);
BENCHMARK(BM_Evaluate)->ArgName("cached")->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond)->Iterations(2);

BENCHMARK_MAIN();
