// The step-time cost model: FLOPs per step at an achieved throughput, ring collectives over the device link,
// offloaded states over the host bus, and what of the communication hides under compute. It ranks plans; its
// seconds are estimates (the datasheet presets in devices.cpp), where the dry run's bytes are exact.
#include <algorithm>

#include "models/anyres.h"
#include "train/plan_parts.h"

namespace hr::train {

using namespace hr::core;
using namespace hr::models;

const char* module_name(GroupKind k) {
  switch (k) {
    case GroupKind::EncoderStem:
    case GroupKind::EncoderLayer:
      return "vision_tower";
    case GroupKind::Projector:
      return "multi_modal_projector";
    case GroupKind::DecoderLayer:
      return "language_model.layers";
    case GroupKind::Embedding:
      return "language_model.embed_tokens";
    case GroupKind::Head:
      return "language_model.norm + lm_head";
  }
  return "?";
}

ParamCounts param_counts(const Llava& m) {
  ParamCounts k;
  for (const ParamGroup& g : m.groups()) {
    double n = 0;
    bool trainable = false;
    for (const Param* p : g.params) n += double(p->count()), trainable |= p->trainable;
    switch (g.kind) {
      case GroupKind::EncoderLayer:
        k.vision_layer = n, k.vision_trainable |= trainable;
        break;
      case GroupKind::EncoderStem:
        k.vision_other = n, k.vision_trainable |= trainable;
        break;
      case GroupKind::Projector:
        k.projector = n, k.projector_trainable = trainable;
        break;
      case GroupKind::DecoderLayer:
        k.llm_layer = n, k.llm_trainable |= trainable;
        break;
      case GroupKind::Embedding:
        k.embed = n;
        break;
      case GroupKind::Head:
        k.head += n;
        break;
    }
  }
  return k;
}

// Images through the tower per micro-batch: with AnyRes, each image's largest layout's crops.
double tower_images(const RunConfig& c) {
  const LlavaConfig& m = c.model.config;
  double crops = 1;
  if (m.anyres.on()) crops = double(anyres_crops(planned_image(c), m.anyres, m.vision.image_size));
  return double(c.micro_batch_size) * double(c.max_images_per_sample) * crops;
}

namespace {

bool vision_used(const LlavaConfig& m) {
  return m.vision.layers > 0;
}

double recompute_fraction(CheckpointKind k) {
  // Of a block's forward: full recomputes all of it, selective everything but the attention core.
  return k == CheckpointKind::Full ? 1.0 : k == CheckpointKind::Selective ? 0.8 : 0.0;
}

// Of a tower of `layers` blocks' forward: what its policy recomputes (memory.checkpoint_every, the kept last block).
double recompute_share(const CheckpointPolicy& policy, int64_t layers) {
  if (layers <= 0) return 0;
  double share = 0;
  for (int64_t i = 0; i < layers; ++i) share += recompute_fraction(policy.for_block(i, layers));
  return share / double(layers);
}

// FLOPs per micro-batch.
struct MicroFlops {
  double forward = 0, backward = 0, recompute = 0;
};

// Forward: 2 x parameters x tokens for the matmuls, plus attention scores and values; backward twice the forward of
// what gradients reach; recompute the checkpointed share of the forward again.
MicroFlops micro_flops(const RunConfig& c, const ParamCounts& k) {
  const LlavaConfig& m = c.model.config;
  const double B = double(c.micro_batch_size), L = double(c.max_seq_len);
  const double I = tower_images(c), N = double(m.vision.num_positions());
  const double v_layers = double(m.vision.layers_used());
  const double vis_fwd = vision_used(m) && I > 0 ? 2.0 * k.vision_layer * v_layers * I * N +
                                                       4.0 * v_layers * I * N * N * double(m.vision.hidden)
                                                 : 0;
  const double proj_fwd = I > 0 ? 2.0 * k.projector * I * double(m.vision.tokens_per_image()) : 0;
  const double llm_layers_fwd =
      2.0 * k.llm_layer * double(m.llm.layers) * B * L + 2.0 * double(m.llm.layers) * B * L * L * double(m.llm.hidden);
  const double head_fwd = 2.0 * double(m.llm.hidden) * double(m.llm.vocab) * B * L;
  const bool grads_reach_llm = k.llm_trainable || k.projector_trainable || k.vision_trainable;
  MicroFlops f;
  f.backward = (grads_reach_llm ? 2.0 * (llm_layers_fwd + head_fwd) : 0) +
               (k.projector_trainable || k.vision_trainable ? 2.0 * proj_fwd : 0) +
               (k.vision_trainable ? 2.0 * vis_fwd : 0);
  f.recompute = (grads_reach_llm ? recompute_share(c.llm_ckpt, m.llm.layers) * llm_layers_fwd : 0) +
                (k.vision_trainable ? recompute_share(c.vision_ckpt, m.vision.layers_used()) * vis_fwd : 0);
  f.forward = vis_fwd + proj_fwd + llm_layers_fwd + head_fwd;
  return f;
}

// Achieved throughput: half the datasheet peak on a GPU at best, and less for small micro-batches, whose GEMMs
// have few rows (half the best at 1024 tokens per micro-batch on a GPU, 64 on the CPU).
double achieved_flops_per_s(const Plan& p) {
  const RunConfig& c = p.config;
  const bool low = c.precision != Precision::FP32;
  const double rows = double(c.micro_batch_size) * double(c.max_seq_len), half = p.device.cuda ? 1024.0 : 64.0;
  return (low ? p.device.tflops_bf16 : p.device.tflops_fp32) * 1e12 * (p.device.cuda ? 0.5 : 1.0) * rows /
         (rows + half);
}

// What one step moves between ranks (bytes per rank), by collective.
struct Traffic {
  double moved = 0, gathered = 0, reduced = 0, all_reduced = 0;
};

// Ring algorithms: (W-1)/W of the buffer crosses each link per reduce-scatter or all-gather.
Traffic traffic(const Plan& p, double trainable, double all, double e) {
  const RunConfig& c = p.config;
  const double W = double(p.world), ring = (W - 1) / W, A = double(c.gradient_accumulation_steps);
  Traffic t;
  if (W <= 1) return t;
  if (c.zero.stage <= 1) t.all_reduced = 2 * ring * trainable * e;  // gradient all-reduce
  if (c.zero.stage >= 1) t.moved += ring * trainable * e;           // all-gather of updated parameters
  if (c.zero.stage >= 2) t.reduced = A * ring * trainable * e;      // reduce-scatter per micro-batch
  if (c.zero.stage == 3) {
    t.gathered = A * 2 * ring * all * e;  // gathers in forward and backward instead of keeping parameters
    t.moved -= ring * trainable * e;
  }
  t.moved += t.all_reduced + t.reduced + t.gathered;
  return t;
}

// Overlap: each group's prefetched gather runs while the group before it computes, and (overlap_comm) each
// group's reduce-scatter while the next group's backward computes; all but the first (last) of each pass
// hide, as far as there is compute to hide under. At stages 0-1 the gradient all-reduce hides the same way,
// under the last micro-batch's backward only.
double hidden_comm_s(const Plan& p, const Traffic& t, double hide, double compute_s, double backward_s) {
  const RunConfig& c = p.config;
  const double link = p.device.link_gbps * 1e9;
  double overlappable = 0;
  if (c.zero.prefetch_groups > 0) overlappable += t.gathered;
  if (c.zero.overlap_comm) overlappable += t.reduced;
  double hidden = std::min(overlappable / link * hide, compute_s);
  if (c.zero.overlap_comm) hidden += std::min(t.all_reduced / link * hide, backward_s);
  return std::min(hidden, compute_s);
}

// Offload: gradients out and parameters back over PCIe, and the host's AdamW (~1e9 parameters/s). At ZeRO 2-3
// each group's gradient shard leaves as its reduction ends on the last micro-batch (all but the last group's
// under that backward); at ZeRO-3 each group's updated shard goes back while the next group updates on the host
// (all but the last group's under the host update).
void add_offload(StepTime& t, const Plan& p, double trainable, double all, double e, double hide, double backward_s) {
  const RunConfig& c = p.config;
  const double W = double(p.world), A = double(c.gradient_accumulation_steps);
  const double shard = c.zero.stage >= 1 ? trainable / W : trainable;
  if (c.zero.offload_optimizer == parallel::Offload::Cpu) {
    const double transfer = shard * e / (p.device.host_gbps * 1e9), adam = shard / 1e9;
    const double down_hidden = c.zero.stage >= 2 ? std::min(transfer * hide, backward_s) : 0;
    const double up_hidden = c.zero.stage == 3 ? std::min(transfer * hide, adam) : 0;
    t.hidden_offload_s = down_hidden + up_hidden;
    t.offload_s = 2 * transfer + adam - t.hidden_offload_s;
  }
  if (c.zero.offload_params == parallel::Offload::Cpu)
    t.offload_s += A * 2 * (all / W) * e / (p.device.host_gbps * 1e9);
}

// Activation offload: each checkpointed block but a tower's last sends what it keeps to the host after its forward
// (hidden under the next block's forward) and gets it back during the backward of the block after it (hidden under
// that block's backward and recompute); what a block's compute cannot cover is exposed. Per micro-batch.
void add_activation_offload(StepTime& t, const Plan& p, const ParamCounts& k, double peak) {
  const RunConfig& c = p.config;
  const LlavaConfig& m = c.model.config;
  const double e = c.precision != Precision::FP32 ? 2 : 4, A = double(c.gradient_accumulation_steps);
  const double bus = p.device.host_gbps * 1e9;
  auto tower = [&](const CheckpointPolicy& policy, int64_t layers, double rows, double hidden, double heads,
                   double block_fwd_flops) {
    if (!policy.offload || layers < 2) return;
    const double kept =
        double(checkpointed_kept(policy.kind, int64_t(rows), int64_t(hidden), int64_t(heads), int64_t(e)));
    const double copy = kept / bus, fwd = block_fwd_flops / peak;
    for (int64_t i = 0; i + 1 < layers; ++i) {
      if (!offloads(policy, i, layers)) continue;
      // Fetched back under the backward of the block after it, and its recompute unless that block is kept whole.
      const double back = 2 * fwd + recompute_fraction(policy.for_block(i + 1, layers)) * fwd;
      t.act_offload_s += A * 2 * copy;
      t.exposed_act_offload_s += A * (std::max(0.0, copy - fwd) + std::max(0.0, copy - back));
    }
  };
  const double B = double(c.micro_batch_size), L = double(c.max_seq_len);
  const bool grads_reach_llm = k.llm_trainable || k.projector_trainable || k.vision_trainable;
  if (grads_reach_llm)
    tower(c.llm_ckpt, m.llm.layers, B * L, double(m.llm.hidden), double(m.llm.heads),
          2.0 * k.llm_layer * B * L + 2.0 * B * L * L * double(m.llm.hidden));
  const double I = tower_images(c), N = double(m.vision.num_positions());
  if (k.vision_trainable && vision_used(m) && I > 0)
    tower(c.vision_ckpt, m.vision.layers_used(), I * N, double(m.vision.hidden), double(m.vision.heads),
          2.0 * k.vision_layer * I * N + 4.0 * I * N * N * double(m.vision.hidden));
}

}  // namespace

StepTime step_time(const Plan& p, const ParamCounts& k) {
  const RunConfig& c = p.config;
  const LlavaConfig& m = c.model.config;
  const double A = double(c.gradient_accumulation_steps);
  const MicroFlops f = micro_flops(c, k);
  const double flops = A * (f.forward + f.backward), peak = achieved_flops_per_s(p);
  StepTime t;
  t.flops = flops + A * f.recompute;
  t.model_flops = flops;
  t.compute_s = flops / peak;
  t.recompute_s = A * f.recompute / peak;
  t.compute_s += t.recompute_s;
  const double e = c.precision != Precision::FP32 ? 2 : 4;
  double all = 0;
  for (const auto& [name, n] : p.params_by_module) all += double(n);
  const double trainable = double(p.params_trainable);
  const Traffic moved = traffic(p, trainable, all, e);
  t.comm_s = moved.moved / (p.device.link_gbps * 1e9);
  // All but the first (last) of the groups' transfers in a pass can hide.
  const double groups = double(m.llm.layers) + (vision_used(m) ? double(m.vision.layers_used()) : 0) + 3;
  const double hide = 1 - 1 / groups, backward_s = f.backward / peak;
  t.hidden_comm_s = hidden_comm_s(p, moved, hide, t.compute_s, backward_s);
  add_offload(t, p, trainable, all, e, hide, backward_s);
  add_activation_offload(t, p, k, peak);
  return t;
}

}  // namespace hr::train
