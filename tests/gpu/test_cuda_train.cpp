// Training on cuda:0 (label gpu): a tiny LLaVA trains 20 f32 steps with the losses of the same run on the CPU
// (within 1e-3) and every step's measured peak equal to its dry run on the meta device mirroring CUDA; the memory
// log carries cudaMemGetInfo's device_free and device_total; a capped GPU (device.memory_limit) runs out of memory
// with the report, as the capped CPU does. Skipped where no GPU is present. The headroom binary is HR_HEADROOM
// (the GPU bundle's bin/headroom) or the one built beside this test.
#include <cuda_runtime.h>

#include <cstdlib>

#include "integration/cli.h"

using namespace hr::testing_cli;
using json = nlohmann::json;

namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::string headroom_bin() {
  const char* b = std::getenv("HR_HEADROOM");
  return b && *b ? b : HR_HEADROOM_BIN;
}

const char* kConfig = R"(model:
  preset: tiny
  vision: {image_size: 8, patch_size: 4}
  llm: {vocab_size: 300}
  image_token_index: 299
data:
  synthetic: {train: 64, eval: 8, image_size: 8}
  system_prompt: ""
  num_workers: 1
  pad_to_max_length: true
train:
  stage: full
  micro_batch_size: 4
  global_batch_size: 8
  max_steps: 20
  learning_rate: 0.003
  warmup_steps: 1
  eval_steps: 0
  save_steps: 0
  max_new_tokens: 2
log:
  logging_steps: 5
  progress_bar: false
)";

CmdResult train(const std::string& cfg, const std::string& out, const std::string& sets) {
  return run(headroom_bin() + " train " + cfg + " --set run.output_dir=" + out + " " + sets);
}

}  // namespace

TEST(CudaTrain, TwentyStepsMatchTheCpuAndEveryPeakItsDryRun) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const std::string base = fresh_dir("cuda_train");
  const std::string cfg = write_config(base, kConfig);
  CmdResult cpu = train(cfg, base + "/cpu", "");
  ASSERT_EQ(cpu.status, 0) << cpu.output;
  CmdResult gpu = train(cfg, base + "/gpu", "--set device.type=cuda:0");
  ASSERT_EQ(gpu.status, 0) << gpu.output;
  const auto a = jsonl(base + "/cpu/memory.jsonl"), b = jsonl(base + "/gpu/memory.jsonl");
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 20u);
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(b[i]["loss"].get<double>(), a[i]["loss"].get<double>(), 1e-3) << "step " << i + 1;
    EXPECT_EQ(b[i]["peak_allocated"], b[i]["predicted_peak"]) << "step " << i + 1;
    EXPECT_EQ(b[i]["peak_reserved"], b[i]["predicted_reserved"]) << "step " << i + 1;
    ASSERT_TRUE(b[i].contains("device_free") && b[i].contains("device_total")) << b[i].dump();
    EXPECT_GT(b[i]["device_total"].get<int64_t>(), b[i]["device_free"].get<int64_t>());
  }
  EXPECT_EQ(gpu.output.find("WARNING"), std::string::npos) << gpu.output;
}

TEST(CudaTrain, ACappedGpuRunsOutOfMemoryWithTheReport) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const std::string base = fresh_dir("cuda_capped");
  const std::string cfg = write_config(base, kConfig);
  CmdResult r = train(cfg, base + "/run",
                      "--set device.type=cuda:0 --set device.memory_limit=4MiB --set memory.preflight=false");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("out of memory"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("cuda:0"), std::string::npos) << r.output;
}
