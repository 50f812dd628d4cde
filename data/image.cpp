// Image decode (stb), padding, bicubic resize and CLIP normalisation.
#include "data/image.h"

#include <stb/stb_image.h>
#include <stb/stb_image_write.h>

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/memory/category.h"

namespace hr::data {

using namespace hr::core;

namespace {
constexpr float kClipMean[3] = {0.48145466f, 0.4578275f, 0.40821073f};
constexpr float kClipStd[3] = {0.26862954f, 0.26130258f, 0.27577711f};

double cubic(double x) {  // Keys kernel with a = -0.5
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2) return (((x - 5) * x + 8) * x - 4) * a;
  return 0;
}

// Resamples one axis: for each output index, weights over input indices (PIL's precomputed coefficients).
struct Axis {
  std::vector<int> first;
  std::vector<std::vector<double>> weights;
};

Axis make_axis(int in, int out) {
  Axis ax;
  const double scale = double(in) / out, filter_scale = std::max(scale, 1.0), support = 2.0 * filter_scale;
  for (int o = 0; o < out; ++o) {
    const double center = (o + 0.5) * scale;
    int lo = std::max(0, int(std::floor(center - support))), hi = std::min(in, int(std::ceil(center + support)));
    std::vector<double> w;
    double total = 0;
    for (int i = lo; i < hi; ++i) {
      double v = cubic((i + 0.5 - center) / filter_scale);
      w.push_back(v);
      total += v;
    }
    for (double& v : w) v /= total;
    ax.first.push_back(lo);
    ax.weights.push_back(std::move(w));
  }
  return ax;
}
}  // namespace

AspectMode parse_aspect(const std::string& s) {
  if (s == "pad") return AspectMode::Pad;
  if (s == "resize" || s == "square") return AspectMode::Resize;
  throw Error(str("[config] data.image_aspect_ratio '", s, "' is not one of: pad, resize"));
}

RgbImage decode_image(const std::string& path) {
  int w = 0, h = 0, c = 0;
  unsigned char* data = stbi_load(path.c_str(), &w, &h, &c, 3);
  HR_CHECK(data, "[image] ", path, ": cannot decode (", stbi_failure_reason() ? stbi_failure_reason() : "unknown", ")");
  RgbImage img{w, h, std::vector<uint8_t>(data, data + std::size_t(w) * h * 3)};
  stbi_image_free(data);
  return img;
}

void write_png(const std::string& path, const RgbImage& image) {
  HR_CHECK(stbi_write_png(path.c_str(), image.width, image.height, 3, image.pixels.data(), image.width * 3),
           "[image] cannot write ", path);
}

RgbImage expand_to_square(const RgbImage& img, const uint8_t fill[3]) {
  if (img.width == img.height) return img;
  const int side = std::max(img.width, img.height);
  RgbImage out{side, side, std::vector<uint8_t>(std::size_t(side) * side * 3)};
  for (int i = 0; i < side * side; ++i)
    for (int ch = 0; ch < 3; ++ch) out.pixels[std::size_t(i) * 3 + ch] = fill[ch];
  const int ox = (side - img.width) / 2, oy = (side - img.height) / 2;
  for (int y = 0; y < img.height; ++y)
    std::copy_n(&img.pixels[std::size_t(y) * img.width * 3], img.width * 3,
                &out.pixels[(std::size_t(y + oy) * side + ox) * 3]);
  return out;
}

RgbImage resize_bicubic(const RgbImage& img, int width, int height) {
  if (img.width == width && img.height == height) return img;
  Axis ax = make_axis(img.width, width), ay = make_axis(img.height, height);
  std::vector<double> tmp(std::size_t(img.height) * width * 3);
  for (int y = 0; y < img.height; ++y)
    for (int x = 0; x < width; ++x)
      for (int ch = 0; ch < 3; ++ch) {
        double s = 0;
        for (std::size_t k = 0; k < ax.weights[x].size(); ++k)
          s += ax.weights[x][k] * img.pixels[(std::size_t(y) * img.width + ax.first[x] + k) * 3 + ch];
        tmp[(std::size_t(y) * width + x) * 3 + ch] = s;
      }
  RgbImage out{width, height, std::vector<uint8_t>(std::size_t(width) * height * 3)};
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int ch = 0; ch < 3; ++ch) {
        double s = 0;
        for (std::size_t k = 0; k < ay.weights[y].size(); ++k)
          s += ay.weights[y][k] * tmp[((ay.first[y] + k) * std::size_t(width) + x) * 3 + ch];
        out.pixels[(std::size_t(y) * width + x) * 3 + ch] = uint8_t(std::clamp(std::lround(s), 0L, 255L));
      }
  return out;
}

Tensor clip_tensor(const RgbImage& sq, int64_t size) {
  RgbImage img = resize_bicubic(sq, int(size), int(size));
  MemoryScope scope(Category::IO, "loader");
  Tensor t = Tensor::empty({3, size, size}, DType::F32, Device::host());
  float* p = t.data<float>();
  for (int64_t ch = 0; ch < 3; ++ch)
    for (int64_t i = 0; i < size * size; ++i)
      p[ch * size * size + i] = (img.pixels[std::size_t(i) * 3 + ch] / 255.f - kClipMean[ch]) / kClipStd[ch];
  return t;
}

Tensor load_clip_image(const std::string& path, int64_t size, AspectMode mode) {
  RgbImage img = decode_image(path);
  if (mode == AspectMode::Pad) {
    const uint8_t fill[3] = {uint8_t(std::lround(kClipMean[0] * 255)), uint8_t(std::lround(kClipMean[1] * 255)),
                             uint8_t(std::lround(kClipMean[2] * 255))};
    img = expand_to_square(img, fill);
  }
  return clip_tensor(img, size);
}

}  // namespace hr::data
