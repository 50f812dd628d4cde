// Training-step cases: the strategy combinations and an in-process engine for any device.
#include "step_cases.h"

#include "models/anyres.h"
#include "models/weights.h"
#include "train/planner.h"

namespace hr::test {

using namespace hr::core;

namespace {

const std::vector<std::string> kBase = {
    "model.preset=tiny",        "model.vision.image_size=8",   "model.vision.patch_size=4",
    "model.llm.vocab_size=300", "model.image_token_index=299", "data.max_seq_len=24",
    "train.stage=full",         "train.micro_batch_size=2",    "train.learning_rate=0.001",
};

}  // namespace

std::vector<StepCase> step_cases() {
  return {
      {"fp32", 1, {}},
      {"bf16_selective_accumulate",
       1,
       {"memory.precision=bf16", "memory.gradient_checkpointing=selective", "train.gradient_accumulation_steps=2"}},
      {"fp16_full_micro1",
       1,
       {"memory.precision=fp16", "memory.gradient_checkpointing=full", "train.micro_batch_size=1",
        "train.gradient_accumulation_steps=2"}},
      {"finetune_llm_selective", 1, {"train.stage=finetune", "memory.gradient_checkpointing.llm=selective"}},
      {"pretrain_bf16_llm_full",
       1,
       {"train.stage=pretrain", "memory.precision=bf16", "memory.gradient_checkpointing.llm=full"}},
      {"vision_fp32", 1, {"train.stage=finetune", "memory.precision=bf16", "memory.vision_precision=fp32"}},
      {"every_second_block_sgd",
       1,
       {"memory.gradient_checkpointing=full", "memory.gradient_checkpointing.every=2", "train.optimizer=sgd"}},
      {"adafactor", 1, {"train.optimizer=adafactor"}},
      {"offload_optimizer", 1, {"memory.offload_optimizer=cpu", "train.gradient_accumulation_steps=2"}},
      // Activation offload: the kept tensors of checkpointed blocks wait on the host between forward and backward.
      {"offload_activations_selective_accumulate",
       1,
       {"memory.gradient_checkpointing=selective", "memory.offload_activations=cpu",
        "train.gradient_accumulation_steps=2"}},
      {"offload_activations_full_bf16_every_second",
       1,
       {"memory.gradient_checkpointing=full", "memory.gradient_checkpointing.every=2", "memory.offload_activations=cpu",
        "memory.precision=bf16"}},
      {"z0_two_ranks", 2, {}},
      {"z0_blocking_all_reduce", 2, {"parallel.overlap_comm=false"}},
      {"z1_small_buckets_accumulate",
       2,
       {"memory.zero_stage=1", "parallel.bucket_size=16KiB", "train.gradient_accumulation_steps=2"}},
      {"z1_bf16", 2, {"memory.zero_stage=1", "memory.precision=bf16", "memory.gradient_checkpointing.vision=full"}},
      {"z2", 2, {"memory.zero_stage=2"}},
      {"z2_offload", 2, {"memory.zero_stage=2", "memory.offload_optimizer=cpu"}},
      {"z2_blocking_reduce", 2, {"memory.zero_stage=2", "parallel.overlap_comm=false"}},
      {"z3_bf16", 2, {"memory.zero_stage=3", "memory.precision=bf16"}},
      {"z3_offload_everything",
       2,
       {"memory.zero_stage=3", "memory.gradient_checkpointing=full", "memory.offload_optimizer=cpu",
        "memory.offload_params=cpu"}},
      {"z3_no_prefetch", 2, {"memory.zero_stage=3", "parallel.prefetch_groups=0"}},
      {"z3_offload_activations_llm",
       2,
       {"memory.zero_stage=3", "memory.gradient_checkpointing.llm=full", "memory.offload_activations.llm=cpu"}},
      // The tied head borrows the embedding's group: gathered twice a pass, its gradient reduced twice.
      {"z3_tied_bf16_offload_accumulate",
       2,
       {"model.llm.tie_word_embeddings=true", "memory.zero_stage=3", "memory.precision=bf16",
        "memory.offload_optimizer=cpu", "train.gradient_accumulation_steps=2"}},
      // 8-bit AdamW's shards: blocks rounded to whole 256-element blocks of the codes (a wider LLM, so that its
      // projections and head keep codes), the norms' and tables' f32 moments in parts of their own.
      {"adamw8bit_z2_bf16",
       2,
       {"train.optimizer=adamw_8bit", "model.llm.hidden_size=64", "model.llm.intermediate_size=90",
        "memory.zero_stage=2", "memory.precision=bf16"}},
      {"adamw8bit_z3_offload",
       2,
       {"train.optimizer=adamw_8bit", "model.llm.hidden_size=64", "model.llm.intermediate_size=90",
        "memory.zero_stage=3", "memory.offload_optimizer=cpu"}},
      {"lora", 1, {"lora.enable=true", "lora.r=4", "lora.alpha=8"}},
      {"lora_bf16_full_accumulate",
       1,
       {"lora.enable=true", "lora.r=4", "memory.precision=bf16", "memory.gradient_checkpointing=full",
        "train.gradient_accumulation_steps=2"}},
      {"lora_z3_selective",
       2,
       {"lora.enable=true", "lora.r=2", "lora.target_modules=[q_proj, v_proj]", "memory.zero_stage=3",
        "memory.gradient_checkpointing=selective"}},
      {"lora_int8", 1, {"lora.enable=true", "lora.r=4", "lora.base_bits=8"}},
      {"lora_int8_bf16_full",
       1,
       {"lora.enable=true", "lora.r=4", "lora.base_bits=8", "memory.precision=bf16",
        "memory.gradient_checkpointing=full"}},
      {"lora_nf4", 1, {"lora.enable=true", "lora.r=4", "lora.base_bits=4"}},
      {"lora_nf4_bf16_selective_accumulate",
       1,
       {"lora.enable=true", "lora.r=4", "lora.base_bits=4", "memory.precision=bf16",
        "memory.gradient_checkpointing=selective", "train.gradient_accumulation_steps=2"}},
      // LLaVA-NeXT's AnyRes: each image its base image and tiles through the tower, tokens mixed with image_newline.
      {"anyres_bf16_selective",
       1,
       {"model.image_grid_pinpoints=[[8, 16], [16, 8]]", "data.max_seq_len=48", "memory.precision=bf16",
        "memory.gradient_checkpointing=selective"}},
      {"anyres_z3_accumulate",
       2,
       {"model.image_grid_pinpoints=[[8, 16], [16, 16]]", "data.max_seq_len=64", "memory.zero_stage=3",
        "train.gradient_accumulation_steps=2"}},
      // train.padding_free (on for the CPU): the LLM runs the labelled rows' positions packed, each sequence's
      // attention its own launch; with a row of no labels at all (the second case's second row).
      // The last layer runs only each sequence's last positions from the first one the loss reads (the tails).
      {"padding_free_bf16_selective",
       1,
       {"memory.precision=bf16", "memory.gradient_checkpointing=selective"},
       {23, 14},
       {4, 9}},
      {"padding_free_z3_full_accumulate",
       2,
       {"memory.zero_stage=3", "memory.gradient_checkpointing=full", "train.gradient_accumulation_steps=2"},
       {20}},
      {"last_layer_tails_full", 1, {"memory.gradient_checkpointing=full"}, {}, {5, 12}},
      {"lora_fp4_z3_full",
       2,
       {"lora.enable=true", "lora.r=2", "lora.base_bits=4", "lora.quant_type=fp4", "lora.double_quant=false",
        "memory.zero_stage=3", "memory.gradient_checkpointing=full"}},
  };
}

StepEngine::StepEngine(const StepCase& c, Device device, const std::function<void(bool)>& initialising)
    : packed_(c.packed),
      tails_(c.tails),
      device_(device),
      host_(device.type == DeviceType::Meta ? Device{DeviceType::Meta, 1} : Device::host()) {
  std::vector<std::string> sets = kBase;
  sets.insert(sets.end(), c.sets.begin(), c.sets.end());
  config_ = train::load_config("", sets, c.world);
  comm_ = parallel::make_planned(c.world, 0);
  engine_ = std::make_unique<train::Engine>(config_, device_, *comm_);
  if (device_.type != DeviceType::Meta) {
    if (initialising) initialising(true);
    models::init_weights(engine_->model().params(), config_.seed);
    if (initialising) initialising(false);
  }
  engine_->shard();
}

StepEngine::~StepEngine() = default;

std::vector<data::Resolution> StepEngine::image_sizes(int64_t images) const {
  const models::LlavaConfig& m = config_.model.config;
  if (!m.anyres.on()) return {};
  return std::vector<data::Resolution>(std::size_t(images),
                                       models::anyres_worst_image(m.anyres, m.vision.image_size, m.vision.grid()));
}

std::vector<train::MicroShape> StepEngine::step_shapes() const {
  const int64_t m = config_.micro_batch_size, images = m * config_.max_images_per_sample;
  const train::MicroShape shape{m, config_.max_seq_len, images, image_sizes(images), packed_, tails_};
  return std::vector<train::MicroShape>(std::size_t(config_.gradient_accumulation_steps), shape);
}

void StepEngine::step(const std::function<data::LoadedBatch()>& batch) {
  const train::MicroShape shape = step_shapes().front();
  engine_->step([&] { return batch ? batch() : train::synthetic_batch(config_.model.config, shape, host_); },
                config_.gradient_accumulation_steps, 1.f);
  engine_->update(1e-3f, 1.f);
}

train::EvalShape StepEngine::evaluate(int64_t logit_rows) {
  const int64_t m = config_.micro_batch_size, images = m * config_.max_images_per_sample;
  const train::EvalShape shape{m, config_.max_seq_len, images, logit_rows, image_sizes(images)};
  const data::LoadedBatch lb =
      train::synthetic_batch(config_.model.config, {shape.batch, shape.seq, shape.images, shape.image_sizes}, host_);
  models::ModelOptions o;
  o.inference = true;
  o.ce_chunk_rows = config_.ce_chunk_rows;
  for (int64_t i = 0; i < logit_rows; ++i) o.logits_at.push_back(i % (shape.batch * shape.seq));
  models::LlavaState st;
  engine_->model().forward(lb.batch, st, o);
  return shape;
}

}  // namespace hr::test
