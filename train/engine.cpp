// The engine: model construction by stage and precision, sharding, and the training step.
#include "train/engine.h"

namespace hr::train {

using namespace hr::core;
using namespace hr::models;
using namespace hr::data;

DType param_dtype(Precision p) {
  return p == Precision::FP32 ? DType::F32 : p == Precision::BF16 ? DType::BF16 : DType::F16;
}

Engine::Engine(const RunConfig& c, Device device, parallel::Communicator& comm) : config_(c), comm_(comm) {
  model_ = std::make_unique<Llava>(c.model.config, device, param_dtype(c.precision),
                                   c.vision_fp32 ? std::optional<DType>(DType::F32) : std::nullopt);
  const bool vision = c.stage == Stage::Full && !c.model.freeze_vision;
  const bool projector = !c.model.freeze_projector;
  const bool llm = c.stage != Stage::Pretrain && !c.model.freeze_llm;
  model_->set_trainable(vision, projector, llm);
  options_.vision_policy = c.vision_ckpt;
  options_.llm_policy = c.llm_ckpt;
  options_.ce_chunk_rows = c.ce_chunk_rows;
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

Engine::Accumulated Engine::accumulate(const std::function<LoadedBatch()>& next, int64_t micro_batches, float loss_scale) {
  Accumulated out;
  zero_->begin_step();
  for (int64_t micro = 0; micro < micro_batches; ++micro) {
    LoadedBatch lb = next();
    out.tokens += lb.tokens;
    LlavaState st;
    out.loss_sum += model_->forward(lb.batch, st, options_);
    model_->backward(st, loss_scale / float(micro_batches * comm_.world()));
  }
  zero_->finish_gradients();
  out.scaled_norm = zero_->grad_norm();
  return out;
}

void Engine::update(float lr, float grad_scale) {
  zero_->step(lr, grad_scale);
  zero_->end_step();
}

void Engine::skip_update() { zero_->end_step(); }

}  // namespace hr::train
