// AnyRes tiling, step for step as transformers' LlavaNextImageProcessor / LlavaOnevisionImageProcessor
// (get_image_patches, _resize_for_patching, _pad_for_patching, divide_to_patches, _preprocess), on 8-bit
// images with Pillow's bicubic (resize_bicubic), so that the pixels are the same bytes.
#include "data/anyres.h"

#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/memory/category.h"

namespace hr::data {

using namespace hr::core;

Resolution best_resolution(Resolution image, const std::vector<Resolution>& pinpoints) {
  HR_CHECK(!pinpoints.empty(), "[image] image_grid_pinpoints is empty");
  const double h = double(image.height), w = double(image.width);
  Resolution best;
  int64_t most_effective = 0, least_wasted = INT64_MAX;
  for (const Resolution& p : pinpoints) {
    // LLaVA's arithmetic: a float scale, the scaled sides truncated.
    const double scale = std::min(double(p.width) / w, double(p.height) / h);
    const auto scaled_w = int64_t(w * scale), scaled_h = int64_t(h * scale);
    const int64_t effective = std::min(scaled_w * scaled_h, image.width * image.height);
    const int64_t wasted = p.width * p.height - effective;
    if (effective > most_effective || (effective == most_effective && wasted < least_wasted)) {
      most_effective = effective;
      least_wasted = wasted;
      best = p;
    }
  }
  HR_CHECK(most_effective > 0, "[image] an image of ", image.height, " x ", image.width,
           " pixels keeps none of its pixels in any of image_grid_pinpoints (it is thinner than the thinnest): "
           "transformers cannot process it either");
  return best;
}

Resolution fitted_size(Resolution image, Resolution target) {
  const double scale_w = double(target.width) / double(image.width);
  const double scale_h = double(target.height) / double(image.height);
  if (scale_w < scale_h)
    return {std::min(int64_t(std::ceil(double(image.height) * scale_w)), target.height), target.width};
  return {target.height, std::min(int64_t(std::ceil(double(image.width) * scale_h)), target.width)};
}

namespace {

// `img` pasted into a black `target` with floor((target - fitted) / 2) above and to the left, the rest below and to
// the right (LLaVA-NeXT's resize_and_pad_image, and transformers' _pad_for_patching since 4.52; before, it padded
// both sides by the floor and left the image one pixel short on an odd difference).
RgbImage pad_black(const RgbImage& img, Resolution target) {
  const int w = int(target.width), h = int(target.height);
  const int top = (h - img.height) / 2, left = (w - img.width) / 2;
  RgbImage out{w, h, std::vector<uint8_t>(std::size_t(w) * std::size_t(h) * 3, 0)};
  for (int r = 0; r < img.height; ++r)
    std::memcpy(&out.pixels[(std::size_t(r + top) * std::size_t(w) + std::size_t(left)) * 3],
                &img.pixels[std::size_t(r) * std::size_t(img.width) * 3], std::size_t(img.width) * 3);
  return out;
}

}  // namespace

AnyresImage anyres_image(const RgbImage& image, const std::vector<Resolution>& pinpoints, int64_t size,
                         ImageProcessor kind, const ImageNorm& norm, const std::string& name) {
  HR_CHECK(image.width > 0 && image.height > 0, "[image] ", name, " has no pixels");
  AnyresImage out;
  out.original = {image.height, image.width};
  out.best = best_resolution(out.original, pinpoints);
  const Resolution fit = fitted_size(out.original, out.best);
  const RgbImage resized = resize_bicubic(image, int(fit.width), int(fit.height));
  const RgbImage padded = pad_black(resized, out.best);
  const int s = int(size);
  std::vector<RgbImage> crops{resize_bicubic(image, s, s)};  // the whole image, squashed to the square
  for (int y = 0; y < padded.height; y += s)
    for (int x = 0; x < padded.width; x += s) crops.push_back(crop(padded, x, y, s, s));
  out.rows = (padded.height + s - 1) / s;
  out.cols = (padded.width + s - 1) / s;
  {
    MemoryScope scope(Category::IO, "loader");
    out.pixels = Tensor::empty({int64_t(crops.size()), 3, size, size}, DType::F32, Device::host());
  }
  for (std::size_t i = 0; i < crops.size(); ++i) {
    const RgbImage& c = crops[i];
    const RgbImage square = c.width == s && c.height == s  ? c
                            : kind == ImageProcessor::Clip ? shortest_edge_and_crop(c, s)
                                                           : resize_bicubic(c, s, s);
    const Tensor t = clip_tensor(square, size, norm);
    std::memcpy(out.pixels.data<float>() + i * std::size_t(3 * size * size), t.data<float>(),
                std::size_t(3 * size * size) * sizeof(float));
  }
  return out;
}

std::vector<Resolution> parse_pinpoints(const std::vector<std::vector<int64_t>>& raw, int64_t size,
                                        const std::string& where) {
  HR_CHECK(!raw.empty(), "[config] ", where, ": image_grid_pinpoints is empty");
  std::vector<Resolution> out;
  for (std::size_t i = 0; i < raw.size(); ++i) {
    const auto& p = raw[i];
    HR_CHECK(p.size() == 2, "[config] ", where, ": image_grid_pinpoints[", i, "] is not a [height, width] pair");
    HR_CHECK(p[0] > 0 && p[1] > 0 && p[0] % size == 0 && p[1] % size == 0, "[config] ", where,
             ": image_grid_pinpoints[", i, "] = [", p[0], ", ", p[1], "] is not a positive multiple of the tower's ",
             size, " px on both sides");
    HR_CHECK((p[0] / size) * (p[1] / size) <= 64, "[config] ", where, ": image_grid_pinpoints[", i, "] = [", p[0], ", ",
             p[1], "] makes ", (p[0] / size) * (p[1] / size), " tiles of ", size, " px; at most 64 are taken");
    out.push_back({p[0], p[1]});
  }
  return out;
}

}  // namespace hr::data
