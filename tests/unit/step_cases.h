// Training-step cases for the exactness tests: one small model under every strategy combination the planner
// can choose, run in process on any device through a planned communicator (no data moves between ranks;
// every buffer a rank would allocate is allocated).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm.h"
#include "train/config.h"
#include "train/engine.h"
#include "train/evaluate.h"
#include "train/planner.h"

namespace hr::test {

struct StepCase {
  std::string name;
  int world = 1;
  std::vector<std::string> sets;  // --set overrides on top of the small base config
  // train.padding_free: the LLM's packed sequences and its last layer's rows of them (train::MicroShape); empty: the
  // worst case, every position labelled.
  std::vector<int64_t> packed = {}, tails = {};
};

std::vector<StepCase> step_cases();

// The engine of a case on `device` (cpu: random weights, as a run starts; meta: as the planner builds it),
// sharded and ready to step. Devices must be configured by the caller. `initialising(true/false)` is called
// around the random initialisation, which only a real device does.
class StepEngine {
 public:
  StepEngine(const StepCase& c, core::Device device, const std::function<void(bool)>& initialising = {});
  ~StepEngine();
  // One optimizer step at the worst-case shapes (every micro-batch of the accumulation), or packed as the case
  // says: step_shapes().
  void step(const std::function<data::LoadedBatch()>& batch = {});  // `batch`: each micro-batch instead
  std::vector<train::MicroShape> step_shapes() const;
  core::Device host() const { return host_; }
  // One evaluation loss pass at the worst-case shapes, as Predictor::evaluation dry-runs it (`logit_rows`
  // positions' logits kept); returns its shape.
  train::EvalShape evaluate(int64_t logit_rows);
  const train::RunConfig& config() const { return config_; }

 private:
  // AnyRes: `images` images of the largest layout (the planner's worst case); none otherwise.
  std::vector<data::Resolution> image_sizes(int64_t images) const;
  train::RunConfig config_;
  std::vector<int64_t> packed_, tails_;
  core::Device device_, host_;
  std::unique_ptr<parallel::Communicator> comm_;
  std::unique_ptr<train::Engine> engine_;
};

}  // namespace hr::test
