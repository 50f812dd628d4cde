// memory.allocator: expandable and planned on real training steps of every strategy combination (and two with
// accumulated micro-batches the planner records as repetitions): the CPU's peaks equal the planner's dry run
// (allocated) and the dry run's requests replayed from the CPU's state at the step's start (reserved); a planned
// step follows its plan to the end, and reserves at most 3% above its peak allocated (the packing is greedy, with
// no bound of its own: the worst of these steps is 2.6%, ZeRO-3 with a tied head gathering the embedding's table
// twice a pass; most are at 0%).
#include <gtest/gtest.h>

#include "core/memory/arena_plan.h"
#include "core/memory/device_memory.h"
#include "step_cases.h"
#include "train/planner.h"

using namespace hr;
using namespace hr::core;
using hr::test::StepCase;

namespace {

struct KindCase {
  StepCase step;
  AllocatorKind kind;
};

std::vector<KindCase> kind_cases() {
  std::vector<StepCase> steps = hr::test::step_cases();
  steps.push_back({"accumulate5", 1, {"train.gradient_accumulation_steps=5", "memory.precision=bf16"}});
  steps.push_back({"z3_accumulate4",
                   2,
                   {"memory.zero_stage=3", "train.gradient_accumulation_steps=4", "train.micro_batch_size=1"}});
  std::vector<KindCase> out;
  for (AllocatorKind k : {AllocatorKind::Expandable, AllocatorKind::Planned})
    for (const StepCase& s : steps) out.push_back({s, k});
  return out;
}

class StepAllocator : public testing::TestWithParam<KindCase> {};

}  // namespace

TEST_P(StepAllocator, PeaksEqualTheDryRunAndItsReplay) {
  const KindCase& kc = GetParam();
  const bool planned = kc.kind == AllocatorKind::Planned;
  configure_device(Device::cpu(), {0, Backend::CPU, kc.kind});
  configure_device(Device::host(), {});
  auto dev = allocator_for(Device::cpu());
  {
    hr::test::StepEngine engine(kc.step, Device::cpu());
    if (planned) dev->empty_cache();  // as the trainer does once the engine has started
    train::RunConfig rc = engine.config();
    rc.allocator = kc.kind;
    train::Predictor predictor(rc, kc.step.world, 0, Backend::CPU);
    for (int step = 1; step <= 3; ++step) {
      const train::Prediction p = predictor.step(predictor.worst_case());
      ASSERT_EQ(bool(p.layout), planned);
      dev->reset_peak_stats();
      const AllocatorSnapshot start = dev->snapshot();
      if (planned) dev->begin_stretch(p.layout);
      engine.step();
      if (planned) {
        EXPECT_FALSE(dev->stretch_broken()) << "step " << step;
        dev->end_stretch();
      }
      const MemoryStats s = dev->stats();
      const ReplayPeaks r = replay(start, *p.requests, 0, p.layout);
      EXPECT_EQ(s.allocated_bytes.peak, p.peak_allocated) << "step " << step;
      EXPECT_EQ(s.allocated_bytes.peak, r.peak_allocated) << "step " << step;
      EXPECT_EQ(s.reserved_bytes.peak, r.peak_reserved) << "step " << step;
      if (planned) {
        EXPECT_LE(double(s.reserved_bytes.peak), 1.03 * double(s.allocated_bytes.peak)) << "step " << step;
      }
      if (step == 3)
        std::printf("%s %s: peak allocated %lld B, reserved %lld B (%.2f%% above)\n", kc.step.name.c_str(),
                    allocator_kind_name(kc.kind), (long long)s.allocated_bytes.peak, (long long)s.reserved_bytes.peak,
                    100.0 * double(s.reserved_bytes.peak - s.allocated_bytes.peak) / double(s.allocated_bytes.peak));
    }
  }
  configure_device(Device::cpu(), {});
}

INSTANTIATE_TEST_SUITE_P(Kinds, StepAllocator, testing::ValuesIn(kind_cases()),
                         [](const testing::TestParamInfo<KindCase>& p) {
                           return p.param.step.name + "_" + allocator_kind_name(p.param.kind);
                         });
