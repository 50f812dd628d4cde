// memory.allocator: expandable and planned on real training steps of every strategy combination (and two with
// accumulated micro-batches the planner records as repetitions): the CPU's peaks equal the planner's dry run
// (allocated) and the dry run's requests replayed from the CPU's state at the step's start (reserved); a planned
// step follows its plan to the end, and reserves at most 3% above its peak allocated (the packing is greedy, with
// no bound of its own: the worst of these steps is 2.6%, ZeRO-3 with a tied head gathering the embedding's table
// twice a pass; most are at 0%).
// The caching kind's allocated peak depends on the cache a step starts from: the last test carves holes in it.
#include <gtest/gtest.h>

#include "core/memory/arena_plan.h"
#include "core/memory/device_memory.h"
#include "step_cases.h"
#include "train/eval_log.h"
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
      const train::Prediction p = predictor.step(engine.step_shapes());  // the worst case, or packed
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

TEST(StepAllocator, ACachingStepPeaksAtItsDryRunReplayedFromTheCacheItStartsFrom) {
  // The caching kind splits a large block only when more than 1 MiB would remain, and an allocation counts its
  // whole block, so the allocated peak too depends on what is cached when a step starts (an H100 bench peaked
  // 47,104 B under its fresh dry run from its second step on). Earlier work leaves holes of every size in the
  // 20 MiB segments here; each step's peaks are its dry run's requests replayed from that state.
  configure_device(Device::cpu(), {0, Backend::CPU, AllocatorKind::Caching});
  configure_device(Device::host(), {});
  auto dev = allocator_for(Device::cpu());
  int differs = 0;
  {
    // A vocabulary and sequence large enough for the logits and the head to come from the large pool.
    hr::test::StepEngine engine({"large_pool", 1, {"model.llm.vocab_size=20000", "data.max_seq_len=64"}},
                                Device::cpu());
    std::vector<CachingAllocator::Block*> held;
    for (std::size_t kib : {1100, 1300, 1700, 2500, 4100, 6500, 1200, 3300, 1900, 5200, 1500, 2100})
      held.push_back(dev->allocate(kib * 1024));
    for (std::size_t i = 0; i < held.size(); i += 2) dev->free(held[i]);
    train::Predictor predictor(engine.config(), 1, 0, Backend::CPU);
    for (int step = 1; step <= 3; ++step) {
      const train::Prediction p = predictor.step(engine.step_shapes());  // the worst case, or packed
      dev->reset_peak_stats();
      const AllocatorSnapshot start = dev->snapshot();
      const int64_t before = dev->stats().allocated_bytes.current;  // the engine's and the holes' neighbours
      engine.step();
      const MemoryStats s = dev->stats();
      const ReplayPeaks r = replay(start, *p.requests, 0);
      EXPECT_EQ(s.allocated_bytes.peak, r.peak_allocated) << "step " << step;
      EXPECT_EQ(s.reserved_bytes.peak, r.peak_reserved) << "step " << step;
      // What the step itself added at its peak, against what its fresh dry run added.
      const int64_t step_peak = s.allocated_bytes.peak - before, dry_peak = p.peak_allocated - p.persistent;
      differs += step_peak != dry_peak;
      std::printf("step %d: the step's peak above what it started with %lld B, its fresh dry run's %lld B\n", step,
                  (long long)step_peak, (long long)dry_peak);
    }
    for (std::size_t i = 1; i < held.size(); i += 2) dev->free(held[i]);
  }
  EXPECT_GT(differs, 0) << "the holes left no mark: this case no longer shows why the replay is needed";
  configure_device(Device::cpu(), {});
}

TEST(StepAllocator, ACachingEvaluationPassPeaksAtItsDryRunReplayedFromTheCacheItStartsFrom) {
  // The same for an evaluation's loss pass, as the trainer's evaluation measures it (EvalMemory).
  configure_device(Device::cpu(), {0, Backend::CPU, AllocatorKind::Caching});
  configure_device(Device::host(), {});
  auto dev = allocator_for(Device::cpu());
  {
    hr::test::StepEngine engine({"large_pool", 1, {"model.llm.vocab_size=20000", "data.max_seq_len=64"}},
                                Device::cpu());
    train::Predictor predictor(engine.config(), 1, 0, Backend::CPU);
    engine.step();
    predictor.step(predictor.worst_case());  // the predictor's engine as the step left the real one
    std::vector<CachingAllocator::Block*> held;
    // The pass's one large-pool request (its loss's 10,080,000 B) finds a 10,200 KiB hole and takes it whole.
    for (std::size_t kib : {10200, 9000, 1100, 1300, 1700, 2500, 4100, 6500, 1200, 3300, 1900, 5200, 1500, 2100})
      held.push_back(dev->allocate(kib * 1024));
    for (std::size_t i = 0; i < held.size(); i += 2) dev->free(held[i]);
    train::EvalPredictions predictions(8);
    train::EvalMemory memory(*dev, predictor, predictions);
    const int64_t before = dev->stats().allocated_bytes.current;
    memory.begin();
    const train::EvalShape shape = engine.evaluate(2);
    memory.end(shape);
    EXPECT_EQ(memory.loss.passes, 1);
    EXPECT_EQ(memory.loss.mismatches, 0) << memory.loss.measured << " B measured, " << memory.loss.predicted
                                         << " B predicted";
    // What the pass itself added at its peak differs from its fresh dry run's: the holes matter here.
    const train::Prediction& fresh = predictions.get({0, shape.batch, shape.seq, shape.images, shape.logit_rows},
                                                     [&] { return predictor.evaluation(shape); });
    EXPECT_NE(memory.loss.measured - before, fresh.peak_allocated - fresh.persistent)
        << "the holes left no mark: this case no longer shows why the replay is needed";
    for (std::size_t i = 1; i < held.size(); i += 2) dev->free(held[i]);
  }
  configure_device(Device::cpu(), {});
}
