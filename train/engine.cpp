// The engine: model construction by stage and precision, starting or resuming, sharding, the step, saving.
#include "train/engine.h"

#include <cmath>

#include "core/memory/timeline.h"
#include "core/ops/dispatch.h"
#include "core/ops/reduce.h"
#include "models/hf_start.h"
#include "models/weights.h"
#include "train/run_files.h"

namespace hr::train {

using namespace hr::core;
using namespace hr::models;
using namespace hr::data;

DType param_dtype(Precision p) {
  return p == Precision::FP32 ? DType::F32 : p == Precision::BF16 ? DType::BF16 : DType::F16;
}

std::unique_ptr<Llava> build_model(const RunConfig& c, Device device) {
  LlavaConfig mc = c.model.config;
  if (c.lora_enable) mc.llm.lora = c.lora;
  auto model = std::make_unique<Llava>(mc, device, param_dtype(c.precision),
                                       c.vision_fp32 ? std::optional<DType>(DType::F32) : std::nullopt);
  if (c.grad_accum == GradAccum::Fp32) model->params().accumulate_grads_in(DType::F32);
  model->set_trainable({.vision = c.stage == Stage::Full && !c.model.freeze_vision,
                        .projector = !c.model.freeze_projector,
                        .llm = c.stage != Stage::Pretrain && !c.model.freeze_llm});
  return model;
}

Engine::Engine(const RunConfig& c, Device device, parallel::Communicator& comm)
    : config_(c), comm_(comm), model_(build_model(c, device)) {
  options_.vision_policy = c.vision_ckpt;
  options_.llm_policy = c.llm_ckpt;
  options_.ce_chunk_rows = c.ce_chunk_rows;
  options_.padding_free = c.padding_free == PaddingFree::On;
}

Engine::~Engine() = default;

void Engine::shard() {
  zero_ = std::make_unique<parallel::Zero>(*model_, comm_, config_.optimizer, config_.zero);
  if (config_.vision_lr > 0.f)
    for (GroupKind k : {GroupKind::EncoderStem, GroupKind::EncoderLayer})
      zero_->set_lr_ratio(k, config_.vision_lr / config_.learning_rate);
  if (config_.projector_lr > 0.f)
    zero_->set_lr_ratio(GroupKind::Projector, config_.projector_lr / config_.learning_rate);
}

TrainerState Engine::start() {
  const models::ModelSpec& spec = config_.model;
  if (config_.init_weights.empty()) {
    init_weights(model_->params(), config_.seed);
    if (!spec.vision_tower.empty()) load_stage1_weights(model_->params(), spec.vision_tower, spec.language_model);
  } else {
    load_weights(model_->params(), Checkpoint::open(config_.init_weights), MissingWeights::Error);
    load_adapters_in(config_.init_weights, *model_);
  }
  if (!config_.projector_weights.empty()) load_projector(model_->params(), config_.projector_weights);
  shard();
  return {};
}

TrainerState Engine::load(const std::string& dir) {
  TrainerState state = read_trainer_state(dir);
  load_model_weights(dir, *model_);
  shard();
  load_optimizer_state(dir, *zero_, state.optimizer_steps);
  return state;
}

void Engine::save(const TrainerState& state) {
  // Never a checkpoint of non-finite weights (a diverged run): rotation would delete the good ones for it. Every
  // rank checks what it writes, and all agree before any writes.
  const std::string bad = first_nonfinite_tensor();
  if (comm_.sum(bad.empty() ? 0.0 : 1.0) > 0) {
    const std::optional<std::string> last = latest_checkpoint(config_.output_dir);
    throw parallel::EveryRankError(
        str("[checkpoint] not writing checkpoint-", state.step, ": ",
            bad.empty() ? std::string("another rank's tensors are") : bad + " is", " not finite (the run diverged); ",
            last ? "the last checkpoint, " + *last + ", is kept as it is" : std::string("no checkpoint was written"),
            ". Lower train.learning_rate or check the data"));
  }
  save_checkpoint(config_.output_dir, *model_, *zero_, state, config_.save_total_limit, comm_, config_.resolved_yaml,
                  run_hf_sidecar(config_));
}

Engine::StepStats Engine::step(const std::function<LoadedBatch()>& next, int64_t micro_batches, float loss_scale,
                               const std::function<int64_t(int64_t)>& after_micro) {
  StepStats out;
  out.loss_scale = loss_scale;
  double loss_sum = 0;
  const double flops_before = core::matmul_flops();
  zero_->begin_step();
  for (int64_t micro = 0; micro < micro_batches; ++micro) {
    zero_->begin_micro_batch(micro + 1 == micro_batches ? parallel::Zero::MicroBatch::Last
                                                        : parallel::Zero::MicroBatch::Earlier);
    {
      LoadedBatch lb = next();
      out.tokens += lb.tokens;
      LlavaState st;
      loss_sum += model_->forward(lb.batch, st, options_);
      out.loss_tokens += st.valid_labels;
      model_->backward(st, loss_scale / float(micro_batches * comm_.world()));
    }  // the micro-batch's tensors are gone before it counts as done
    if (after_micro) micro += after_micro(micro);
  }
  zero_->finish_gradients();
  out.flops = core::matmul_flops() - flops_before;
  out.scaled_norm = zero_->grad_norm();
  if (comm_.world() > 1) {
    loss_sum = comm_.sum(loss_sum) / comm_.world();
    // The counts in one collective.
    const std::vector<double> counts = comm_.gather({double(out.tokens), double(out.loss_tokens), out.flops});
    out.tokens = out.loss_tokens = 0;
    out.flops = 0;
    for (std::size_t r = 0; r < counts.size(); r += 3) {
      out.tokens += int64_t(counts[r]);
      out.loss_tokens += int64_t(counts[r + 1]);
      out.flops += counts[r + 2];
    }
  }
  out.loss = loss_sum / double(micro_batches);
  return out;
}

void Engine::update(float lr, float grad_scale) {
  core::TraceSpan span("optimizer", "optimizer step");
  zero_->step(lr, grad_scale);
  zero_->end_step();
}

void Engine::skip_update() {
  zero_->end_step();
}

namespace {

bool all_finite(const core::Tensor& t) {
  if (!t.defined() || t.device().type == core::DeviceType::Meta || t.numel() == 0) return true;
  return std::isfinite(core::global_norm({t}).to(core::Device::cpu()).to_floats()[0]);
}

// The first group whose output (forward) or input gradient (backward) holds a NaN or an infinity.
class NonfiniteWatch : public core::OutputWatch {
 public:
  explicit NonfiniteWatch(const core::ParamStore& store) : store_(store) {}
  void output(int group, core::Pass pass, const core::Tensor& t) override {
    if (!found.empty() || all_finite(t)) return;
    const core::ParamGroup& g = store_.groups()[std::size_t(group)];
    found =
        str(g.name, pass == core::Pass::Forward ? " (its forward output)" : " (the gradient its backward passes on)");
    // The group's parameters are in place while it runs (gathered under ZeRO-3).
    for (const core::Param* p : g.params)
      if (!p->quantized() && !all_finite(p->data)) found += str("; parameter ", p->name, " is not finite");
  }
  std::string found;

 private:
  const core::ParamStore& store_;
};

}  // namespace

std::string Engine::first_nonfinite_tensor() const {
  if (!zero_->shards_parameters())  // the model's weights are written whole (by rank 0; every rank holds them)
    for (const auto& p : model_->params().all())
      if (!p->quantized() && !all_finite(p->data)) return "parameter " + p->name;
  for (const auto& [name, t] : zero_->state())
    if (core::is_float(t.dtype()) && !all_finite(t)) return "optimizer state " + name;
  return "";
}

std::string Engine::diagnose_nonfinite(const data::LoadedBatch& batch, float loss_scale) {
  NonfiniteWatch watch(model_->params());
  model_->set_watch(&watch);
  struct Unwatch {
    models::Llava& m;
    ~Unwatch() { m.set_watch(nullptr); }
  } unwatch{*model_};
  zero_->begin_step();
  models::LlavaState st;
  const float loss = model_->forward(batch.batch, st, options_);
  if (watch.found.empty() && !std::isfinite(loss)) watch.found = "the loss (cross-entropy of finite logits)";
  model_->backward(st, loss_scale / float(comm_.world()));
  zero_->finish_gradients();
  return watch.found;
}

}  // namespace hr::train
