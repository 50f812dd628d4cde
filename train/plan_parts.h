// The parts make_plan assembles a plan from, beside the dry run (predictor.cpp): the step-time cost model
// (cost_model.cpp) and the closed-form breakdown (closed_form.cpp). Internal to the planner.
#pragma once

#include <vector>

#include "models/llava.h"
#include "train/planner.h"

namespace hr::train {

// The model's parameters by the parts the cost model prices, and which of them train.
struct ParamCounts {
  double vision_layer = 0, vision_other = 0, projector = 0, llm_layer = 0, embed = 0, head = 0;  // parameters
  bool vision_trainable = false, projector_trainable = false, llm_trainable = false;
};
ParamCounts param_counts(const models::Llava& model);

// The rows of the plan's parameter table: both vision kinds are the tower, the norm and lm_head one row.
const char* module_name(models::GroupKind kind);

// The predicted step time of `plan` (its config, device, world, parameters by module): compute from FLOPs at an
// achieved throughput, collectives over the link, offload over the host bus, and what of them hides under compute.
StepTime step_time(const Plan& plan, const ParamCounts& counts);

// The closed-form breakdown by category, beside the dry run's bytes at its peak.
std::vector<ClosedFormRow> closed_form(const Plan& plan, const models::Llava& model);
// What a checkpointed transformer block keeps over `rows` positions of width `hidden` with `heads` heads, `elem` bytes
// an element: full its input; selective its attention's and MLP's inputs, the attention output and its f32
// log-sum-exp. (Under `none` a block keeps everything, which differs between the tower and the decoder.)
inline int64_t checkpointed_kept(models::CheckpointKind k, int64_t rows, int64_t hidden, int64_t heads, int64_t elem) {
  return k == models::CheckpointKind::Full ? rows * hidden * elem : 3 * rows * hidden * elem + rows * heads * 4;
}
// Images through the tower per micro-batch at the worst case: with AnyRes, each image's planned layout's crops.
double tower_images(const RunConfig& c);

}  // namespace hr::train
