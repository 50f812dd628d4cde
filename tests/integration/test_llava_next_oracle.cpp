// LLaVA-NeXT's and LLaVA-OneVision's AnyRes model side against transformers: a tiny random
// LlavaNextForConditionalGeneration directory (CLIP, LLaMA) and a LlavaOnevisionForConditionalGeneration one (SigLIP,
// Qwen2, anyres_max_1: the larger images' tile features pooled), each with a batch of images of mixed sizes (written
// by tests/py/check_llava_next.py into $HR_LLAVA_NEXT_CASES and its onevision/), give headroom the same configuration,
// parameter count, token counts per image, loss, logits and every gradient (image_newline's too), in f32 within 1e-4
// relative.
#include <gtest/gtest.h>

#include <cstdlib>

#include "core/io/safetensors.h"
#include "core/memory/category.h"
#include "models/anyres.h"
#include "models/hf_config.h"
#include "models/llava.h"
#include "models/weights.h"
#include "tests/unit/golden_util.h"

namespace {

using namespace hr;
using namespace hr::core;
using namespace hr::models;

// The model family of a case directory: "" (LLaVA-NeXT) or "onevision/".
class AnyresOracle : public testing::TestWithParam<std::string> {
 protected:
  std::string cases(const std::string& file) const {
    const char* d = std::getenv("HR_LLAVA_NEXT_CASES");
    return std::string(d ? d : "") + "/" + GetParam() + file;
  }
  bool onevision() const { return GetParam() == "onevision/"; }
};

struct Result {
  float loss = 0;
  LlavaState st;
};

Result forward_backward(const Llava& model, const data::Batch& batch, int64_t ce_chunk_rows) {
  ModelOptions opt;
  opt.return_logits = true;
  opt.ce_chunk_rows = ce_chunk_rows;
  Result r;
  r.loss = model.forward(batch, r.st, opt);
  model.backward(r.st);
  return r;
}

}  // namespace

TEST_P(AnyresOracle, ConfigAndParameterCountAreTransformers) {
  const LlavaConfig c = read_hf_config(cases("hf"));
  ASSERT_TRUE(c.anyres.on());
  EXPECT_EQ(c.anyres.merge, PatchMerge::SpatialUnpad);
  EXPECT_EQ(c.anyres.pinpoints.size(), onevision() ? 9u : 5u);
  EXPECT_EQ(c.anyres.pinpoints[3], (onevision() ? data::Resolution{24, 12} : data::Resolution{36, 12}));
  EXPECT_EQ(c.anyres.max_num_patches, onevision() ? 1 : 0);
  EXPECT_EQ(c.vision.tower, onevision() ? Tower::Siglip : Tower::Clip);
  EXPECT_EQ(c.llm.decoder, onevision() ? Decoder::Qwen2 : Decoder::Llama);
  EXPECT_TRUE(c.image_newline());
  const SafetensorsFile ref = SafetensorsFile::open(cases("ref.safetensors"));
  EXPECT_EQ(c.parameter_count(), ref.get("parameters").to_ints()[0]);
  Llava model(c, Device::cpu(), DType::F32);
  int64_t n = 0;
  for (const auto& p : model.params().all()) n += p->count();
  EXPECT_EQ(n, c.parameter_count());
  // and back: the config.json headroom writes reads as the same model
  const nlohmann::json written = to_hf_config(c, DType::F32);
  EXPECT_EQ(written.at("architectures")[0],
            onevision() ? "LlavaOnevisionForConditionalGeneration" : "LlavaNextForConditionalGeneration");
  const LlavaConfig back = from_hf_config(written, "written");
  EXPECT_EQ(back.anyres.pinpoints, c.anyres.pinpoints);
  EXPECT_EQ(back.anyres.max_num_patches, c.anyres.max_num_patches);
  EXPECT_EQ(back.vision.select_layer, c.vision.select_layer);
  EXPECT_EQ(back.vision.select_feature, c.vision.select_feature);
  EXPECT_EQ(back.parameter_count(), c.parameter_count());
}

TEST_P(AnyresOracle, EachImageHasTheTokensTransformersGivesIt) {
  const LlavaConfig c = read_hf_config(cases("hf"));
  const data::Batch batch = test::load_batch(cases("batch.safetensors"));
  const ImagesMix m = anyres_images(batch.image_sizes, c.anyres, c.vision.image_size, c.vision.grid());
  const SafetensorsFile ref = SafetensorsFile::open(cases("ref.safetensors"));
  EXPECT_EQ(m.tokens, ref.get("tokens").to_ints());
  EXPECT_EQ(m.total_crops, batch.pixel_values.size(0));
  // OneVision's case pools some images and not others; LLaVA-NeXT pools none.
  int64_t pooled = 0;
  for (int64_t p : ref.get("pooled").to_ints()) pooled += p;
  if (onevision()) {
    EXPECT_GT(pooled, 0);
    EXPECT_LT(pooled, int64_t(batch.image_sizes.size()));
  } else {
    EXPECT_EQ(pooled, 0);
  }
}

TEST_P(AnyresOracle, LossLogitsAndEveryGradientMatchTransformers) {
  const LlavaConfig c = read_hf_config(cases("hf"));
  Llava model(c, Device::cpu(), DType::F32);
  load_weights(model.params(), Checkpoint::open(cases("hf")));
  const data::Batch batch = test::load_batch(cases("batch.safetensors"));
  const SafetensorsFile ref = SafetensorsFile::open(cases("ref.safetensors"));
  const Result r = forward_backward(model, batch, 13);  // several loss chunks, the last one partial
  const float want = ref.get("loss").item();
  EXPECT_NEAR(r.loss, want, 1e-5 * std::fabs(want));
  auto check = [&](const std::string& name, const Tensor& got) {
    const Tensor theirs = ref.get(name);
    ASSERT_EQ(got.shape(), theirs.shape()) << name;
    const test::Mismatch m = test::compare(got.to_floats(), theirs.to_floats(), 1e-4, 1e-6);
    EXPECT_LE(m.worst, 1.0) << name << ": element " << m.at << " is " << m.got << ", transformers has " << m.want;
  };
  check("logits", r.st.logits);
  int grads = 0;
  for (const auto& p : model.params().all()) {
    ASSERT_TRUE(ref.contains("grad." + p->name)) << p->name << " is not a parameter of transformers' model";
    check("grad." + p->name, p->grad.defined() ? p->grad : Tensor::zeros(p->data.shape(), DType::F32, Device::cpu()));
    ++grads;
  }
  int want_grads = 0;
  for (const std::string& n : ref.names()) want_grads += n.rfind("grad.", 0) == 0;
  EXPECT_EQ(grads, want_grads);
  // image_newline ends every row of every image's tiles: its gradient is anything but zero
  const Param* newline = nullptr;
  for (const auto& p : model.params().all())
    if (p->name == "image_newline") newline = p.get();
  ASSERT_NE(newline, nullptr);
  ASSERT_TRUE(newline->grad.defined());
  float most = 0;
  for (float v : newline->grad.to_floats()) most = std::max(most, std::fabs(v));
  EXPECT_GT(most, 1e-3f);
}

// A placeholder count that is not the image's layout is named with the image and the count it needs.
TEST_P(AnyresOracle, PlaceholdersThatDoNotFitAnImageAreNamed) {
  const LlavaConfig c = read_hf_config(cases("hf"));
  Llava model(c, Device::cpu(), DType::F32);
  data::Batch batch = test::load_batch(cases("batch.safetensors"));
  std::swap(batch.image_sizes[0], batch.image_sizes[2]);  // the square image's layout where the wide one stands
  LlavaState st;
  try {
    model.forward(batch, st, {});
    FAIL() << "a batch whose placeholders do not fit its images was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs exactly"), std::string::npos) << e.what();
  }
  batch = test::load_batch(cases("batch.safetensors"));
  batch.image_sizes.pop_back();
  try {
    model.forward(batch, st, {});
    FAIL() << "a batch with fewer image_sizes than crops was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("AnyRes crops but pixel_values has"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(LlavaNext, AnyresOracle, testing::Values(std::string("")));
INSTANTIATE_TEST_SUITE_P(LlavaOnevision, AnyresOracle, testing::Values(std::string("onevision/")));
