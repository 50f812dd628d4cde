// The run configuration: a YAML file in sections (run, device, model, data, train, memory, parallel, log)
// with `--set a.b=v` overrides typed as YAML. Every key is known: an unknown key is an error naming the
// closest valid key, a bad value names the key and what it accepts.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "data/conversation.h"
#include "data/image.h"
#include "data/loader.h"
#include "data/synth.h"
#include "models/checkpoint_policy.h"
#include "models/model_spec.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "parallel/zero.h"

namespace hr::train {

enum class Precision : uint8_t { FP32, BF16, FP16 };
// A non-finite loss or gradient in bf16/fp32 (fp16 has its loss scaler): stop the run, or skip the step.
enum class OnNonfinite : uint8_t { Stop, Skip };
OnNonfinite parse_on_nonfinite(const std::string& s);
enum class Stage : uint8_t { Pretrain, Finetune, Full };  // projector only; projector + LLM; everything
enum class ProgressBar : uint8_t { Auto, On, Off };
// train.padding_free: a training pass's LLM runs only the positions its loss reads (models::loss_lengths), the
// rows packed back to back, and its last layer only each sequence's rows from the first its loss reads
// (models::tail_lengths). auto resolves at load: on for the CPU, whose attention runs each packed sequence as
// its own launch at no cost; off on CUDA, where cuDNN's attention would build a graph per sequence length.
enum class PaddingFree : uint8_t { Auto, On, Off };
// memory.grad_accum_dtype: the dtype gradients of a 16-bit model accumulate in (across tokens, loss chunks,
// micro-batches): fp32, or the model's own. auto resolves at load: fp32 for bf16 runs (DeepSpeed's
// data_types.grad_accum_dtype, the f32 gradients of PyTorch's autocast), the model's for fp16 (whose loss scaling
// keeps 16-bit gradients in range) and fp32.
enum class GradAccum : uint8_t { Auto, Fp32, Model };

struct RunConfig {
  // DeepSpeed JSON read onto the keys below (empty: none), and the keys of it read but not acted on.
  std::string deepspeed;
  std::vector<std::string> deepspeed_not_acted_on;
  // run
  std::string output_dir = "runs/default";
  uint64_t seed = 42;
  // device
  std::string device = "cpu";
  std::size_t memory_limit = 0;  // bytes; 0 = the whole device
  int threads = 0;               // 0 = all cores
  // model
  models::ModelSpec model;
  std::string init_weights;       // safetensors file or directory; empty = random initialisation
  std::string projector_weights;  // model.pretrain_mm_mlp_adapter: a projector loaded over init_weights
  // data
  std::string train_json, eval_json, image_folder;
  int64_t synth_train = 4000, synth_eval = 200, synth_image_size = 32, synth_questions = 1;  // when train_json is empty
  uint64_t synth_seed = 0;
  double synth_captions = 0;
  data::SynthAspect synth_aspect = data::SynthAspect::Square;  // data.synthetic.aspect
  // AnyRes: `headroom plan --image-size HxW` plans every image at this size instead of the largest layout.
  std::optional<data::Resolution> plan_image;
  data::Template chat_template = data::Template::VicunaV1;
  std::string system_prompt = "default";  // the template's own (data::default_system)
  // data.tokenizer: "byte", a tokenizer.model / tokenizer.json / directory, or "auto" (model.name_or_path's
  // tokenizer where it has one, else byte). tokenizer() loads it.
  std::string tokenizer = "auto";
  data::AspectMode aspect = data::AspectMode::Pad;
  int64_t max_seq_len = 2048;
  // data.pad_to_multiple_of (the Hugging Face collator's name): batches are padded to a multiple of it (never past
  // max_seq_len), so that a GPU meets few sequence lengths (cuDNN builds an attention graph per shape) that suit its
  // tensor cores. 0 is auto, resolved at load: 64 on a GPU, 1 (the longest sample) on the CPU.
  int64_t pad_to_multiple_of = 0;
  bool group_by_modality_length = false, pad_to_max_length = false, blank_images = false;
  // AnyRes: an image whose layout would make more tokens is shrunk (its aspect ratio kept) to the largest size that
  // makes at most this many, and the planner's worst case is the largest such layout. 0: no bound but the pinpoints.
  int64_t max_image_tokens = 0;
  bool allow_outside_image_folder = false;
  int num_workers = 2, prefetch = 16;
  data::OnBadSample on_bad_sample = data::OnBadSample::Skip;
  OnNonfinite on_nonfinite = OnNonfinite::Stop;
  PaddingFree padding_free = PaddingFree::Auto;
  // train
  Stage stage = Stage::Full;
  int64_t micro_batch_size = 4, gradient_accumulation_steps = 1, global_batch_size = 0;
  int64_t max_steps = 0;
  double num_train_epochs = 1.0;
  optim::OptimizerConfig optimizer;
  float learning_rate = 1e-3f, max_grad_norm = 1.f, warmup_ratio = 0.f;
  float vision_lr = 0.f;     // train.mm_vision_tower_lr: 0 means learning_rate
  float projector_lr = 0.f;  // train.mm_projector_lr: 0 means learning_rate
  int64_t warmup_steps = -1;
  optim::ScheduleKind scheduler = optim::ScheduleKind::Cosine;
  int64_t eval_steps = 0, eval_samples = 0, eval_batch_size = 16, max_new_tokens = 12;
  int64_t save_steps = 0, save_total_limit = 2;
  std::size_t max_shard_bytes = std::size_t(5) * 1000 * 1000 * 1000;  // train.max_shard_size: model.safetensors shards
  // memory
  Precision precision = Precision::FP32;
  bool vision_fp32 = false;  // memory.vision_precision: fp32 keeps the vision tower in f32
  models::CheckpointPolicy vision_ckpt, llm_ckpt;
  float loss_scale_initial = 65536.f, loss_scale_min = 1.f;
  int64_t loss_scale_window = 1000;
  int loss_scale_hysteresis = 2;
  // memory.loss_scale.max_skips_at_min: fp16 steps in a row skipped on overflow at the minimum scale that stop the
  // run as diverged (DeepSpeed raises at its minimum scale); 0 never stops.
  int64_t loss_scale_max_skips_at_min = 2;
  int64_t ce_chunk_rows = 0;
  GradAccum grad_accum = GradAccum::Auto;  // resolved at load: never Auto afterwards
  int64_t leak_window = 50;
  parallel::ZeroOptions zero;  // memory.zero_stage, memory.offload_optimizer/params, parallel.bucket_size
  bool zero_auto = false;      // memory.zero_stage: auto
  // The other strategy keys set to auto (the planner decides), the memory budget, and OOM handling.
  bool micro_auto = false, vision_ckpt_auto = false, llm_ckpt_auto = false, offload_auto = false;
  bool prefetch_auto = false;  // parallel.prefetch_groups: auto (0, 1 or 2 at ZeRO-3)
  // train.optimizer: auto: f32 AdamW, or 8-bit AdamW's states where the search finds that faster or alone fitting
  bool optimizer_auto = false;
  // memory.offload_activations[.vision|.llm]: auto (the planner decides, for both groups set so, together)
  bool vision_act_offload_auto = false, llm_act_offload_auto = false;
  // parallel.backend: mpi: ranks on GPUs move device tensors through MPI (staged in host memory) instead of NCCL,
  // and may share a GPU (rank r on cuda:<local rank mod GPUs>); nccl (the default): one GPU per rank.
  bool gpu_collectives_over_mpi = false;
  // parallel.timeout: seconds a collective may take before the job ends naming the rank and the collective
  // (PyTorch's and DeepSpeed's default, 30 minutes).
  double collective_timeout_s = 1800;
  float budget = 0.95f;        // memory.budget: plans must fit budget x (capacity - runtime reserve)
  bool shrink_on_oom = false;  // memory.on_oom: shrink_micro_batch
  bool preflight = true;       // memory.preflight: false starts a run whose plan does not fit (it will OOM)
  core::AllocatorKind allocator = core::AllocatorKind::Caching;  // memory.allocator
  // lora.*: adapters on the language model's linear layers (lora.enable); r, alpha, dropout, target_modules
  bool lora_enable = false;
  models::LoraSpec lora;
  bool allocator_auto = false;        // memory.allocator: auto (the kind with the smallest predicted peak reserved)
  int64_t max_images_per_sample = 1;  // data.max_images_per_sample: the planner's worst case
  std::vector<int64_t> trace_steps;   // memory.trace_steps: steps written as Chrome trace-event timelines
  bool trace_event_clock = false;     // memory.trace_clock: events (the allocator's events as the time axis)
  bool snapshot_on_oom = false;       // memory.snapshot_on_oom: a memory_viz snapshot when a step runs out
  // log
  int64_t logging_steps = 10;
  ProgressBar progress_bar = ProgressBar::Auto;
  bool tensorboard = false;     // log.report_to: tensorboard
  std::string tensorboard_dir;  // log.tensorboard_dir; empty: output_dir/runs

  // Written to output_dir/config.yaml and printed by --print-config: every key with its resolved value.
  std::string resolved_yaml;
};

// Loads `path` (may be empty: defaults only), applies "a.b=v" overrides, validates, resolves derived values
// (global batch = micro x accumulation x world size).
RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides, int world_size = 1);
// The same on YAML text already in memory; `where` names it in errors (as the path does).
RunConfig load_config_text(const std::string& yaml, const std::string& where, const std::vector<std::string>& overrides,
                           int world_size = 1);

// Every key of the schema (run.*, device.*, data.*, train.*, memory.*, parallel.*, log.*, lora.*), in schema order;
// the model section's keys are the model spec's (models/model_spec.h).
std::vector<std::string> config_keys();

const char* precision_name(Precision p);
const char* stage_name(Stage s);

}  // namespace hr::train
