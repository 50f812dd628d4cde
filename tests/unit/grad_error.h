// How far a 16-bit model's gradients are from an f32 model's with the same weights and data, after gradient
// accumulation over several micro-batches of text whose tokens follow Zipf's law (as words do: a few ids take much
// of the text, so embedding rows receive many adds): per parameter, ||g - g_f32|| / ||g_f32||. Measured with the
// gradients accumulated in the model's dtype and in f32 (memory.grad_accum_dtype), for the unit test that holds f32
// accumulation to being better and for the benchmark that reports the figures (tests/bench/bench_grad_accum.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/config.h"

namespace hr::test {

struct GradErrorCase {
  models::LlavaConfig model;
  int64_t micro_batch = 2, seq = 64, micro_batches = 8;
  int64_t ce_chunk_rows = 0;  // the fused loss's rows per chunk (0: the back-end's default)
  core::DType dtype = core::DType::BF16;
  uint64_t seed = 7;
};

struct ParamError {
  std::string name;
  double model_accum = 0, f32_accum = 0;  // relative errors against the f32 run
  double norm = 0;                        // ||g_f32||
};

// Every trainable parameter with a gradient, in the store's order.
std::vector<ParamError> measure_grad_error(const GradErrorCase& c);

double median_of(std::vector<double> v);

}  // namespace hr::test
