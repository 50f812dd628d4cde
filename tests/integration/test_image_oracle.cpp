// Image processors against transformers: the pixel values of CLIPImageProcessor and SiglipImageProcessor on
// images of odd sizes (written by tests/py/check_image_processor.py into $HR_IMAGE_CASES) equal headroom's
// loader's, in both of data.image_aspect_ratio's modes; LlavaNextImageProcessor's and
// LlavaOnevisionImageProcessor's AnyRes crops equal data/anyres.h's.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/io/safetensors.h"
#include "data/anyres.h"
#include "data/image.h"

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
float worst(const std::string& suffix, AspectMode mode, const ImageNorm& norm) {
  const std::string dir = cases_dir();
  const auto cases = ::cases();
  const auto expected = core::SafetensorsFile::open(dir + "/expected.safetensors");
  const int64_t size = cases.at("size").get<int64_t>();
  float most = 0;
  for (const auto& name : cases.at("images")) {
    const std::string n = name.get<std::string>();
    const core::Tensor ours = load_clip_image(dir + "/images/" + n + ".png", size, mode, norm);
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

// LLaVA's pad: expand2square with int(mean x 255), then the processor (which on a square is a plain resize).
TEST(ImageOracle, PadThenProcessorEqualsTransformersForBothTowers) {
  const float s = worst("siglip_pad", AspectMode::Pad, ImageNorm::siglip());
  const float c = worst("clip_pad", AspectMode::Pad, ImageNorm{});
  std::printf("pad: worst difference SigLIP %g, CLIP %g\n", double(s), double(c));
}

// AnyRes: the best pinpoint, the tile count and every tile's pixels, for LLaVA-NeXT's processor (CLIP's steps;
// an odd padding leaves edge tiles one pixel short, which CLIP resizes by the shortest edge and crops) and
// OneVision's (SigLIP's: such a tile is resized whole).
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
    for (const auto& name : c.at("images")) {
      const std::string n = name.get<std::string>();
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
    std::printf("%s: worst difference %g over %zu images\n", k.key, double(most), c.at("images").size());
  }
}

TEST(Anyres, BestResolutionIsLlavasRuleAndPinpointsAreChecked) {
  const std::vector<Resolution> next = {{336, 672}, {672, 336}, {672, 672}, {1008, 336}, {336, 1008}};
  EXPECT_EQ(best_resolution({480, 640}, next), (Resolution{672, 672}));    // a 4:3 photo
  EXPECT_EQ(best_resolution({1200, 300}, next), (Resolution{1008, 336}));  // tall
  EXPECT_EQ(best_resolution({100, 100}, next), (Resolution{336, 672}));    // all keep it whole: the least waste, first
  EXPECT_EQ(fitted_size({480, 640}, {672, 672}), (Resolution{504, 672}));
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
}
