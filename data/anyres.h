// High-resolution images as LLaVA-NeXT's AnyRes and LLaVA-OneVision's anyres cut them (transformers'
// LlavaNextImageProcessor and LlavaOnevisionImageProcessor): per image, the best resolution of the model's
// `image_grid_pinpoints` (the largest effective resolution, then the least waste), the image resized into it
// keeping its aspect ratio and padded with black to fill it, cut into tiles of the tower's size, and the whole
// image resized to the tower's size in front of them: 1 + rows x columns crops of (3, size, size).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/batch.h"
#include "data/image.h"

namespace hr::data {

// LLaVA's select_best_resolution: the pinpoint where the image, scaled to fit, keeps the most of its own pixels
// (min(scaled area, original area)), ties broken by the least unused area. Throws when `pinpoints` is empty or
// none keeps a pixel (an image thinner than every pinpoint, where transformers finds none either).
Resolution best_resolution(Resolution image, const std::vector<Resolution>& pinpoints);

// The size the image takes inside `target` (LLaVA-NeXT's _get_patch_output_size): the side that limits the
// scale fills its target, the other is ceil(side x scale), at most its target.
Resolution fitted_size(Resolution image, Resolution target);

struct AnyresImage {
  core::Tensor pixels;  // (1 + rows x cols, 3, size, size) f32 on the host: the whole image, then the tiles row-major
  Resolution original;  // the image's size (transformers' image_sizes)
  Resolution best;      // the pinpoint it was cut for
  int64_t rows = 0, cols = 0;
};

// The processor's steps for `kind`: tiles and the whole image are made as above, then each is brought to
// size x size as the tower's processor does (CLIP: shortest edge to `size` and a centre crop; SigLIP: a resize of
// the whole tile; both are no-ops on the tiles, which are exact), rescaled by 1/255 and normalised by `norm`.
// `name` stands for the image in errors.
AnyresImage anyres_image(const RgbImage& image, const std::vector<Resolution>& pinpoints, int64_t size,
                         ImageProcessor kind, const ImageNorm& norm, const std::string& name);

// The pinpoints of a config.json or preprocessor_config.json (`image_grid_pinpoints`: [[h, w], ...]), checked:
// positive multiples of `size`, at most 64 tiles each. Throws naming `where`.
std::vector<Resolution> parse_pinpoints(const std::vector<std::vector<int64_t>>& raw, int64_t size,
                                        const std::string& where);

}  // namespace hr::data
