// Where an AnyRes image's tokens come from: LLaVA-NeXT's `spatial_unpad` merge (transformers'
// LlavaNextForConditionalGeneration.pack_image_features) and OneVision's `anyres_max_N` pooling on top of it
// (LlavaOnevisionForConditionalGeneration's), or LLaVA's `flat`. The projector's output for an image is
// (1 + rows x cols) crops of T tokens each, flattened to rows c x T + t; the merge is a linear map from those
// rows (plus the learned image_newline) to the image's tokens, which is what a TokenMix holds: the model gathers
// its tokens forward and scatters their gradients back with the same weights, and the planner reads the token
// count off it before any pixel exists.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/ops/embedding.h"
#include "data/anyres.h"
#include "models/config.h"

namespace hr::models {

// Token i of an image is sum over k in [begin[i], begin[i + 1]) of weight[k] x projected row[k]; row -1 is
// image_newline. On a device it is core::mix_rows' map (its backward: core::transpose_mix of it).
struct TokenMix : core::HostMix {
  int64_t tokens() const { return int64_t(begin.size()) - 1; }
  void add(int64_t r, float w) { row.push_back(r), weight.push_back(w); }
  void end_token() { begin.push_back(int64_t(row.size())); }
};

// The mix of one image of `image` pixels (height, width) for a tower of `tower_size` px with `grid` x `grid`
// tokens per crop. Throws naming image_grid_pinpoints / vision_aspect_ratio when they cannot be used.
TokenMix anyres_mix(data::Resolution image, const AnyresConfig& c, int64_t tower_size, int64_t grid);

// The crops an image of `image` pixels is cut into: its base image and the tiles of the pinpoint it is cut for.
int64_t anyres_crops(data::Resolution image, const AnyresConfig& c, int64_t tower_size);

// An image's token count (anyres_mix(...).tokens() without the mix): what its placeholders number.
int64_t anyres_tokens(data::Resolution image, const AnyresConfig& c, int64_t tower_size, int64_t grid);

// The image size whose layout costs the most memory among those of at most `max_tokens` tokens (what a sequence has
// room for): the most crops, then the most tokens. Candidates are each pinpoint at its own size and every image of
// its width or its height that is cut for it (unpadding depends on the aspect ratio alone). Where no layout fits,
// the largest there is (the sequence then cannot hold it, which the planner names). The planner's worst case.
data::Resolution anyres_worst_image(const AnyresConfig& c, int64_t tower_size, int64_t grid,
                                    int64_t max_tokens = INT64_MAX);

// A batch's images together: `mix` makes every image's tokens, in order, from the projected rows of all their crops
// (image i's crops after those of the images before it, grid x grid rows each); image i has tokens[i] tokens and
// crops[i] crops.
struct ImagesMix {
  TokenMix mix;
  std::vector<int64_t> tokens, crops;
  int64_t total_crops = 0;
};
ImagesMix anyres_images(const std::vector<data::Resolution>& images, const AnyresConfig& c, int64_t tower_size,
                        int64_t grid);

}  // namespace hr::models
