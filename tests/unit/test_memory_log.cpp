// The leak watch: sustained growth of allocated bytes over a window names the categories that grew;
// a flat or oscillating run stays quiet.
#include <gtest/gtest.h>

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
  for (int step = 1; step <= 5; ++step) warning = log.leak_check(step, at(1000 + 100 * step, 500));
  EXPECT_NE(warning.find("grew for 5 steps"), std::string::npos) << warning;
  EXPECT_NE(warning.find("activations +400 B"), std::string::npos) << warning;
  EXPECT_EQ(warning.find("grads"), std::string::npos) << warning;
}

TEST(LeakWatch, QuietWhenMemoryReturnsToItsLevel) {
  MemoryLog log(testing::TempDir() + "/m2.jsonl", 5);
  for (int step = 1; step <= 20; ++step) EXPECT_EQ(log.leak_check(step, at(step % 2 ? 1000 : 1200, 500)), "");
}
