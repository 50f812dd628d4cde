// The planner: dry runs on the meta device, the step-time cost model, the closed-form breakdown, and the
// search over strategies.
#include "train/planner.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>

#include "core/backend/device_info.h"
#include "core/backend/kernels.h"
#include "core/memory/device_memory.h"
#include "data/tokenizer.h"
#include "train/engine.h"

namespace hr::train {

using namespace hr::core;
using namespace hr::models;
using namespace hr::data;
using Clock = std::chrono::steady_clock;

namespace {

const Device kMetaHost{DeviceType::Meta, 1};  // the host as a plan sees it: nothing is really allocated

// Follows one allocator's events: who reached the peak (the breakdown at it is MemoryStats::at_peak).
struct PeakWatch {
  CategoryBytes current{};
  int64_t allocated = 0, best = 0, activations_best = 0;
  std::string owner, activation_owner;

  explicit PeakWatch(const MemoryStats& s) {
    for (Category c : kAllCategories) current[std::size_t(c)] = s.category(c).current;
    allocated = best = s.allocated_bytes.current;
    activations_best = current[std::size_t(Category::Activations)];
  }
  void operator()(const TraceEvent& e) {
    const auto c = std::size_t(e.category);
    if (e.kind == TraceEvent::Kind::Alloc) {
      allocated += int64_t(e.size);
      current[c] += int64_t(e.size);
      if (allocated > best) {
        best = allocated;
        owner = e.owner ? *e.owner : "";
      }
      if (e.category == Category::Activations && current[c] > activations_best) {
        activations_best = current[c];
        activation_owner = e.owner ? *e.owner : "";
      }
    } else if (e.kind == TraceEvent::Kind::Free) {
      allocated -= int64_t(e.size);
      current[c] -= int64_t(e.size);
    }
  }
};

// A dry run's peaks from its allocators' statistics and the watch that followed its device allocations.
void record_peaks(Prediction& p, const MemoryStats& s, const MemoryStats& h, const PeakWatch& dw) {
  p.peak_allocated = s.allocated_bytes.peak;
  p.peak_reserved = s.reserved_bytes.peak;
  HR_ASSERT(p.peak_allocated == dw.best, "peak watch ", dw.best, " disagrees with the allocator's peak ",
            p.peak_allocated);
  p.at_peak = s.at_peak;
  for (Category c : kAllCategories) p.category_peaks[std::size_t(c)] = s.category(c).peak;
  p.peak_owner = dw.owner;
  p.activation_peak_owner = dw.activation_owner;
  p.host_peak = h.allocated_bytes.peak;
  p.host_at_peak = h.at_peak;
}

}  // namespace

// ---- Predictor ----

LoadedBatch synthetic_batch(const LlavaConfig& m, const MicroShape& s, Device host) {
  LoadedBatch lb;
  Batch& b = lb.batch;
  b.batch = s.batch;
  b.seq = s.seq;
  const int64_t T = m.vision.tokens_per_image();
  b.input_ids.assign(std::size_t(s.batch * s.seq), int64_t('a') + ByteTokenizer::kByteOffset);
  b.labels = b.input_ids;
  for (int64_t r = 0; r < s.batch; ++r) {
    const int64_t images = s.images / s.batch + (r < s.images % s.batch ? 1 : 0);
    HR_CHECK(1 + images * T < s.seq, "[plan] a sequence of ", s.seq, " tokens cannot hold ", images, " image(s) of ", T,
             " tokens; raise data.max_seq_len or lower data.max_images_per_sample");
    b.input_ids[std::size_t(r * s.seq)] = ByteTokenizer::kBos;
    b.labels[std::size_t(r * s.seq)] = m.ignore_index;
    for (int64_t t = 1; t <= images * T; ++t) {
      b.input_ids[std::size_t(r * s.seq + t)] = m.image_token_id;
      b.labels[std::size_t(r * s.seq + t)] = m.ignore_index;
    }
  }
  if (s.images > 0) {
    MemoryScope scope(Category::IO, "loader");
    const Shape shape{s.images, m.vision.channels, m.vision.image_size, m.vision.image_size};
    b.pixel_values =
        host.type == DeviceType::Meta ? Tensor::empty(shape, DType::F32, host) : Tensor::zeros(shape, DType::F32, host);
  }
  lb.tokens = s.batch * s.seq;
  return lb;
}

Predictor::Predictor(const RunConfig& c, int world, int rank, core::SizingTarget target, std::size_t capacity)
    : config_(c) {
  MemoryContext::Use use(memory_);
  configure_device(Device::meta(), {capacity, target, c.allocator});
  configure_device(kMetaHost, {0, target});
  comm_ = parallel::make_planned(world, rank);
  engine_ = std::make_unique<Engine>(config_, Device::meta(), *comm_);
  engine_->shard();
  // Planned: the trainer releases what starting left cached before the first step; so does the dry run.
  if (c.allocator == AllocatorKind::Planned) allocator_for(Device::meta())->empty_cache();
}

Predictor::~Predictor() = default;

std::vector<MicroShape> Predictor::worst_case() const {
  const int64_t m = config_.micro_batch_size;
  return std::vector<MicroShape>(std::size_t(config_.gradient_accumulation_steps),
                                 {m, config_.max_seq_len, m * config_.max_images_per_sample});
}

const Llava& Predictor::model() const {
  return engine_->model();
}

Prediction Predictor::step(const std::vector<MicroShape>& micro, StepRecording* rec) {
  MemoryContext::Use use(memory_);
  auto dev = allocator_for(Device::meta()), host = allocator_for(kMetaHost);
  dev->reset_peak_stats();
  host->reset_peak_stats();
  Prediction p;
  p.persistent = dev->stats().allocated_bytes.current;
  PeakWatch dw(dev->stats());
  auto requests = std::make_shared<RequestTrace>();
  Timeline* timeline = rec ? rec->timeline : nullptr;
  if (rec) rec->start = dev->snapshot();
  const int dev_track = timeline ? timeline->add_allocator("device", dev->stats()) : -1;
  const int host_track = timeline ? timeline->add_allocator("host", host->stats(), false) : -1;
  dev->set_trace([&](const TraceEvent& e) {
    dw(e);
    requests->record(e);
    if (timeline) timeline->allocator_event(dev_track, e);
  });
  if (timeline) host->set_trace([&](const TraceEvent& e) { timeline->allocator_event(host_track, e); });
  if (timeline) set_span_timeline(timeline);
  // memory.allocator: planned: the step is a stretch that records; its layout is worked out from its requests.
  const bool planned = dev->kind() == AllocatorKind::Planned;
  if (planned) dev->begin_stretch(nullptr);
  // Micro-batches of one shape after the first (which creates the gradients) make the same requests; once
  // one leaves both allocators exactly as the one before it did, every later one would too, and the rest
  // are recorded as repetitions of it instead of being run: a dry run costs the same at any accumulation.
  std::vector<std::size_t> begins;  // where each micro-batch's requests start
  std::size_t i = 0;                // the next micro-batch's shape
  AllocatorSnapshot dev_was, host_was;
  const auto after_micro = [&](int64_t k) -> int64_t {
    const std::size_t at = std::size_t(k);
    // Only a micro-batch followed by one of its shape can be repeated, and the first is never a repetition, nor
    // the last where its backward differs (Zero::last_backward_differs): the allocators are
    // compared (snapshots cost a walk over every block) only where it can pay.
    const std::size_t last = micro.size() - (engine_->zero().last_backward_differs() ? 1 : 0);
    if (rec || at == 0 || at + 1 >= last || micro[at + 1] != micro[at]) return 0;
    AllocatorSnapshot dev_now = dev->snapshot(), host_now = host->snapshot();
    if (at >= 2 && micro[at] == micro[at - 1] &&
        requests->periodic(begins[at - 1], begins[at], requests->requests().size()) && dev_now == dev_was &&
        host_now == host_was) {
      std::size_t rest = 0;
      while (at + 1 + rest < last && micro[at + 1 + rest] == micro[at]) ++rest;
      requests->repeat_last(begins[at], rest);
      p.micro_batches_repeated += int64_t(rest);
      i += rest;
      return int64_t(rest);
    }
    dev_was = std::move(dev_now);  // the micro-batch after this one, of the same shape, compares with these
    host_was = std::move(host_now);
    return 0;
  };
  try {
    engine_->step(
        [&] {
          begins.push_back(requests->requests().size());
          return synthetic_batch(config_.model.config, micro[i++], kMetaHost);
        },
        int64_t(micro.size()), 1.f, after_micro);
    engine_->update(1e-3f, 1.f);
  } catch (...) {
    dev->set_trace(nullptr);
    host->set_trace(nullptr);
    if (timeline) set_span_timeline(nullptr);
    throw;
  }
  dev->set_trace(nullptr);
  host->set_trace(nullptr);
  if (timeline) set_span_timeline(nullptr);
  requests->check();
  if (planned) {
    p.layout = std::make_shared<const ArenaLayout>(layout_arena(*requests));
    dev->end_stretch(p.layout);
  }
  record_peaks(p, dev->stats(), host->stats(), dw);
  p.requests = std::move(requests);
  return p;
}

int64_t Predictor::eval_rows() const {
  // Each rank evaluates its share of the samples, in batches of eval_batch_size.
  int64_t n = config_.eval_samples > 0 ? config_.eval_samples : 0;
  if (config_.eval_json.empty() && config_.synth_eval > 0)
    n = n > 0 ? std::min(n, config_.synth_eval) : config_.synth_eval;
  const int64_t world = comm_->world();
  return n > 0 ? std::max<int64_t>(1, std::min(config_.eval_batch_size, (n + world - 1) / world))
               : config_.eval_batch_size;
}

EvalShape Predictor::eval_worst_case() const {
  const int64_t b = eval_rows();
  return {b, config_.max_seq_len, b * config_.max_images_per_sample, b * config_.max_new_tokens};
}

GenerationShape Predictor::generation_worst_case() const {
  const int64_t b = eval_rows();
  return {std::vector<int64_t>(std::size_t(b), config_.max_seq_len), b * config_.max_images_per_sample,
          config_.max_new_tokens};
}

Prediction Predictor::inference(const std::function<void()>& pass) {
  MemoryContext::Use use(memory_);
  auto dev = allocator_for(Device::meta()), host = allocator_for(kMetaHost);
  dev->reset_peak_stats();
  host->reset_peak_stats();
  Prediction p;
  p.persistent = dev->stats().allocated_bytes.current;
  PeakWatch dw(dev->stats());
  dev->set_trace([&](const TraceEvent& e) { dw(e); });
  try {
    pass();
  } catch (...) {
    dev->set_trace(nullptr);
    throw;
  }
  dev->set_trace(nullptr);
  record_peaks(p, dev->stats(), host->stats(), dw);
  return p;
}

Prediction Predictor::evaluation(const EvalShape& e) {
  return inference([&] {
    const LoadedBatch lb = synthetic_batch(config_.model.config, {e.batch, e.seq, e.images}, kMetaHost);
    ModelOptions o;
    o.inference = true;
    o.ce_chunk_rows = config_.ce_chunk_rows;
    for (int64_t i = 0; i < e.logit_rows; ++i) o.logits_at.push_back(i % (e.batch * e.seq));
    LlavaState st;
    engine_->model().forward(lb.batch, st, o);
  });
}

Prediction Predictor::generation(const GenerationShape& g) {
  HR_CHECK(!g.prompt_lengths.empty() && g.max_new_tokens >= 1,
           "[plan] generation needs prompts and max_new_tokens >= 1");
  return inference([&] {
    const Llava& model = engine_->model();
    const int64_t B = int64_t(g.prompt_lengths.size());
    const int64_t longest = *std::max_element(g.prompt_lengths.begin(), g.prompt_lengths.end());
    // As generate() does it: the cache, the prompts' batch, the prefill, then decode steps.
    KvCache cache = model.make_cache(B, longest + g.max_new_tokens - 1);
    const LoadedBatch lb = synthetic_batch(model.config(), {B, longest, g.images}, kMetaHost);
    Tensor logits = model.prefill(lb.batch, g.prompt_lengths, cache);
    if (g.max_new_tokens > 1 && g.decode_steps > 0) {
      logits = Tensor();
      logits = model.decode(std::vector<int64_t>(std::size_t(B), ByteTokenizer::kPad), cache);
    }
  });
}

// ---- decisions ----

std::string Decisions::describe() const {
  std::string s =
      str("micro ", micro_batch_size, " x accumulation ", gradient_accumulation_steps, ", ZeRO ", zero_stage,
          ", checkpointing vision ", checkpoint_name(vision_ckpt), " / llm ", checkpoint_name(llm_ckpt));
  if (zero_stage == 3) s += str(", prefetch ", prefetch_groups);
  if (offload_optimizer == parallel::Offload::Cpu) s += ", optimizer on cpu";
  if (offload_params == parallel::Offload::Cpu) s += ", params on cpu";
  if (allocator != AllocatorKind::Caching) s += str(", ", allocator_kind_name(allocator), " allocator");
  return s + ", " + precision_name(precision);
}

namespace {

Decisions decisions_of(const RunConfig& c) {
  Decisions d;
  d.precision = c.precision;
  d.vision_ckpt = c.vision_ckpt.kind;
  d.llm_ckpt = c.llm_ckpt.kind;
  d.allocator = c.allocator;
  d.micro_batch_size = c.micro_batch_size;
  d.gradient_accumulation_steps = c.gradient_accumulation_steps;
  d.zero_stage = c.zero.stage;
  d.prefetch_groups = c.zero.prefetch_groups;
  d.offload_optimizer = c.zero.offload_optimizer;
  d.offload_params = c.zero.offload_params;
  return d;
}

bool vision_used(const LlavaConfig& m) {
  return m.vision.layers > 0;
}

// ---- the cost model ----

struct Counts {
  double vision_layer = 0, vision_other = 0, projector = 0, llm_layer = 0, embed = 0, head = 0;  // parameters
  bool vision_trainable = false, projector_trainable = false, llm_trainable = false;
};

// The rows of the parameter table: both vision kinds are the tower, the norm and lm_head one row.
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

Counts counts_of(const Llava& m) {
  Counts k;
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

double recompute_fraction(CheckpointKind k) {
  // Of a block's forward: full recomputes all of it, selective everything but the attention core.
  return k == CheckpointKind::Full ? 1.0 : k == CheckpointKind::Selective ? 0.8 : 0.0;
}

StepTime step_time(const Plan& p, const Counts& k) {
  const RunConfig& c = p.config;
  const LlavaConfig& m = c.model.config;
  StepTime t;
  const double B = double(c.micro_batch_size), L = double(c.max_seq_len), A = double(c.gradient_accumulation_steps);
  const double I = B * double(c.max_images_per_sample), N = double(m.vision.num_positions());
  // Forward FLOPs per micro-batch: 2 x parameters x tokens for the matmuls, plus attention scores and values.
  const double v_layers = double(m.vision.layers_used());
  const double vis_fwd = vision_used(m) && I > 0 ? 2.0 * k.vision_layer * v_layers * I * N +
                                                       4.0 * v_layers * I * N * N * double(m.vision.hidden)
                                                 : 0;
  const double proj_fwd = I > 0 ? 2.0 * k.projector * I * double(m.vision.tokens_per_image()) : 0;
  const double llm_layers_fwd =
      2.0 * k.llm_layer * double(m.llm.layers) * B * L + 2.0 * double(m.llm.layers) * B * L * L * double(m.llm.hidden);
  const double head_fwd = 2.0 * double(m.llm.hidden) * double(m.llm.vocab) * B * L;
  const bool grads_reach_llm = k.llm_trainable || k.projector_trainable || k.vision_trainable;
  const double bwd = (grads_reach_llm ? 2.0 * (llm_layers_fwd + head_fwd) : 0) +
                     (k.projector_trainable || k.vision_trainable ? 2.0 * proj_fwd : 0) +
                     (k.vision_trainable ? 2.0 * vis_fwd : 0);
  const double recompute = (grads_reach_llm ? recompute_fraction(c.llm_ckpt.kind) * llm_layers_fwd : 0) +
                           (k.vision_trainable ? recompute_fraction(c.vision_ckpt.kind) * vis_fwd : 0);
  const double flops = A * (vis_fwd + proj_fwd + llm_layers_fwd + head_fwd + bwd);
  const bool low = c.precision != Precision::FP32;
  // Achieved throughput: half the datasheet peak on a GPU at best, and less for small micro-batches, whose
  // GEMMs have few rows (half the best at 1024 tokens per micro-batch on a GPU, 64 on the CPU).
  const double rows = B * L, half = p.device.cuda ? 1024.0 : 64.0;
  const double peak =
      (low ? p.device.tflops_bf16 : p.device.tflops_fp32) * 1e12 * (p.device.cuda ? 0.5 : 1.0) * rows / (rows + half);
  t.flops = flops + A * recompute;
  t.model_flops = flops;
  t.compute_s = flops / peak;
  t.recompute_s = A * recompute / peak;
  t.compute_s += t.recompute_s;
  // Collectives (ring algorithms: (W-1)/W of the buffer crosses each link per reduce-scatter or all-gather).
  const double W = double(p.world), ring = (W - 1) / W;
  const double e = low ? 2 : 4;
  double trainable = 0, all = 0;
  for (const auto& [name, n] : p.params_by_module) all += double(n);
  trainable = double(p.params_trainable);
  double moved = 0, gathered = 0, reduced = 0, all_reduced = 0;
  if (W > 1) {
    if (c.zero.stage <= 1) all_reduced = 2 * ring * trainable * e, moved += all_reduced;  // all-reduce of the gradients
    if (c.zero.stage >= 1) moved += ring * trainable * e;                         // all-gather of updated parameters
    if (c.zero.stage >= 2) reduced = A * ring * trainable * e, moved += reduced;  // reduce-scatter per micro-batch
    if (c.zero.stage == 3)
      gathered = A * 2 * ring * all * e, moved += gathered - ring * trainable * e;  // gathers in fwd and bwd instead
  }
  t.comm_s = moved / (p.device.link_gbps * 1e9);
  // Overlap: each group's prefetched gather runs while the group before it computes, and (overlap_comm) each
  // group's reduce-scatter while the next group's backward computes; all but the first (last) of each pass
  // hide, as far as there is compute to hide under. At stages 0-1 the gradient all-reduce hides the same way,
  // under the last micro-batch's backward only.
  const double groups = double(m.llm.layers) + (vision_used(m) ? v_layers : 0) + 3;
  const double link = p.device.link_gbps * 1e9, hide = 1 - 1 / groups;
  double overlappable = 0;
  if (c.zero.prefetch_groups > 0) overlappable += gathered;
  if (c.zero.overlap_comm) overlappable += reduced;
  double hidden = std::min(overlappable / link * hide, t.compute_s);
  if (c.zero.overlap_comm) hidden += std::min(all_reduced / link * hide, bwd / peak);
  t.hidden_comm_s = std::min(hidden, t.compute_s);
  // Offload: gradients out and parameters back over PCIe, and the host's AdamW (~1e9 parameters/s). At ZeRO 2-3
  // each group's gradient shard leaves as its reduction ends on the last micro-batch (all but the last group's
  // under that backward); at ZeRO-3 each group's updated shard goes back while the next group updates on the host
  // (all but the last group's under the host update).
  const double shard = c.zero.stage >= 1 ? trainable / W : trainable;
  if (c.zero.offload_optimizer == parallel::Offload::Cpu) {
    const double transfer = shard * e / (p.device.host_gbps * 1e9), adam = shard / 1e9;
    const double down_hidden = c.zero.stage >= 2 ? std::min(transfer * hide, bwd / peak) : 0;
    const double up_hidden = c.zero.stage == 3 ? std::min(transfer * hide, adam) : 0;
    t.hidden_offload_s = down_hidden + up_hidden;
    t.offload_s = 2 * transfer + adam - t.hidden_offload_s;
  }
  if (c.zero.offload_params == parallel::Offload::Cpu)
    t.offload_s += A * 2 * (all / W) * e / (p.device.host_gbps * 1e9);
  return t;
}

// ---- the closed form ----

int64_t elem(DType t) {
  return int64_t(dtype_size(t));
}

std::vector<ClosedFormRow> closed_form(const Plan& p, const Llava& model) {
  const RunConfig& c = p.config;
  const LlavaConfig& m = c.model.config;
  const int W = p.world;
  const bool low = c.precision != Precision::FP32;
  const int64_t e = elem(param_dtype(c.precision));
  int64_t params = 0, trainable = 0, largest = 0, largest_trainable = 0;
  for (const ParamGroup& g : model.groups()) {
    int64_t bytes = 0, trainable_bytes = 0;
    for (const Param* q : g.params) {
      bytes += q->numel() * elem(q->dtype);
      // Per parameter: a LoRA layer's adapters train, its base does not.
      if (q->trainable) trainable += q->numel(), trainable_bytes += q->numel() * elem(q->grad_dtype);
    }
    params += bytes;
    largest = std::max(largest, bytes);
    largest_trainable = std::max(largest_trainable, trainable_bytes);
  }
  const int zs = c.zero.stage;
  const bool off = c.zero.offload_optimizer == parallel::Offload::Cpu;
  std::vector<ClosedFormRow> rows;
  auto at = [&](Category cat) { return p.rank.at_peak[std::size_t(cat)]; };
  const LoraSpec& lora = model.config().llm.lora;
  const std::string quantized =
      lora.quantizes_base()
          ? str(" (the decoder's linear weights: ", lora.base_format().describe(), ", bits / 8 + constants per weight)")
          : "";
  rows.push_back(
      {"params", zs == 3 ? params / W + largest : params, at(Category::Params),
       (zs == 3 ? "parameter bytes / world + the largest group gathered" : "parameter count x bytes per parameter") +
           quantized});
  const int64_t ge = c.grad_accum == GradAccum::Fp32 ? 4 : e;  // gradient bytes per trainable parameter
  const char* in = c.grad_accum == GradAccum::Fp32 && e < 4 ? " (accumulated in f32)" : "";
  rows.push_back({"grads", zs >= 2 ? trainable * ge / W + largest_trainable : trainable * ge, at(Category::Grads),
                  zs >= 2 ? str("trainable x bytes", in, " / world + one group's full gradients while reduced")
                          : str("trainable x bytes", in)});
  rows.push_back({"master_params", off || !low ? 0 : trainable * 4 / (zs >= 1 ? W : 1), at(Category::MasterParams),
                  off   ? "on the host"
                  : low ? "trainable x 4 (f32 master copy) / ZeRO share"
                        : "none in fp32"});
  const int64_t states = c.optimizer.kind == optim::OptimizerKind::AdamW ? 8 : c.optimizer.momentum != 0.f ? 4 : 0;
  rows.push_back({"optimizer", off ? 0 : trainable * states / (zs >= 1 ? W : 1), at(Category::Optimizer),
                  off ? "on the host" : str("trainable x ", states, " (f32 states) / ZeRO share")});
  // Activations: what every block keeps by its policy, plus the loss inputs.
  const int64_t B = c.micro_batch_size, L = c.max_seq_len, n = B * L, C = m.llm.hidden, H = m.llm.heads;
  const int64_t kv = m.llm.kv_heads * m.llm.head_dim(), I = m.llm.intermediate;
  auto llm_block = [&](CheckpointKind k) {
    if (k == CheckpointKind::Full) return n * C * e;
    if (k == CheckpointKind::Selective) return 3 * n * C * e + n * H * 4;
    return 6 * n * C * e + 2 * n * kv * e + 3 * n * I * e + n * H * 4 + 2 * n * 4;
  };
  const bool llm_saves = p.params_trainable > 0;
  int64_t act = 0;
  if (llm_saves)
    for (int64_t l = 0; l < m.llm.layers; ++l) act += llm_block(c.llm_ckpt.for_block(l));
  act += 2 * n * C * e + n * 4;  // final norm input and the shifted hidden states
  int64_t transient = llm_block(CheckpointKind::None) + 3 * n * C * e;
  // LoRA: the widest adapted layer's input with dropout applied and its input gradient.
  if (lora.r > 0) {
    const bool wide = lora.adapts("down_proj");
    transient += n * (wide ? I : C) * e * (lora.dropout > 0.f ? 2 : 1);
  }
  rows.push_back({"activations", act + transient, at(Category::Activations),
                  str("kept per block by policy (", checkpoint_name(c.llm_ckpt.kind), ") + one block's backward",
                      lora.r > 0 ? " + LoRA's widest input and its gradient" : "")});
  const core::Kernels& target = core::sizing_kernels(p.device.cuda ? Backend::CUDA : Backend::CPU);
  const int64_t chunk =
      std::min(c.ce_chunk_rows > 0 ? c.ce_chunk_rows
                                   : default_chunk_rows(B * (L - 1), m.llm.vocab, target.cross_entropy_chunk_bytes),
               B * (L - 1));
  // Where GEMMs narrow a mixed pair (cuBLAS), the backward also keeps the chunk's gradient in the model's dtype.
  const bool narrow = target.gemm_mixing == core::GemmMixing::NarrowToOutput && e < 4;
  rows.push_back(
      {"workspace", chunk * m.llm.vocab * (4 + (narrow ? e : 0)), at(Category::Workspace),
       narrow ? "the cross-entropy logits chunk (f32) and its gradient" : "the cross-entropy logits chunk (f32)"});
  rows.push_back({"comm", 0, at(Category::Comm), "gather/reduce buffers live between compute, not at the peak"});
  rows.push_back(
      {"io", 3 * n * 8, at(Category::IO), "token ids, shifted labels, positions (i64); pixels are freed by then"});
  return rows;
}

}  // namespace

// ---- plans ----

void use_cpu_threads(const RunConfig& c, int world) {
  if (c.threads > 0) {
    omp_set_num_threads(c.threads);
    return;
  }
  if (world == 1) return;
  int local = world;  // ranks on this machine
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (const char* s = std::getenv(v)) {
      local = std::max(1, std::atoi(s));
      break;
    }
  omp_set_num_threads(std::max(1, omp_get_num_procs() / local));
}

bool plans_evaluation(const RunConfig& c) {
  return !c.eval_json.empty() || (c.train_json.empty() && c.synth_eval > 0);
}

int64_t Plan::total_predicted() const {
  int64_t peak = rank.peak_reserved;
  // Past the usable bytes the allocator frees its cached blocks and retries: then what is allocated counts.
  if (evaluates)
    for (const Prediction* e : {&eval, &generation})
      peak = std::max(peak, e->peak_reserved <= usable ? e->peak_reserved : e->peak_allocated);
  return peak + runtime_reserve;
}

core::Device run_device_of(const RunConfig& c, int local_rank) {
  core::Device d = core::Device::parse(c.device);
  if (d.type != core::DeviceType::CUDA || local_rank == 0) return d;
  const int gpus = c.gpu_collectives_over_mpi ? int(core::query_cuda().gpus.size()) : 0;
  d.index += gpus > d.index ? local_rank % (gpus - d.index) : local_rank;
  return d;
}

core::Device inference_device(const RunConfig& c) {
  const core::Device d = run_device_of(c);
  if (d.type != core::DeviceType::CUDA) return core::Device::cpu();
  core::cuda_memory_after_start(d.index);  // names the device when it cannot be used
  configure_run_device(d, c.memory_limit, c.allocator);
  return d;
}

DevicePreset run_device(const RunConfig& c, int local_rank) {
  const core::Device d = run_device_of(c, local_rank);
  if (d.type == core::DeviceType::CUDA) return local_gpu_preset(d.index, c.memory_limit);
  return device_preset(c.memory_limit ? str("cpu:", c.memory_limit) : std::string("cpu"));
}

namespace {

// Before a dry run builds the model (on the meta device, but its modules and parameter records are host memory):
// the parameters alone, in the smallest dtype they are held in and sharded as far as the stage shards them, must
// fit where they live. A model that cannot fit anywhere (num_hidden_layers: 100000000) is refused by this
// arithmetic, whatever memory.preflight says, instead of being built.
void check_parameters_can_fit(const RunConfig& c, const DevicePreset& device, int world) {
  const models::LlavaConfig& m = c.model.config;
  double per_param = double(dtype_size(param_dtype(c.precision)));
  if (c.lora_enable && c.lora.quantizes_base()) per_param = std::min(per_param, c.lora.base_bits / 8.0);
  const bool sharded = c.zero.stage == 3;
  const double bytes = double(m.parameter_count()) * per_param / (sharded ? world : 1);
  const bool on_host = sharded && c.zero.offload_params == parallel::Offload::Cpu;
  const double room =
      on_host ? double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE)) : double(device.capacity);
  HR_CHECK(room <= 0 || bytes <= room, "[plan] ", m.largest_part(), ": the model's ", double(m.parameter_count()),
           " parameters take at least ", format_bytes(bytes), sharded ? " per rank" : "", " as ",
           precision_name(c.precision), " parameters, more than ", on_host ? "this host's " : "the ",
           format_bytes(room), on_host ? "" : " of " + device.name,
           "; no plan can fit, so none is dry-run (smaller model sizes, or ZeRO-3 over more ranks)");
}

}  // namespace

Plan make_plan(const RunConfig& config, const DevicePreset& device, int world) {
  check_parameters_can_fit(config, device, world);
  Plan p;
  p.decisions = decisions_of(config);
  p.config = config;
  p.device = device;
  p.world = world;
  parallel::validate(config.zero, config.optimizer);
  HR_CHECK(!(config.precision == Precision::BF16 && !device.bf16), "[plan] ", device.name,
           " has no bf16 arithmetic; use memory.precision: fp16 or fp32");
  const core::SizingTarget target = sizing_target(device);
  p.capacity = int64_t(device.capacity);
  p.runtime_reserve = int64_t(device.runtime_reserve);
  p.usable = int64_t(double(config.budget) * double(device.capacity)) - p.runtime_reserve;
  // First uncapped: the peaks as they are. If the reserved peak passes the usable bytes, again on a meta
  // device capped there: the allocator frees its cache and retries exactly as the real one would, so the
  // step either fits that way or runs out of memory here instead of on the device.
  Predictor pred(config, world, 0, target);
  p.rank = pred.step(pred.worst_case());
  p.fits = p.usable > 0 && p.rank.peak_reserved <= p.usable;
  if (!p.fits && p.usable > 0 && p.rank.peak_allocated <= p.usable) {
    try {
      Predictor capped(config, world, 0, target, std::size_t(p.usable));
      p.rank = capped.step(capped.worst_case());
      p.fits = p.retries = true;
    } catch (const OutOfMemory&) {  // the uncapped prediction stands, with its reserved peak over the budget
    }
  }
  if (config.eval_batch_size > 0 && plans_evaluation(config)) {
    p.evaluates = true;
    p.eval = pred.evaluation(pred.eval_worst_case());
    const GenerationShape g = pred.generation_worst_case();
    p.generation = pred.generation(g);
    const models::LlmConfig& llm = config.model.config.llm;
    const int64_t rows = p.eval_rows = int64_t(g.prompt_lengths.size());
    p.kv_cache_bytes =
        KvCache::bytes(llm, rows, config.max_seq_len + g.max_new_tokens - 1, pred.model().params().dtype());
    p.model_element_bytes = int64_t(dtype_size(pred.model().params().dtype()));
    p.generation_logits_bytes = rows * llm.vocab * p.model_element_bytes;
    // The allocator frees its cached blocks and retries before it fails, so what must fit is what is allocated.
    p.eval_fits = p.usable > 0 && std::max(p.eval.peak_allocated, p.generation.peak_allocated) <= p.usable;
    p.fits = p.fits && p.eval_fits;
  }
  const Llava& model = pred.model();
  p.params_total = model.params().count();
  p.params_trainable = model.params().count(true);
  auto add = [&](const std::string& module, int64_t n) {
    for (auto& [name, v] : p.params_by_module)
      if (name == module) return void(v += n);
    p.params_by_module.emplace_back(module, n);
  };
  for (const ParamGroup& g : model.groups()) {
    int64_t n = 0;
    for (const Param* q : g.params) n += q->count();
    add(module_name(g.kind), n);
  }
  p.time = step_time(p, counts_of(model));
  p.closed_form = closed_form(p, model);
  return p;
}

}  // namespace hr::train
