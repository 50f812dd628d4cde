// Image processors against transformers: the pixel values of CLIPImageProcessor and SiglipImageProcessor on
// images of odd sizes (written by tests/py/check_image_processor.py into $HR_IMAGE_CASES) equal headroom's
// loader's, in each of data.image_aspect_ratio's modes; LlavaNextImageProcessor's and
// LlavaOnevisionImageProcessor's AnyRes crops equal data/anyres.h's; pack_image_features' tokens equal
// models/anyres.h's mixes of the same features.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/io/safetensors.h"
#include "core/ops/embedding.h"
#include "data/anyres.h"
#include "data/image.h"
#include "models/anyres.h"

namespace {

using namespace hr;
using namespace hr::data;

std::string cases_dir() {
  const char* d = std::getenv("HR_IMAGE_CASES");
  return d ? d : "";
}

nlohmann::json cases() {
  return nlohmann::json::parse(std::ifstream(cases_dir() + "/cases.json"));
}

float max_difference(const core::Tensor& ours, const core::Tensor& theirs) {
  const float* a = ours.data<float>();
  const float* b = theirs.data<float>();
  float most = 0;
  for (int64_t i = 0; i < ours.numel(); ++i) most = std::max(most, std::fabs(a[i] - b[i]));
  return most;
}

// The largest difference from transformers' pixels over every image of the cases, for one mode and processor.
float worst(const std::string& suffix, AspectMode mode, const ImageNorm& norm,
            ImageProcessor processor = ImageProcessor::Clip) {
  const std::string dir = cases_dir();
  const auto cases = ::cases();
  const auto expected = core::SafetensorsFile::open(dir + "/expected.safetensors");
  const int64_t size = cases.at("size").get<int64_t>();
  float most = 0;
  for (const auto& name : cases.at("images")) {
    const std::string n = name.get<std::string>();
    const core::Tensor ours = load_clip_image(dir + "/images/" + n + ".png", size, mode, norm, processor);
    const core::Tensor theirs = expected.get(n + "." + suffix);
    EXPECT_EQ(ours.shape(), theirs.shape()) << n;
    if (ours.shape() != theirs.shape()) continue;
    const float here = max_difference(ours, theirs);
    EXPECT_LT(here, 1e-5f) << n << " " << suffix;
    most = std::max(most, here);
  }
  return most;
}

}  // namespace

TEST(ImageOracle, CasesWereWritten) {
  ASSERT_FALSE(cases_dir().empty()) << "HR_IMAGE_CASES is not set (ctest sets it: image.transformers)";
}

// SiglipImageProcessor resizes the whole image to size x size (no crop): headroom's `resize` mode. Its mean and
// std come from the file transformers wrote.
TEST(ImageOracle, SiglipResizeEqualsSiglipImageProcessor) {
  const ImageNorm norm = read_preprocessor_config(cases_dir() + "/siglip/preprocessor_config.json", 24);
  EXPECT_EQ(norm.mean[0], 0.5f);
  EXPECT_EQ(norm.std[2], 0.5f);
  const float w = worst("siglip_resize", AspectMode::Resize, norm);
  std::printf("SiglipImageProcessor, resize: worst difference %g\n", double(w));
}

// LLaVA's default (any image_aspect_ratio but pad and anyres): the processor on the image as it is. CLIP's is the
// shortest edge to the size and a centre crop; SigLIP's, the resize above.
TEST(ImageOracle, SquareEqualsEachTowersImageProcessor) {
  const float c = worst("clip_square", AspectMode::Square, ImageNorm{});
  const float s = worst("siglip_resize", AspectMode::Square, ImageNorm::siglip(), ImageProcessor::Siglip);
  std::printf("square: worst difference CLIP %g, SigLIP %g\n", double(c), double(s));
}

// LLaVA's pad: expand2square with int(mean x 255), then the processor (which on a square is a plain resize).
TEST(ImageOracle, PadThenProcessorEqualsTransformersForBothTowers) {
  const float s = worst("siglip_pad", AspectMode::Pad, ImageNorm::siglip());
  const float c = worst("clip_pad", AspectMode::Pad, ImageNorm{});
  std::printf("pad: worst difference SigLIP %g, CLIP %g\n", double(s), double(c));
}

// AnyRes: the best pinpoint, the tile count and every tile's pixels, for LLaVA-NeXT's processor (CLIP's steps)
// and OneVision's (SigLIP's), with an odd padding's extra pixel below or to the right as today's transformers and
// LLaVA-NeXT's code put it.
TEST(ImageOracle, AnyresCropsEqualLlavaNextAndOnevisionProcessors) {
  const std::string dir = cases_dir();
  const auto c = cases();
  const int64_t size = c.at("size").get<int64_t>();
  const auto expected = core::SafetensorsFile::open(dir + "/expected.safetensors");
  struct Kind {
    const char* key;
    ImageProcessor processor;
    ImageNorm norm;
  };
  for (const Kind& k : {Kind{"next", ImageProcessor::Clip, ImageNorm{}},
                        Kind{"onevision", ImageProcessor::Siglip, ImageNorm::siglip()}}) {
    const auto pinpoints =
        parse_pinpoints(c.at(std::string(k.key) + "_pinpoints").get<std::vector<std::vector<int64_t>>>(), size, k.key);
    float most = 0;
    // Images transformers' own processor cuts against its own best resolution (a 1-pixel side read as channels):
    // named by the checker, and few.
    std::set<std::string> skip;
    if (c.contains("inconsistent") && c.at("inconsistent").contains(k.key))
      for (const auto& n : c.at("inconsistent").at(k.key)) skip.insert(n.get<std::string>());
    EXPECT_LE(skip.size(), 1u) << k.key;
    for (const auto& name : c.at("images")) {
      const std::string n = name.get<std::string>();
      if (skip.count(n)) {
        std::printf("%s: %s skipped (transformers cuts it against its own best resolution)\n", k.key, n.c_str());
        continue;
      }
      const AnyresImage a =
          anyres_image(decode_image(dir + "/images/" + n + ".png"), pinpoints, size, k.processor, k.norm, n);
      const core::Tensor best = expected.get(n + "." + k.key + "_best");
      EXPECT_EQ(a.best.height, best.data<int64_t>()[0]) << n << " " << k.key;
      EXPECT_EQ(a.best.width, best.data<int64_t>()[1]) << n << " " << k.key;
      const core::Tensor theirs = expected.get(n + "." + k.key);
      ASSERT_EQ(a.pixels.shape(), theirs.shape()) << n << " " << k.key;
      EXPECT_EQ(a.pixels.size(0), 1 + a.rows * a.cols) << n;
      const float d = max_difference(a.pixels, theirs);
      EXPECT_LT(d, 1e-5f) << n << " " << k.key;
      most = std::max(most, d);
    }
    std::printf("%s: worst difference %g over %zu images\n", k.key, double(most), c.at("images").size() - skip.size());
  }
}

TEST(Anyres, BestResolutionIsLlavasRuleAndPinpointsAreChecked) {
  const std::vector<Resolution> next = {{336, 672}, {672, 336}, {672, 672}, {1008, 336}, {336, 1008}};
  EXPECT_EQ(best_resolution({480, 640}, next), (Resolution{672, 672}));    // a 4:3 photo
  EXPECT_EQ(best_resolution({1200, 300}, next), (Resolution{1008, 336}));  // tall
  EXPECT_EQ(best_resolution({100, 100}, next), (Resolution{336, 672}));    // all keep it whole: the least waste, first
  EXPECT_EQ(fitted_size({480, 640}, {672, 672}), (Resolution{504, 672}));
  // Thinner than every pinpoint: no pinpoint keeps a pixel (transformers' select_best_resolution returns None).
  try {
    best_resolution({2, 2100}, next);
    ADD_FAILURE() << "a 2 x 2100 image was given a resolution";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 x 2100 pixels keeps none of its pixels"), std::string::npos) << e.what();
  }
  auto error = [](std::vector<std::vector<int64_t>> raw) {
    try {
      parse_pinpoints(raw, 336, "config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error({{336, 700}}).find("image_grid_pinpoints[0] = [336, 700] is not a positive multiple"),
            std::string::npos);
  EXPECT_NE(error({{336}}).find("not a [height, width] pair"), std::string::npos);
  EXPECT_NE(error({}).find("is empty"), std::string::npos);
  EXPECT_NE(error({{336 * 9, 336 * 8}}).find("makes 72 tiles"), std::string::npos);
  // LLaVA's flat merge: the base image's and every tile's tokens in order, no newline (a 4:3 photo: 2 x 2 tiles).
  models::AnyresConfig flat{next, models::PatchMerge::Flat, 0};
  const models::TokenMix m = models::anyres_mix({480, 640}, flat, 336, 24);
  ASSERT_EQ(m.tokens(), 5 * 576);
  for (int64_t t = 0; t < m.tokens(); ++t) EXPECT_EQ(m.row[std::size_t(t)], t);
  EXPECT_EQ(models::parse_patch_merge("spatial_unpad"), models::PatchMerge::SpatialUnpad);
  try {
    models::parse_patch_merge("maxpool2x2");
    ADD_FAILURE() << "maxpool2x2 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mm_patch_merge_type 'maxpool2x2' is not one of: spatial_unpad, flat"),
              std::string::npos);
  }
}

// The tokens of AnyRes images from their crops' projected features: LLaVA-NeXT's spatial_unpad (the tiles' map
// un-padded to the image's aspect ratio, image_newline after each row) and OneVision's anyres_max_9 (the same,
// bilinearly pooled when the map holds more than 9 base images' worth), for 23 image sizes from 1 x 1000 to
// 4000 x 3000: the token counts equal transformers', and the tokens within float rounding of its bilinear
// weights.
TEST(ImageOracle, AnyresTokenMixesEqualPackImageFeatures) {
  const auto c = cases();
  const auto expected = core::SafetensorsFile::open(cases_dir() + "/expected.safetensors");
  const core::Tensor newline = expected.get("mix.newline");
  const auto sizes = c.at("mix_sizes").get<std::vector<std::vector<int64_t>>>();
  struct Kind {
    const char* key;
    const char* pins;
    int64_t tower, grid, max_patches;
  };
  for (const Kind& k : {Kind{"next", "next_336", 336, 24, 0}, Kind{"onevision", "onevision_384", 384, 27, 9}}) {
    models::AnyresConfig ac;
    ac.pinpoints = parse_pinpoints(c.at(k.pins).get<std::vector<std::vector<int64_t>>>(), k.tower, k.pins);
    ac.max_num_patches = k.max_patches;
    float most = 0;
    int64_t tokens = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const models::TokenMix m = models::anyres_mix({sizes[i][0], sizes[i][1]}, ac, k.tower, k.grid);
      const core::Tensor in = expected.get(str("mix.", i, ".", k.key, "_in"));
      const core::Tensor out = expected.get(str("mix.", i, ".", k.key, "_out"));
      ASSERT_EQ(m.tokens(), out.size(0)) << k.key << " " << sizes[i][0] << " x " << sizes[i][1];
      const float* f = in.data<float>();
      const float* o = out.data<float>();
      for (int64_t t = 0; t < m.tokens(); ++t)
        for (int64_t ch = 0; ch < 3; ++ch) {
          double v = 0;
          for (int64_t e = m.begin[std::size_t(t)]; e < m.begin[std::size_t(t) + 1]; ++e) {
            const int64_t r = m.row[std::size_t(e)];
            ASSERT_LT(r, in.size(0) * in.size(1));
            v += double(m.weight[std::size_t(e)]) * (r < 0 ? newline.data<float>()[ch] : f[r * 3 + ch]);
          }
          most = std::max(most, float(std::fabs(v - double(o[t * 3 + ch]))));
        }
      tokens += m.tokens();
    }
    EXPECT_LT(most, 2e-6f) << k.key;
    // The kernel-table op with the same mix: its tokens equal the loop's above, and its backward (the transposed
    // mix) is the forward's adjoint: <mix(x), dy> = <x, mix^T(dy)> over the crops' rows and the newline.
    const std::size_t i = sizes.size() - 1;
    const models::TokenMix m = models::anyres_mix({sizes[i][0], sizes[i][1]}, ac, k.tower, k.grid);
    const core::Tensor in = expected.get(str("mix.", i, ".", k.key, "_in"));
    const core::Tensor src = in.reshape({in.size(0) * in.size(1), 3}).to(core::Device::cpu());
    const core::Tensor nl = newline.to(core::Device::cpu());
    auto ints = [](const std::vector<int64_t>& v) {
      return core::Tensor::from_ints(v, {int64_t(v.size())}, core::DType::I64, core::Device::cpu());
    };
    auto floats = [](const std::vector<float>& v) {
      return core::Tensor::from_floats(v, {int64_t(v.size())}, core::DType::F32, core::Device::cpu());
    };
    const core::Tensor out = core::mix_rows(src, nl, ints(m.begin), ints(m.row), floats(m.weight));
    const std::vector<float> got = out.to_floats(), want = expected.get(str("mix.", i, ".", k.key, "_out")).to_floats();
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t e = 0; e < got.size(); ++e) EXPECT_NEAR(got[e], want[e], 2e-6) << k.key << " element " << e;
    std::vector<float> dy(got.size());
    for (std::size_t e = 0; e < dy.size(); ++e) dy[e] = float(std::sin(double(e)));
    const core::HostMix t = core::transpose_mix(m.begin, m.row, m.weight, src.size(0));
    const std::vector<float> dx =
        core::mix_rows(core::Tensor::from_floats(dy, {out.size(0), 3}, core::DType::F32, core::Device::cpu()), {},
                       ints(t.begin), ints(t.row), floats(t.weight))
            .to_floats();
    ASSERT_EQ(dx.size(), std::size_t(src.size(0) + 1) * 3);
    const std::vector<float> x = src.to_floats(), n = nl.to_floats();
    double lhs = 0, rhs = 0;
    for (std::size_t e = 0; e < got.size(); ++e) lhs += double(got[e]) * dy[e];
    for (std::size_t e = 0; e < x.size(); ++e) rhs += double(x[e]) * dx[e];
    for (std::size_t ch = 0; ch < 3; ++ch) rhs += double(n[ch]) * dx[x.size() + ch];
    EXPECT_NEAR(lhs, rhs, 1e-5 * std::max(1.0, std::fabs(lhs))) << k.key;
    std::printf("%s: %lld tokens over %zu images, worst difference %g\n", k.key, (long long)tokens, sizes.size(),
                double(most));
  }
}
