// A micro-batch as the model takes it (token ids and labels on the host, pixel values on any device), and
// what the model expects of its inputs.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace hr::data {

// A resolution in pixels, height first (image_grid_pinpoints' [height, width], transformers' image_sizes).
struct Resolution {
  int64_t height = 0, width = 0;
  auto operator<=>(const Resolution&) const = default;
};

// What the model expects of its inputs: the data pipeline needs these numbers and nothing else of it.
struct InputSpec {
  int64_t vocab = 32064;           // the tokenizer's ids must fit
  int64_t image_size = 336;        // square images, pixels
  int64_t tokens_per_image = 576;  // placeholders standing for one image in input_ids
  int64_t image_token_id = 32000;
  int64_t ignore_index = -100;  // label of positions without loss
  // AnyRes (LLaVA-NeXT): the pinpoints each image is cut for (empty: one square image of image_size), and the token
  // count of an image of a given size (models/anyres.h), which its placeholders number instead of tokens_per_image.
  std::vector<Resolution> pinpoints;
  std::function<int64_t(Resolution)> anyres_tokens;
  bool anyres() const { return !pinpoints.empty(); }
};

// One micro-batch. Token ids and labels are host data (the loader has them there); each image stands in
// input_ids as tokens_per_image consecutive image_token_id placeholders (the expanded format of current
// llava-hf processors), images in row-major order of their placeholders. Sequences are right-padded.
struct Batch {
  int64_t batch = 0, seq = 0;
  std::vector<int64_t> input_ids;  // (batch * seq)
  std::vector<int64_t> labels;     // (batch * seq); ignore_index where no loss
  core::Tensor pixel_values;       // (images, channels, size, size) float on any device; undefined if none
  // AnyRes (LLaVA-NeXT): each image's size before processing, in the order of its placeholders; pixel_values then
  // holds each image's crops in turn (its base image, then its tiles row-major: 1 + rows x cols of them, the grid
  // image_grid_pinpoints picks for that size), and the image's placeholders number its token count
  // (models/anyres.h). Empty without AnyRes.
  std::vector<Resolution> image_sizes;
};

// The batch's images: image_sizes' count with AnyRes, pixel_values' rows otherwise.
inline int64_t images_of(const Batch& b) {
  if (!b.image_sizes.empty()) return int64_t(b.image_sizes.size());
  return b.pixel_values.defined() ? b.pixel_values.size(0) : 0;
}

// A batch as one safetensors file (what `headroom debug batch` writes and `debug grads` reads): input_ids and labels
// (batch, seq) i64, optionally pixel_values and image_sizes (images, 2) i64. Errors name the file.
Batch read_batch_file(const std::string& path);
void write_batch_file(const std::string& path, const Batch& b);

}  // namespace hr::data
