// AnyRes token mixes, in transformers' arithmetic (Python floats are IEEE doubles; ATen's bilinear source index is
// a double from a float scale), so that the token count and order equal pack_image_features' for every image
// size, and the pooled tokens its values within float rounding.
#include "models/anyres.h"

#include <cmath>

#include "core/check.h"

namespace hr::models {

namespace {

// Python's float floor division a // b for positive finite operands (fmod-based, as CPython's float_floor_div).
double py_floordiv(double a, double b) {
  const double mod = std::fmod(a, b);
  const double div = (a - mod) / b;
  if (div == 0) return 0;
  double f = std::floor(div);
  if (div - f > 0.5) f += 1.0;
  return f;
}

// Python's int(round(x, 7)) for a positive x: transformers' unpad_image rounds to 7 decimals first (since 4.47)
// so that 54.99999999 from a float product is 55, as the processor's integer count has it.
int64_t int_round7(double x) {
  return int64_t(std::round(x * 1e7) / 1e7);
}

// The rows and columns of the (rows x grid, cols x grid) feature map kept by transformers' unpad_image.
struct Window {
  int64_t y0, y1, x0, x1;
};
Window unpad(data::Resolution image, int64_t height, int64_t width) {
  const double oh = double(image.height), ow = double(image.width), ch = double(height), cw = double(width);
  if (ow / oh > cw / ch) {
    const int64_t new_h = int_round7(oh * (cw / ow));
    const int64_t pad = (height - new_h) / 2;
    return {pad, height - pad, 0, width};
  }
  const int64_t new_w = int_round7(ow * (ch / oh));
  const int64_t pad = (width - new_w) / 2;
  return {0, height, pad, width - pad};
}

// PyTorch's bilinear source indices and weights along one axis (align_corners=False, no scale factor given).
struct Taps {
  int64_t i0, i1;
  float w0, w1;
};
Taps taps(int64_t dst, int64_t in, int64_t out) {
  // ATen's arithmetic: the scale in float, the source index in double (its accumulate type on the CPU).
  const float scale = float(in) / float(out);
  double src = double(scale) * (double(dst) + 0.5) - 0.5;
  if (src < 0) src = 0;
  const auto i0 = int64_t(src);
  const auto l1 = float(std::min(std::max(src - double(i0), 0.0), 1.0));
  return {i0, i0 + (i0 < in - 1 ? 1 : 0), 1.f - l1, l1};
}

// An image's layout: the pinpoint it is cut for (rows x cols tiles), and with spatial_unpad the window of the tiles'
// feature map it keeps and the (out_h, out_w) grid of tokens that window becomes (smaller where OneVision pools).
struct Layout {
  int64_t rows = 0, cols = 0;
  Window w{};
  int64_t h = 0, wd = 0, out_h = 0, out_w = 0;
};

Layout layout_of(data::Resolution image, const AnyresConfig& c, int64_t tower_size, int64_t grid) {
  HR_CHECK(image.height > 0 && image.width > 0, "[image] an image of ", image.height, " x ", image.width, " pixels");
  const data::Resolution best = data::best_resolution(image, c.pinpoints);
  HR_CHECK(best.height % tower_size == 0 && best.width % tower_size == 0,
           "[config] image_grid_pinpoints: ", best.height, " x ", best.width, " is not a multiple of the tower's ",
           tower_size, " px");
  Layout l;
  l.rows = best.height / tower_size;
  l.cols = best.width / tower_size;
  if (c.merge == PatchMerge::Flat) return l;
  l.w = unpad(image, l.rows * grid, l.cols * grid);
  l.h = l.w.y1 - l.w.y0;
  l.wd = l.w.x1 - l.w.x0;
  l.out_h = l.h;
  l.out_w = l.wd;
  if (c.max_num_patches > 0) {  // OneVision: bilinear pooling when the map is above N base images (10% slack)
    const double ratio = std::sqrt(double(l.h * l.wd) / double(c.max_num_patches * grid * grid));
    if (ratio > 1.1)
      l.out_h = int64_t(py_floordiv(double(l.h), ratio)), l.out_w = int64_t(py_floordiv(double(l.wd), ratio));
  }
  return l;
}

}  // namespace

int64_t anyres_tokens(data::Resolution image, const AnyresConfig& c, int64_t tower_size, int64_t grid) {
  const Layout l = layout_of(image, c, tower_size, grid);
  const int64_t per_crop = grid * grid;
  if (c.merge == PatchMerge::Flat) return (1 + l.rows * l.cols) * per_crop;
  return per_crop + l.out_h * (l.out_w + 1);  // the base image, then each row of tokens and its image_newline
}

TokenMix anyres_mix(data::Resolution image, const AnyresConfig& c, int64_t tower_size, int64_t grid) {
  const Layout l = layout_of(image, c, tower_size, grid);
  const int64_t rows = l.rows, cols = l.cols, per_crop = grid * grid;
  TokenMix m;
  auto row_of = [&](int64_t y, int64_t x) {  // a position of the tiles' feature map: its crop's row
    return (1 + (y / grid) * cols + x / grid) * per_crop + (y % grid) * grid + x % grid;
  };
  for (int64_t t = 0; t < per_crop; ++t) m.add(t, 1.f), m.end_token();  // the base image, as it is
  if (c.merge == PatchMerge::Flat) {  // LLaVA's flat: every tile's tokens in order, no newline
    for (int64_t t = per_crop; t < (1 + rows * cols) * per_crop; ++t) m.add(t, 1.f), m.end_token();
    return m;
  }
  const Window w = l.w;
  const int64_t h = l.h, wd = l.wd, out_h = l.out_h, out_w = l.out_w;
  for (int64_t y = 0; y < out_h; ++y) {
    for (int64_t x = 0; x < out_w; ++x) {
      if (out_h == h && out_w == wd) {
        m.add(row_of(w.y0 + y, w.x0 + x), 1.f);
      } else {
        const Taps ty = taps(y, h, out_h), tx = taps(x, wd, out_w);
        m.add(row_of(w.y0 + ty.i0, w.x0 + tx.i0), ty.w0 * tx.w0);
        m.add(row_of(w.y0 + ty.i0, w.x0 + tx.i1), ty.w0 * tx.w1);
        m.add(row_of(w.y0 + ty.i1, w.x0 + tx.i0), ty.w1 * tx.w0);
        m.add(row_of(w.y0 + ty.i1, w.x0 + tx.i1), ty.w1 * tx.w1);
      }
      m.end_token();
    }
    m.add(-1, 1.f), m.end_token();  // image_newline after each row
  }
  return m;
}

int64_t anyres_crops(data::Resolution image, const AnyresConfig& c, int64_t tower_size) {
  const data::Resolution best = data::best_resolution(image, c.pinpoints);
  return 1 + (best.height / tower_size) * (best.width / tower_size);
}

data::Resolution anyres_worst_image(const AnyresConfig& c, int64_t tower_size, int64_t grid, int64_t max_tokens) {
  struct Best {
    data::Resolution image;
    int64_t crops = 0, tokens = 0;
    void offer(data::Resolution at, int64_t k, int64_t t) {
      if (k > crops || (k == crops && t > tokens)) image = at, crops = k, tokens = t;
    }
  } fits, any;
  for (const data::Resolution& p : c.pinpoints) {
    const int64_t crops = anyres_crops(p, c, tower_size);
    any.offer(p, crops, anyres_tokens(p, c, tower_size, grid));
    if (crops < fits.crops) continue;
    auto consider = [&](data::Resolution image) {
      if (!(data::best_resolution(image, c.pinpoints) == p)) return;
      const int64_t t = anyres_tokens(image, c, tower_size, grid);
      if (t <= max_tokens) fits.offer(image, crops, t);
    };
    consider(p);
    for (int64_t h = p.height - 1; h >= 1; --h) consider({h, p.width});
    for (int64_t w = p.width - 1; w >= 1; --w) consider({p.height, w});
  }
  return fits.crops > 0 ? fits.image : any.image;
}

ImagesMix anyres_images(const std::vector<data::Resolution>& images, const AnyresConfig& c, int64_t tower_size,
                        int64_t grid) {
  ImagesMix out;
  for (const data::Resolution& image : images) {
    const TokenMix m = anyres_mix(image, c, tower_size, grid);
    const int64_t base = out.total_crops * grid * grid;
    for (std::size_t k = 0; k < m.row.size(); ++k) out.mix.add(m.row[k] < 0 ? -1 : base + m.row[k], m.weight[k]);
    for (std::size_t t = 1; t < m.begin.size(); ++t)
      out.mix.begin.push_back(out.mix.begin.back() + m.begin[t] - m.begin[t - 1]);
    out.tokens.push_back(m.tokens());
    out.crops.push_back(anyres_crops(image, c, tower_size));
    out.total_crops += out.crops.back();
  }
  return out;
}

}  // namespace hr::models
