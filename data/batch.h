// A micro-batch as the model takes it (token ids and labels on the host, pixel values on any device), and
// what the model expects of its inputs.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace hr::data {

// What the model expects of its inputs: the data pipeline needs these numbers and nothing else of it.
struct InputSpec {
  int64_t vocab = 32064;           // the tokenizer's ids must fit
  int64_t image_size = 336;        // square images, pixels
  int64_t tokens_per_image = 576;  // placeholders standing for one image in input_ids
  int64_t image_token_id = 32000;
  int64_t ignore_index = -100;  // label of positions without loss
};

// One micro-batch. Token ids and labels are host data (the loader has them there); each image stands in
// input_ids as tokens_per_image consecutive image_token_id placeholders (the expanded format of current
// llava-hf processors), images in row-major order of their placeholders. Sequences are right-padded.
struct Batch {
  int64_t batch = 0, seq = 0;
  std::vector<int64_t> input_ids;  // (batch * seq)
  std::vector<int64_t> labels;     // (batch * seq); ignore_index where no loss
  core::Tensor pixel_values;       // (images, channels, size, size) float on any device; undefined if none
};

}  // namespace hr::data
