// The closed-form breakdown: each category's bytes at the peak as a formula a reader can check by hand (parameter
// count x bytes, the ZeRO share, the activations each block keeps by its checkpoint policy), beside the dry run's
// exact bytes. It explains the prediction; the dry run is the prediction.
#include <algorithm>

#include "core/backend/kernels.h"
#include "optim/optimizer.h"
#include "train/engine.h"
#include "train/plan_parts.h"

namespace hr::train {

using namespace hr::core;
using namespace hr::models;

namespace {

int64_t elem(DType t) {
  return int64_t(dtype_size(t));
}

// Parameter and trainable bytes over the model, and the largest group of each (what ZeRO-3 gathers, ZeRO-2 reduces).
struct ParamBytes {
  int64_t params = 0, trainable = 0, largest = 0, largest_trainable = 0;  // trainable: a count, not bytes
  int64_t trainable_f32_moments = 0;  // 8-bit AdamW: trainable elements whose moments stay f32 (tables, small ones)
};

ParamBytes param_bytes(const Llava& model) {
  ParamBytes b;
  for (const ParamGroup& g : model.groups()) {
    int64_t bytes = 0, trainable_bytes = 0;
    for (const Param* q : g.params) {
      bytes += q->numel() * elem(q->dtype);
      // Per parameter: a LoRA layer's adapters train, its base does not.
      if (q->trainable) b.trainable += q->numel(), trainable_bytes += q->numel() * elem(q->grad_dtype);
      if (q->trainable && optim::keeps_f32_moments(*q)) b.trainable_f32_moments += q->numel();
    }
    b.params += bytes;
    b.largest = std::max(b.largest, bytes);
    b.largest_trainable = std::max(b.largest_trainable, trainable_bytes);
  }
  return b;
}

// params and grads: what each rank holds of them at its ZeRO stage.
void weight_rows(std::vector<ClosedFormRow>& rows, const Plan& p, const Llava& model, const ParamBytes& b) {
  const RunConfig& c = p.config;
  const int W = p.world, zs = c.zero.stage;
  const int64_t e = elem(param_dtype(c.precision));
  const LoraSpec& lora = model.config().llm.lora;
  const std::string quantized =
      lora.quantizes_base()
          ? str(" (the decoder's linear weights: ", lora.base_format().describe(), ", bits / 8 + constants per weight)")
          : "";
  const int ahead = W > 1 ? c.zero.prefetch_groups : 0;  // groups gathered ahead of the one in use
  rows.push_back({"params", zs == 3 ? b.params / W + (1 + ahead) * b.largest : b.params,
                  p.rank.at_peak[std::size_t(Category::Params)],
                  (zs == 3 ? str("parameter bytes / world + the largest group gathered",
                                 ahead ? str(" (and ", ahead, " ahead)") : std::string())
                           : std::string("parameter count x bytes per parameter")) +
                      quantized});
  const int64_t ge = c.grad_accum == GradAccum::Fp32 ? 4 : e;  // gradient bytes per trainable parameter
  const char* in = c.grad_accum == GradAccum::Fp32 && e < 4 ? " (accumulated in f32)" : "";
  rows.push_back({"grads", zs >= 2 ? b.trainable * ge / W + b.largest_trainable : b.trainable * ge,
                  p.rank.at_peak[std::size_t(Category::Grads)],
                  zs >= 2 ? str("trainable x bytes", in, " / world + one group's full gradients while reduced")
                          : str("trainable x bytes", in)});
}

// comm: at stages 2-3 with overlap_comm, the previous group's reduce-scatter still runs under a group's backward (its
// whole gradients and this rank's shard of them), and at stage 3 the next groups' all-gathers land in flat buffers.
ClosedFormRow comm_row(const Plan& p, const ParamBytes& b) {
  const RunConfig& c = p.config;
  const int W = p.world, zs = c.zero.stage;
  if (W == 1 || zs < 2)
    return {"comm", 0, p.rank.at_peak[std::size_t(Category::Comm)],
            W == 1 ? "none on one rank" : "gradient buckets, between compute"};
  const int64_t reducing = c.zero.overlap_comm ? b.largest_trainable + b.largest_trainable / W : 0;
  const int ahead = zs == 3 ? c.zero.prefetch_groups : 0;
  return {"comm", reducing + ahead * b.largest, p.rank.at_peak[std::size_t(Category::Comm)],
          str(c.zero.overlap_comm ? "a group's gradients and shard in a reduce-scatter" : "",
              c.zero.overlap_comm && ahead ? " + " : "", ahead ? str(ahead, " group(s) all-gathered ahead") : "")};
}

// master_params and optimizer: f32 states of the trainable parameters, sharded from ZeRO-1 on, or on the host.
void optimizer_rows(std::vector<ClosedFormRow>& rows, const Plan& p, const ParamBytes& b) {
  const RunConfig& c = p.config;
  const int share = c.zero.stage >= 1 ? p.world : 1;
  const bool low = c.precision != Precision::FP32, off = c.zero.offload_optimizer == parallel::Offload::Cpu;
  rows.push_back({"master_params", off || !low ? 0 : b.trainable * 4 / share,
                  p.rank.at_peak[std::size_t(Category::MasterParams)],
                  off   ? "on the host"
                  : low ? "trainable x 4 (f32 master copy) / ZeRO share"
                        : "none in fp32"});
  if (c.optimizer.kind == optim::OptimizerKind::AdamW8bit) {  // two codes and 8 B of scales a 256-element block
    const int64_t eight = b.trainable - b.trainable_f32_moments;
    rows.push_back(
        {"optimizer", off ? 0 : (eight * 2 + eight / 32 + b.trainable_f32_moments * 8) / share,
         p.rank.at_peak[std::size_t(Category::Optimizer)],
         off ? "on the host"
             : "(trainable x 2 (8-bit moments) + 8 B a block of 256; x 8 for embedding tables and parameters "
               "under 4,096 elements) / ZeRO share"});
    return;
  }
  const int64_t states = c.optimizer.kind == optim::OptimizerKind::AdamW ? 8 : c.optimizer.momentum != 0.f ? 4 : 0;
  rows.push_back({"optimizer", off ? 0 : b.trainable * states / share, p.rank.at_peak[std::size_t(Category::Optimizer)],
                  off ? "on the host" : str("trainable x ", states, " (f32 states) / ZeRO share")});
}

// The tower's kept activations while it trains (a frozen tower keeps nothing): each layer's by the vision policy over
// every crop's positions, and the stem's patches and embeddings.
int64_t tower_kept(const RunConfig& c, const Llava& model) {
  bool trains = false;
  for (const ParamGroup& g : model.groups())
    if (is_encoder(g.kind))
      for (const Param* q : g.params) trains |= q->trainable;
  if (!trains) return 0;
  const VisionConfig& v = c.model.config.vision;
  const int64_t e = elem(param_dtype(c.precision)), images = int64_t(tower_images(c));
  const int64_t n = images * v.num_positions(), C = v.hidden, F = v.intermediate, H = v.heads;
  auto block = [&](CheckpointKind k) {
    if (k != CheckpointKind::None) return checkpointed_kept(k, n, C, H, e);
    return 8 * n * C * e + 2 * n * F * e + n * H * 4 + 4 * n * 4;
  };
  int64_t kept = 0;
  for (int64_t l = 0; l < v.layers_used(); ++l) kept += block(c.vision_ckpt.for_block(l));
  const int64_t patches = images * v.num_patches() * v.channels * v.patch * v.patch * e;
  return kept + patches + (v.class_token() ? n * C * e : 0);  // CLIP's pre-norm input
}

// Activations: what every block keeps by its policy, plus the loss inputs, plus one block's backward.
ClosedFormRow activations_row(const Plan& p, const Llava& model) {
  const RunConfig& c = p.config;
  const LlavaConfig& m = c.model.config;
  const int64_t e = elem(param_dtype(c.precision));
  const int64_t B = c.micro_batch_size, L = c.max_seq_len, n = B * L, C = m.llm.hidden, H = m.llm.heads;
  const int64_t kv = m.llm.kv_heads * m.llm.head_dim(), I = m.llm.intermediate;
  auto llm_block = [&](CheckpointKind k) {
    if (k != CheckpointKind::None) return checkpointed_kept(k, n, C, H, e);
    return 6 * n * C * e + 2 * n * kv * e + 3 * n * I * e + n * H * 4 + 2 * n * 4;
  };
  int64_t act = 0, offloaded = 0;
  if (p.params_trainable > 0)
    for (int64_t l = 0; l < m.llm.layers; ++l) {
      if (offloads(c.llm_ckpt, l, m.llm.layers))
        ++offloaded;
      else
        act += llm_block(c.llm_ckpt.for_block(l));
    }
  // Offloaded blocks: one arriving or leaving beside the one in use.
  act += std::min<int64_t>(offloaded, 2) * llm_block(c.llm_ckpt.kind);
  act += 2 * n * C * e + n * 4;                        // final norm input and the shifted hidden states
  if (m.llm.fused()) act += n * m.llm.head_dim() * 4;  // RoPE's table: each token's cos and sin (f32)
  const int64_t tower = tower_kept(c, model);
  act += tower;
  int64_t transient = llm_block(CheckpointKind::None) + 3 * n * C * e;
  // LoRA: the widest adapted layer's input with dropout applied and its input gradient.
  const LoraSpec& lora = model.config().llm.lora;
  if (lora.r > 0) {
    const bool wide = lora.adapts("down_proj");
    transient += n * (wide ? I : C) * e * (lora.dropout > 0.f ? 2 : 1);
  }
  return {
      "activations", act + transient, p.rank.at_peak[std::size_t(Category::Activations)],
      str("kept per block by policy (", checkpoint_name(c.llm_ckpt.kind),
          offloaded > 0 ? str("; ", offloaded, " blocks' on the host, 2 on the device at a time") : "", ")",
          tower > 0 ? str(" + the tower's over ", tower_images(c), " crops (", checkpoint_name(c.vision_ckpt.kind), ")")
                    : "",
          m.llm.fused() ? " + RoPE's table" : "", " + one block's backward",
          lora.r > 0 ? " + LoRA's widest input and its gradient" : "")};
}

// The cross-entropy chunk, as the target back-end sizes it.
ClosedFormRow workspace_row(const Plan& p) {
  const RunConfig& c = p.config;
  const LlavaConfig& m = c.model.config;
  const int64_t e = elem(param_dtype(c.precision)), B = c.micro_batch_size, L = c.max_seq_len;
  const core::Kernels& target = core::sizing_kernels(p.device.cuda ? Backend::CUDA : Backend::CPU);
  const int64_t chunk =
      std::min(c.ce_chunk_rows > 0 ? c.ce_chunk_rows
                                   : default_chunk_rows(B * (L - 1), m.llm.vocab, target.cross_entropy_chunk_bytes),
               B * (L - 1));
  // Where GEMMs narrow a mixed pair (cuBLAS), the backward also keeps the chunk's gradient in the model's dtype.
  const bool narrow = target.gemm_mixing == core::GemmMixing::NarrowToOutput && e < 4;
  return {"workspace", chunk * m.llm.vocab * (4 + (narrow ? e : 0)), p.rank.at_peak[std::size_t(Category::Workspace)],
          narrow ? "the cross-entropy logits chunk (f32) and its gradient" : "the cross-entropy logits chunk (f32)"};
}

}  // namespace

std::vector<ClosedFormRow> closed_form(const Plan& p, const Llava& model) {
  std::vector<ClosedFormRow> rows;
  const ParamBytes b = param_bytes(model);
  weight_rows(rows, p, model, b);
  optimizer_rows(rows, p, b);
  rows.push_back(activations_row(p, model));
  rows.push_back(workspace_row(p));
  const int64_t n = p.config.micro_batch_size * p.config.max_seq_len;
  rows.push_back(comm_row(p, b));
  rows.push_back({"io", 3 * n * 8, p.rank.at_peak[std::size_t(Category::IO)],
                  "token ids, shifted labels, positions (i64); pixels are freed by then"});
  return rows;
}

}  // namespace hr::train
