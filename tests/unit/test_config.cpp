// Run configuration: defaults, --set overrides typed as YAML, unknown keys with suggestions, bad values with
// the allowed ones, global batch inference.
#include <gtest/gtest.h>

#include <fstream>

#include "train/config.h"

using namespace hr;
using namespace hr::train;

namespace {
std::string write(const std::string& text) {
  const std::string path = testing::TempDir() + "/cfg.yaml";
  std::ofstream(path) << text;
  return path;
}
std::string error_of(const std::string& path, const std::vector<std::string>& sets = {}, int world = 1) {
  try {
    load_config(path, sets, world);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Config, DefaultsAndOverrides) {
  RunConfig c = load_config(write("model:\n  preset: tiny\ntrain:\n  micro_batch_size: 2\n"),
                            {"train.learning_rate=3e-4", "memory.precision=bf16", "memory.gradient_checkpointing=selective",
                             "data.synthetic.train=10"});
  EXPECT_EQ(c.micro_batch_size, 2);
  EXPECT_FLOAT_EQ(c.learning_rate, 3e-4f);
  EXPECT_EQ(c.precision, Precision::BF16);
  EXPECT_EQ(c.vision_ckpt.kind, models::CheckpointKind::Selective);
  EXPECT_EQ(c.llm_ckpt.kind, models::CheckpointKind::Selective);
  EXPECT_EQ(c.synth_train, 10);
  EXPECT_EQ(c.model.config.llm.hidden, 32);  // the tiny preset
  EXPECT_NE(c.resolved_yaml.find("learning_rate: 3e-4"), std::string::npos) << c.resolved_yaml;
  EXPECT_NE(c.resolved_yaml.find("gradient_accumulation_steps: 1"), std::string::npos);
}

TEST(Config, UnknownKeysNameTheClosestValidKey) {
  const std::string p = write("memory:\n  gradient_checkpoint: full\n");
  EXPECT_NE(error_of(p).find("unknown key 'memory.gradient_checkpoint'; did you mean 'memory.gradient_checkpointing'?"),
            std::string::npos)
      << error_of(p);
  EXPECT_NE(error_of(p).find(p), std::string::npos) << "the error names the file";
  EXPECT_NE(error_of("", {"train.micro_batch=4"}).find("did you mean 'train.micro_batch_size'?"), std::string::npos);
  EXPECT_NE(error_of(write("trian:\n  max_steps: 1\n")).find("unknown section 'trian'; did you mean 'train'?"),
            std::string::npos);
}

TEST(Config, BadValuesNameTheKeyAndWhatItAccepts) {
  EXPECT_NE(error_of("", {"memory.precision=fp8"}).find("memory.precision: 'fp8' is not one of: fp32, bf16, fp16"),
            std::string::npos)
      << error_of("", {"memory.precision=fp8"});
  EXPECT_NE(error_of("", {"train.micro_batch_size=many"}).find("train.micro_batch_size: 'many' is not an integer"),
            std::string::npos);
  EXPECT_NE(error_of("", {"train.micro_batch_size=0"}).find("an integer >= 1"), std::string::npos);
  EXPECT_NE(error_of("", {"train.optimizer=lion"}).find("one of: adamw, sgd, adafactor"), std::string::npos);
  EXPECT_NE(error_of("", {"device.memory_limit=lots"}).find("device.memory_limit"), std::string::npos);
  EXPECT_NE(
      error_of("", {"data.synthetic.captions=1.5"}).find("data.synthetic.captions: '1.5' is not a fraction in [0, 1]"),
      std::string::npos)
      << error_of("", {"data.synthetic.captions=1.5"});
}

TEST(Config, GlobalBatchIsInferredOrChecked) {
  RunConfig a = load_config(write("train:\n  micro_batch_size: 4\n  global_batch_size: 32\n"), {}, 2);
  EXPECT_EQ(a.gradient_accumulation_steps, 4);
  RunConfig b = load_config(write("train:\n  gradient_accumulation_steps: 2\n  global_batch_size: 32\n"), {}, 2);
  EXPECT_EQ(b.micro_batch_size, 8);
  EXPECT_NE(error_of(write("train:\n  micro_batch_size: 4\n  gradient_accumulation_steps: 2\n  global_batch_size: 32\n"))
                .find("disagrees"),
            std::string::npos);
}
