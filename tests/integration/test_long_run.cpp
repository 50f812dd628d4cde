// Long-run stability (label slow): 1,000 steps of the tiny model with evaluations and checkpoints between
// them. After warm-up, the device's allocated and reserved bytes at each step are flat, the host's resident
// memory grows by no more than a small bound, and the leak watch stays silent.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "integration/cli.h"

using namespace hr;
using json = nlohmann::json;

namespace {

const char* kConfig = R"(model:
  preset: tiny
  vision: {image_size: 8, patch_size: 4}
  llm: {vocab_size: 300}
  image_token_index: 299
data:
  synthetic: {train: 256, eval: 16, image_size: 8, questions: 2}
  system_prompt: ""
  num_workers: 2
train:
  micro_batch_size: 4
  gradient_accumulation_steps: 2
  max_steps: 1000
  learning_rate: 0.003
  warmup_steps: 10
  max_new_tokens: 4
  eval_steps: 250
  save_steps: 250
  save_total_limit: 1
memory:
  leak_window: 50
log:
  logging_steps: 100
  progress_bar: false
)";

}  // namespace

TEST(LongRun, AThousandStepsKeepMemoryFlatAndTheLeakWatchSilent) {
  const std::string d = testing_cli::fresh_dir("long_run");
  const std::string cfg = testing_cli::write_config(d, kConfig);
  testing_cli::CmdResult r =
      testing_cli::run(std::string(HR_HEADROOM_BIN) + " train " + cfg + " --set run.output_dir=" + d);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output.find("[memory] warning"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("[memory] WARNING"), std::string::npos) << r.output;
  const auto lines = testing_cli::jsonl(d + "/memory.jsonl");
  ASSERT_EQ(lines.size(), 1000u);
  // Warm-up: the first window. After it, what each step leaves allocated never grows. Reserved bytes include
  // what the caching allocator kept from the first evaluation and checkpoint (step 250): from there on they stay
  // at the level the next 250 steps reached (batch lengths vary, so the largest step comes when it comes).
  auto value = [&](std::size_t from, std::size_t to, const char* key, bool largest) {
    int64_t v = lines[from][key];
    for (std::size_t i = from; i < to; ++i)
      v = largest ? std::max<int64_t>(v, lines[i][key]) : std::min<int64_t>(v, lines[i][key]);
    return v;
  };
  EXPECT_EQ(value(50, 1000, "allocated", true), value(50, 1000, "allocated", false));
  EXPECT_EQ(value(500, 1000, "reserved", true), value(250, 500, "reserved", true));
  // The resident set: at most 16 MiB more at the end than after the first evaluation and checkpoint.
  const int64_t rss_early = value(260, 300, "host_rss", true), rss_late = value(950, 1000, "host_rss", true);
  std::printf("host RSS %.1f MiB (steps 260-300) -> %.1f MiB (steps 950-1000)\n", double(rss_early) / (1 << 20),
              double(rss_late) / (1 << 20));
  EXPECT_LE(rss_late - rss_early, int64_t(16) << 20);
}
