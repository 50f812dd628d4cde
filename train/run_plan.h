// The plan a training run starts from: every rank measures its device, all plan for the one with the least room
// (so that `auto` decides alike everywhere), rank 0 shows the plan and writes plan.json, and a plan that does not
// fit stops every rank with the breakdown and the cheapest changes that would fit (memory.preflight).
#pragma once

#include <memory>

#include "parallel/comm.h"
#include "train/console.h"
#include "train/devices.h"
#include "train/planner.h"

namespace hr::train {

struct PlannedRun {
  Plan plan;
  RunDevice device;  // this rank's device and what it planned with (devices.h)
};

PlannedRun plan_run(const RunConfig& config, parallel::Communicator& comm, Console& console);

}  // namespace hr::train
