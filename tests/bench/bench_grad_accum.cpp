// bench_grad_accum [--vocab V] [--micro-batches N] [--chunk-rows R]: the bf16 gradient error against an f32 model
// (same weights, same data) after N micro-batches, with gradients accumulated in bf16 (memory.grad_accum_dtype:
// model) and in f32 (fp32, the default of bf16 runs): per parameter ||g - g_f32|| / ||g_f32||; the embedding and
// the head, the median and the worst over the parameters (those whose f32 gradient is not zero to rounding). A model
// of the "small" preset's shape with a real vocabulary (32k) and text whose tokens follow Zipf's law.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/check.h"
#include "grad_error.h"

int main(int argc, char** argv) {
  using namespace hr;
  test::GradErrorCase c;
  c.model = models::preset("small");
  c.model.llm.vocab = 32000;
  c.model.image_token_id = 31999;
  c.micro_batches = 8;
  c.micro_batch = 2;
  c.seq = 128;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--vocab")
      c.model.llm.vocab = std::atoll(argv[i + 1]), c.model.image_token_id = c.model.llm.vocab - 1;
    else if (flag == "--micro-batches")
      c.micro_batches = std::atoll(argv[i + 1]);
    else if (flag == "--chunk-rows")
      c.ce_chunk_rows = std::atoll(argv[i + 1]);
    else
      return std::fprintf(stderr, "usage: bench_grad_accum [--vocab V] [--micro-batches N] [--chunk-rows R]\n"), 2;
  }
  const std::vector<test::ParamError> e = test::measure_grad_error(c);
  std::printf(
      "bf16 gradient error against f32: vocab %lld, %lld micro-batches of %lld x %lld tokens, loss chunks of "
      "%s rows\n",
      (long long)c.model.llm.vocab, (long long)c.micro_batches, (long long)c.micro_batch, (long long)c.seq,
      c.ce_chunk_rows ? std::to_string(c.ce_chunk_rows).c_str() : "default");
  std::printf("%-56s %12s %12s %8s\n", "parameter", "bf16 accum", "f32 accum", "ratio");
  std::vector<double> narrow, wide;
  const test::ParamError* worst = nullptr;
  for (const test::ParamError& p : e) {
    if (p.norm < 1e-8) continue;  // a gradient that is zero but for rounding: no relative error to speak of
    narrow.push_back(p.model_accum), wide.push_back(p.f32_accum);
    if (!worst || p.model_accum > worst->model_accum) worst = &p;
    if (p.name.find("embed_tokens") != std::string::npos || p.name.find("lm_head") != std::string::npos)
      std::printf("%-56s %12.3e %12.3e %8.2f\n", p.name.c_str(), p.model_accum, p.f32_accum,
                  p.f32_accum / p.model_accum);
  }
  const double mn = test::median_of(narrow), mw = test::median_of(wide);
  std::printf("%-56s %12.3e %12.3e %8.2f\n", "median over the parameters", mn, mw, mw / mn);
  if (worst)
    std::printf("%-56s %12.3e %12.3e %8.2f\n", ("worst: " + worst->name).c_str(), worst->model_accum, worst->f32_accum,
                worst->f32_accum / worst->model_accum);
  return 0;
}
