// `headroom debug grads` round-trips with the PyTorch golden files: the command's output file holds the loss,
// the logits and every parameter gradient, equal to PyTorch's (f32) under the parameters' names.
#include <gtest/gtest.h>

#include <cstdlib>

#include "../unit/golden_util.h"

using namespace hr;
using namespace hr::core;
using hr::test::golden;

namespace {
void round_trip(const std::string& cs) {
  const std::string out = testing::TempDir() + "/" + cs + "_grads.safetensors";
  const std::string cmd = std::string(HR_HEADROOM_BIN) + " debug grads --config " + golden(cs + ".yaml") +
                          " --weights " + golden(test::first_line(golden(cs + ".weights"))) + " --batch " +
                          golden(cs + "_batch.safetensors") + " --out " + out + " --logits";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  SafetensorsFile got = SafetensorsFile::open(out), want = SafetensorsFile::open(golden(cs + "_f32.safetensors"));
  int compared = 0;
  for (const std::string& name : want.names()) {
    const std::string ours = name.rfind("grad.", 0) == 0 ? name.substr(5) : name;
    ASSERT_TRUE(got.contains(ours)) << ours << " missing from the debug grads output";
    test::Mismatch m = test::compare(got.get(ours).to_floats(), want.get(name).to_floats(), 1e-4, 1e-5);
    EXPECT_LE(m.worst, 1.0) << ours << ": element " << m.at << " is " << m.got << ", PyTorch has " << m.want;
    ++compared;
  }
  EXPECT_EQ(std::size_t(compared), got.names().size()) << "the output holds tensors PyTorch does not";
}
}  // namespace

TEST(DebugGrads, RoundTripsWithGoldenFullTraining) {
  round_trip("two_images_and_text");
}
TEST(DebugGrads, RoundTripsWithGoldenStage1) {
  round_trip("stage1");
}

TEST(DebugGrads, BadInputNamesTheProblem) {
  const std::string cmd = std::string(HR_HEADROOM_BIN) + " debug grads --config " + golden("stage1.yaml") +
                          " --weights " + golden("weights_mha.safetensors") + " --batch " +
                          golden("stage1_batch.safetensors") + " --out /dev/null 2>" + testing::TempDir() + "/err.txt";
  EXPECT_NE(std::system(cmd.c_str()), 0);  // MHA weights into a GQA model: k_proj/v_proj shapes differ
  std::ifstream in(testing::TempDir() + "/err.txt");
  std::string err((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(err.find("language_model.model.layers.0.self_attn.k_proj.weight (32, 32) (model wants (16, 32))"),
            std::string::npos)
      << err;
}
