// The leak watch: sustained growth of allocated bytes (device or host allocator) over a window names the
// categories that grew; resident memory growing past its level names that; a flat or oscillating run stays quiet.
#include <gtest/gtest.h>

#include "core/memory/device_memory.h"
#include "core/tensor.h"
#include "train/memory_log.h"

using namespace hr;
using namespace hr::core;
using namespace hr::train;

namespace {
MemoryStats at(int64_t activations, int64_t grads) {
  MemoryStats s;
  s.by_category[std::size_t(Category::Activations)].current = activations;
  s.by_category[std::size_t(Category::Grads)].current = grads;
  s.allocated_bytes.current = activations + grads;
  return s;
}
}  // namespace

TEST(LeakWatch, WarnsOnSustainedGrowthNamingTheCategory) {
  MemoryLog log(testing::TempDir() + "/m.jsonl", 5);
  std::string warning;
  for (int step = 1; step <= 5; ++step) warning = log.leak_check(step, at(1000 + 100 * step, 500), {}, 0);
  EXPECT_NE(warning.find("grew for 5 steps"), std::string::npos) << warning;
  EXPECT_NE(warning.find("activations +400 B"), std::string::npos) << warning;
  EXPECT_EQ(warning.find("grads"), std::string::npos) << warning;
}

TEST(LeakWatch, QuietWhenMemoryReturnsToItsLevel) {
  MemoryLog log(testing::TempDir() + "/m2.jsonl", 5);
  for (int step = 1; step <= 20; ++step) EXPECT_EQ(log.leak_check(step, at(step % 2 ? 1000 : 1200, 500), {}, 0), "");
}

// A real leak: a reference kept every step through the caching allocator.
TEST(LeakWatch, AKeptReferenceIsNamedByItsCategory) {
  MemoryContext context;
  MemoryContext::Use use(context);
  auto alloc = allocator_for(Device::cpu());
  MemoryLog log(testing::TempDir() + "/m3.jsonl", 5);
  std::vector<Tensor> kept;
  std::string warning;
  for (int step = 1; step <= 5 && warning.empty(); ++step) {
    Tensor scratch = Tensor::zeros({256}, DType::F32, Device::cpu());  // freed at the end of the step
    {
      MemoryScope scope(Category::Optimizer, "forgotten");
      kept.push_back(Tensor::zeros({1024}, DType::F32, Device::cpu()));
    }
    scratch = Tensor();
    warning = log.leak_check(step, alloc->stats(), {}, 0);
  }
  EXPECT_NE(warning.find("allocated bytes grew for 5 steps"), std::string::npos) << warning;
  EXPECT_NE(warning.find("optimizer +16.00 KiB"), std::string::npos) << warning;
  EXPECT_EQ(warning.find("activations"), std::string::npos) << warning;
}

TEST(LeakWatch, HostAllocatorGrowthIsNamedAsTheHosts) {
  MemoryLog log(testing::TempDir() + "/m4.jsonl", 4);
  std::string warning;
  for (int step = 1; step <= 4; ++step) warning = log.leak_check(step, at(1000, 500), at(100 * step, 0), 0);
  EXPECT_NE(warning.find("host allocator's allocated bytes grew for 4 steps"), std::string::npos) << warning;
  EXPECT_EQ(warning.find("[memory] warning: allocated bytes"), std::string::npos) << warning;
}

TEST(LeakWatch, ResidentMemoryGrowingPastItsLevelWarnsOncePerSlack) {
  MemoryLog log(testing::TempDir() + "/m5.jsonl", 10);
  const int64_t mib = 1 << 20, slack = MemoryLog::kRssSlack;
  int warnings = 0;
  // Warm-up growth during the first window does not count; then 1 MiB more per step.
  for (int step = 1; step <= 10; ++step) EXPECT_EQ(log.leak_check(step, at(1000, 500), {}, 10 * mib * step), "");
  for (int step = 11; step <= 10 + 3 * (slack / mib) + 5; ++step) {
    const std::string w = log.leak_check(step, at(1000, 500), {}, 100 * mib + (step - 10) * mib);
    if (!w.empty()) {
      ++warnings;
      EXPECT_NE(w.find("resident memory grew"), std::string::npos) << w;
    }
  }
  EXPECT_EQ(warnings, 3);
}

TEST(LeakWatch, ResidentMemoryThatWobblesStaysQuiet) {
  MemoryLog log(testing::TempDir() + "/m6.jsonl", 10);
  const int64_t mib = 1 << 20;
  for (int step = 1; step <= 500; ++step)
    EXPECT_EQ(log.leak_check(step, at(1000, 500), {}, 500 * mib + (step % 7) * 8 * mib), "") << step;
}
