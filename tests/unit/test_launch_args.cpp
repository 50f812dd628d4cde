// DeepSpeed JSON and LLaVA's command line onto headroom's keys: LLaVA's zero2.json, zero3.json and
// zero3_offload.json (written here from their published content), explicit values, DeepSpeed's batch-triplet rule,
// the refusals; a finetune.sh command line against a LLaVA directory, and the flags headroom cannot honour.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/io/safetensors.h"
#include "core/ops/copy.h"
#include "models/hf_config.h"
#include "models/llava.h"
#include "models/weights.h"
#include "parallel/zero.h"
#include "train/config.h"
#include "train/llava_args.h"

using namespace hr;
using namespace hr::train;

namespace {

// Each test its own folder: ctest -j runs the tests of this file side by side, and several write ds.json.
std::string dir() {
  const std::string d =
      testing::TempDir() + "/launch_args/" + testing::UnitTest::GetInstance()->current_test_info()->name();
  std::filesystem::create_directories(d);
  return d;
}

std::string file(const std::string& name, const std::string& text) {
  const std::string path = dir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

const char* kFp16 =
    R"("fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
                                 "hysteresis": 2, "min_loss_scale": 1},
                        "bf16": {"enabled": "auto"},)";

RunConfig with_deepspeed(const std::string& json, std::vector<std::string> sets = {}, int world = 1,
                         const std::string& yaml = "model: {preset: tiny}\ntrain: {micro_batch_size: 2}\n") {
  sets.insert(sets.begin(), "deepspeed=" + file("ds.json", json));
  return load_config_text(yaml, "test.yaml", sets, world);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

}  // namespace

TEST(DeepSpeed, LlavasZeroConfigsReadOntoHeadroomsKeys) {
  const RunConfig z2 = with_deepspeed(str("{", kFp16, R"(
    "train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto", "gradient_accumulation_steps": "auto",
    "zero_optimization": {"stage": 2, "overlap_comm": true, "contiguous_gradients": true, "sub_group_size": 1e9,
                          "reduce_bucket_size": "auto"}})"),
                                      {}, 2);
  EXPECT_EQ(z2.zero.stage, 2);
  EXPECT_EQ(z2.precision, Precision::FP32);  // "auto": the config's own precision
  EXPECT_EQ(z2.micro_batch_size, 2);         // "auto": the config's own batch
  EXPECT_EQ(z2.global_batch_size, 4);
  EXPECT_EQ(z2.loss_scale_initial, 65536.f);
  EXPECT_FALSE(has(z2.deepspeed_not_acted_on, "zero_optimization.overlap_comm"));
  EXPECT_TRUE(z2.zero.overlap_comm);
  EXPECT_TRUE(has(z2.deepspeed_not_acted_on, "zero_optimization.sub_group_size"));
  EXPECT_NE(z2.resolved_yaml.find("zero_stage: 2"), std::string::npos) << z2.resolved_yaml;

  const RunConfig z3 = with_deepspeed(str("{", kFp16, R"(
    "train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto", "gradient_accumulation_steps": "auto",
    "zero_optimization": {"stage": 3, "overlap_comm": true, "contiguous_gradients": true, "sub_group_size": 1e9,
                          "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                          "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
                          "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": true}})"),
                                      {"memory.precision=bf16"}, 2);
  EXPECT_EQ(z3.zero.stage, 3);
  EXPECT_EQ(z3.precision, Precision::BF16);
  EXPECT_EQ(z3.zero.offload_optimizer, parallel::Offload::None);
  EXPECT_TRUE(has(z3.deepspeed_not_acted_on, "zero_optimization.stage3_max_live_parameters"));

  const RunConfig off = with_deepspeed(str("{", kFp16, R"(
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": true},
                          "offload_param": {"device": "cpu", "pin_memory": true}, "overlap_comm": true,
                          "contiguous_gradients": true, "sub_group_size": 1e9, "reduce_bucket_size": "auto",
                          "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
                          "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
                          "gather_16bit_weights_on_model_save": true},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto", "steps_per_print": 1e5, "wall_clock_breakdown": false})"),
                                       {"train.learning_rate=2e-5"}, 2);
  EXPECT_EQ(off.zero.stage, 3);
  EXPECT_EQ(off.zero.offload_optimizer, parallel::Offload::Cpu);
  EXPECT_EQ(off.zero.offload_params, parallel::Offload::Cpu);
  EXPECT_EQ(off.scheduler, optim::ScheduleKind::Constant);  // WarmupLR: warmup, then constant
  EXPECT_FLOAT_EQ(off.learning_rate, 2e-5f);                // "auto": the config's
  EXPECT_TRUE(has(off.deepspeed_not_acted_on, "zero_optimization.offload_param.pin_memory"));
  EXPECT_TRUE(has(off.deepspeed_not_acted_on, "steps_per_print"));
}

TEST(DeepSpeed, ExplicitValuesOverrideTheConfigAndSetWinsOverThem) {
  const RunConfig c = with_deepspeed(R"({"bf16": {"enabled": true}, "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 3, "train_batch_size": 24, "gradient_clipping": 0.5,
    "fp16": {"initial_scale_power": 12, "loss_scale_window": 500, "hysteresis": 4, "min_loss_scale": 2},
    "zero_optimization": {"stage": 1, "reduce_bucket_size": 500000000},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-6, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 7, "total_num_steps": 100}}})",
                                     {"train.max_grad_norm=2.0"}, 2);
  EXPECT_EQ(c.precision, Precision::BF16);
  EXPECT_EQ(c.micro_batch_size, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 3);
  EXPECT_EQ(c.global_batch_size, 24);
  EXPECT_FLOAT_EQ(c.max_grad_norm, 2.f);  // --set comes after the DeepSpeed file
  EXPECT_EQ(c.loss_scale_initial, 4096.f);
  EXPECT_EQ(c.loss_scale_window, 500);
  EXPECT_EQ(c.loss_scale_hysteresis, 4);
  EXPECT_EQ(c.loss_scale_min, 2.f);
  EXPECT_EQ(c.zero.stage, 1);
  EXPECT_EQ(c.zero.bucket_bytes, int64_t(2000000000));  // elements x 4 B
  EXPECT_FLOAT_EQ(c.learning_rate, 3e-4f);
  EXPECT_FLOAT_EQ(c.optimizer.beta2, 0.95f);
  EXPECT_FLOAT_EQ(c.optimizer.weight_decay, 0.1f);
  EXPECT_EQ(c.scheduler, optim::ScheduleKind::Linear);
  EXPECT_EQ(c.warmup_steps, 7);
  EXPECT_EQ(c.max_steps, 100);
  // The same file named by the top-level `deepspeed:` key of the YAML.
  const RunConfig y =
      load_config_text(str("deepspeed: ", dir(), "/ds.json\nmodel: {preset: tiny}\n"), "test.yaml", {}, 2);
  EXPECT_EQ(y.zero.stage, 1);
  EXPECT_EQ(y.deepspeed, dir() + "/ds.json");
}

TEST(DeepSpeed, RefusesWhatItCannotHonourNamingTheKey) {
  EXPECT_EQ(error_of([] {
              with_deepspeed(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4,
                                               "gradient_accumulation_steps": 2})",
                             {}, 1);
            }).substr(0, 12),
            "[deepspeed] ");
  EXPECT_NE(error_of([] {
              with_deepspeed(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4,
                                               "gradient_accumulation_steps": 2})",
                             {}, 1);
            })
                .find("Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * "
                      "gradient_acc_step * world_size 16 != 4 * 2 * 1"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              with_deepspeed(R"({"zero_optimization": {"offload_optimizer": {"device": "nvme"}}})");
            }).find("zero_optimization.offload_optimizer.device: NVMe offload is not supported"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              with_deepspeed(R"({"fp16": {"enabled": true, "loss_scale": 128}})");
            }).find("fp16.loss_scale: a static"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              with_deepspeed(R"({"zero_optimisation": {"stage": 2}})");
            }).find("zero_optimisation: unknown DeepSpeed key; did you mean 'zero_optimization'?"),
            std::string::npos);
  EXPECT_NE(
      error_of([] { with_deepspeed(R"({"optimizer": {"type": "Lamb"}})"); }).find("optimizer.type: optimizer 'Lamb'"),
      std::string::npos);
  EXPECT_NE(
      error_of([] { with_deepspeed(R"({"bf16": {"enabled": true}, "fp16": {"enabled": true}})"); }).find("both true"),
      std::string::npos);
  EXPECT_NE(error_of([] { with_deepspeed("{not json"); }).find("not valid JSON"), std::string::npos);
}

TEST(LlavaArgs, FinetuneShCommandLinePortsAsItIs) {
  // A LLaVA directory in place of finetune.sh's checkpoint.
  const std::string model = dir() + "/llava";
  std::filesystem::create_directories(model);
  models::write_hf_config(model, models::preset("tiny"), core::DType::F32);
  const std::string data = file("data.json", "[]"), zero3 = file("zero3.json", str("{", kFp16, R"(
    "train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto", "gradient_accumulation_steps": "auto",
    "zero_optimization": {"stage": 3}})"));
  const std::vector<std::string> args = {"--deepspeed",
                                         zero3,
                                         "--model_name_or_path",
                                         model,
                                         "--version",
                                         "v1",
                                         "--data_path",
                                         data,
                                         "--image_folder",
                                         dir(),
                                         "--mm_projector_type",
                                         "mlp2x_gelu",
                                         "--mm_vision_select_layer",
                                         "-2",
                                         "--mm_use_im_start_end",
                                         "False",
                                         "--mm_use_im_patch_token",
                                         "False",
                                         "--image_aspect_ratio",
                                         "pad",
                                         "--group_by_modality_length",
                                         "True",
                                         "--bf16",
                                         "True",
                                         "--output_dir",
                                         dir() + "/out",
                                         "--num_train_epochs",
                                         "1",
                                         "--per_device_train_batch_size",
                                         "16",
                                         "--per_device_eval_batch_size",
                                         "4",
                                         "--gradient_accumulation_steps",
                                         "1",
                                         "--evaluation_strategy",
                                         "no",
                                         "--save_strategy",
                                         "steps",
                                         "--save_steps",
                                         "50000",
                                         "--save_total_limit",
                                         "1",
                                         "--learning_rate",
                                         "2e-5",
                                         "--weight_decay",
                                         "0.",
                                         "--warmup_ratio",
                                         "0.03",
                                         "--lr_scheduler_type",
                                         "cosine",
                                         "--logging_steps",
                                         "1",
                                         "--tf32",
                                         "True",
                                         "--model_max_length",
                                         "2048",
                                         "--gradient_checkpointing",
                                         "True",
                                         "--dataloader_num_workers",
                                         "4",
                                         "--lazy_preprocess",
                                         "True",
                                         "--report_to",
                                         "none",
                                         "--resume"};
  const LlavaArgs a = translate_llava_args(args);
  EXPECT_EQ(a.rest, std::vector<std::string>{"--resume"});  // not a LLaVA flag: left for headroom's parser
  EXPECT_TRUE(has(a.not_acted_on, "--tf32 True"));
  const RunConfig c = load_config_text("", "(flags)", a.sets, 8);
  EXPECT_EQ(c.model.name_or_path, model);
  EXPECT_EQ(c.init_weights, model);
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.precision, Precision::BF16);
  EXPECT_EQ(c.chat_template, data::Template::VicunaV1);
  EXPECT_EQ(c.train_json, data);
  EXPECT_TRUE(c.group_by_modality_length);
  EXPECT_EQ(c.micro_batch_size, 16);
  EXPECT_EQ(c.global_batch_size, 128);  // 16 x 1 x 8 ranks
  EXPECT_EQ(c.eval_batch_size, 4);
  EXPECT_EQ(c.max_seq_len, 2048);
  EXPECT_EQ(c.llm_ckpt.kind, models::CheckpointKind::Full);
  EXPECT_EQ(c.vision_ckpt.kind, models::CheckpointKind::Full);
  EXPECT_EQ(c.save_steps, 50000);
  EXPECT_EQ(c.eval_steps, 0);
  EXPECT_FLOAT_EQ(c.learning_rate, 2e-5f);
  EXPECT_FLOAT_EQ(c.warmup_ratio, 0.03f);
  EXPECT_EQ(c.num_workers, 4);
  EXPECT_EQ(c.model.config.vision.select_layer, -2);
}

TEST(LlavaArgs, FinetuneLoraShFlagsBecomeLoraKeys) {
  // scripts/v1_5/finetune_lora.sh: --lora_enable True --lora_r 128 --lora_alpha 256 --mm_projector_lr 2e-5
  const LlavaArgs a =
      translate_llava_args({"--lora_enable", "True", "--lora_r", "128", "--lora_alpha", "256", "--lora_dropout", "0.1",
                            "--lora_bias", "none", "--mm_projector_lr", "2e-5"});
  const RunConfig c = load_config_text("", "(flags)", a.sets, 1);
  EXPECT_TRUE(c.lora_enable);
  EXPECT_EQ(c.lora.r, 128);
  EXPECT_FLOAT_EQ(c.lora.alpha, 256.f);
  EXPECT_FLOAT_EQ(c.lora.scale(), 2.f);
  EXPECT_FLOAT_EQ(c.lora.dropout, 0.1f);
  EXPECT_EQ(c.lora.targets,
            (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}));
  const RunConfig off = load_config_text("", "(flags)", {}, 1);
  EXPECT_FALSE(off.lora_enable);
  EXPECT_NE(error_of([] {
              load_config_text("", "(flags)", {"lora.target_modules=[q_proj, lm_head]"}, 1);
            }).find("lora.target_modules"),
            std::string::npos);
  EXPECT_NE(error_of([] { load_config_text("", "(flags)", {"lora.dropout=1"}, 1); }).find("[0, 1)"), std::string::npos);
}

TEST(LlavaArgs, FinetuneQloraShFlagsQuantizeTheBase) {
  // A QLoRA run as LLaVA launches one: --bits 4 --double_quant True --quant_type nf4 with LoRA on.
  const LlavaArgs a = translate_llava_args(
      {"--lora_enable", "True", "--lora_r", "64", "--bits", "4", "--double_quant", "False", "--quant_type", "fp4"});
  const RunConfig c = load_config_text("", "(flags)", a.sets, 1);
  EXPECT_EQ(c.lora.base_bits, 4);
  EXPECT_EQ(c.lora.quant_type, core::QuantType::FP4);
  EXPECT_FALSE(c.lora.double_quant);
  EXPECT_EQ(c.lora.base_format().type, core::QuantType::FP4);
  // Defaults: 16 bits (no quantization); 4 bits is NF4 with double quantization, 8 bits int8.
  const RunConfig d = load_config_text("", "(flags)", {"lora.enable=true", "lora.base_bits=4"}, 1);
  EXPECT_EQ(d.lora.base_format().type, core::QuantType::NF4);
  EXPECT_TRUE(d.lora.base_format().double_quant);
  EXPECT_EQ(load_config_text("", "(flags)", {"lora.enable=true", "lora.base_bits=8"}, 1).lora.base_format().type,
            core::QuantType::Int8);
  EXPECT_FALSE(load_config_text("", "(flags)", {}, 1).lora.quantizes_base());
  // Quantizing needs LoRA (a quantized base cannot train), and only 16, 8 and 4 bits exist.
  EXPECT_NE(error_of([] { load_config_text("", "(flags)", {"lora.base_bits=4"}, 1); }).find("set lora.enable: true"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              load_config_text("", "(flags)", {"lora.enable=true", "lora.base_bits=3"}, 1);
            }).find("lora.base_bits"),
            std::string::npos);
  EXPECT_NE(error_of([] { load_config_text("", "(flags)", {"lora.quant_type=int4"}, 1); }).find("nf4 or fp4"),
            std::string::npos);
}

// Hugging Face's 8-bit optimizers (--optim adamw_bnb_8bit, and paged_adamw_8bit as QLoRA recipes pass it) become
// train.optimizer: adamw_8bit, which ZeRO's shards and the offloaded optimizer take like any optimizer but Adafactor.
TEST(LlavaArgs, EightBitOptimizersBecomeAdamW8bit) {
  for (const char* optim : {"adamw_bnb_8bit", "paged_adamw_8bit", "adamw_8bit"}) {
    const LlavaArgs a = translate_llava_args({"--optim", optim});
    EXPECT_EQ(a.sets, std::vector<std::string>{"train.optimizer=adamw_8bit"}) << optim;
    EXPECT_EQ(load_config_text("", "(flags)", a.sets, 1).optimizer.kind, optim::OptimizerKind::AdamW8bit) << optim;
  }
  for (const char* sharded : {"memory.zero_stage=2", "memory.offload_optimizer=cpu"}) {
    const RunConfig c = load_config_text("", "(flags)", {"train.optimizer=adamw_8bit", sharded}, 2);
    EXPECT_NO_THROW(parallel::validate(c.zero, c.optimizer)) << sharded;  // as plan and train check
  }
}

TEST(LlavaArgs, FlagsHeadroomCannotHonourSayWhy) {
  auto err = [](std::vector<std::string> args) { return error_of([&] { translate_llava_args(args); }); };
  EXPECT_NE(err({"--mm_use_im_start_end", "True"}).find("only False is supported"), std::string::npos);
  EXPECT_NE(
      err({"--version", "mpt"}).find("plain, v1 (vicuna_v1), llava_llama_2, qwen_1_5 (qwen_2) and mistral_instruct"),
      std::string::npos);
  EXPECT_NE(err({"--report_to", "wandb"}).find("none and tensorboard"), std::string::npos);
  EXPECT_NE(err({"--optim", "lion_32bit"}).find("[args] --optim lion_32bit: adamw_torch, adamw_bnb_8bit"),
            std::string::npos);
  EXPECT_NE(err({"--save_strategy", "epoch"}).find("--save_strategy epoch: steps and no"), std::string::npos);
  EXPECT_NE(err({"--eval_strategy", "epoch"}).find("--evaluation_strategy epoch: steps and no"), std::string::npos);
  EXPECT_NE(err({"--bf16", "maybe"}).find("expects True or False"), std::string::npos);
  EXPECT_NE(err({"--output_dir"}).find("needs a value"), std::string::npos);
  // finetune.sh's own --model_name_or_path is a Vicuna (LlamaForCausalLM) directory: named, not guessed.
  const std::string vicuna = dir() + "/vicuna";
  std::filesystem::create_directories(vicuna);
  std::ofstream(vicuna + "/config.json") << R"({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})";
  const LlavaArgs a = translate_llava_args({"--model_name_or_path=" + vicuna});
  EXPECT_NE(error_of([&] { load_config_text("", "(flags)", a.sets, 1); }).find("model_type 'llama' is not 'llava'"),
            std::string::npos);
}

// pretrain.sh: with --vision_tower, --model_name_or_path is the language model (in either order).
TEST(LlavaArgs, VisionTowerMakesModelNameOrPathTheLanguageModel) {
  for (bool tower_first : {false, true}) {
    std::vector<std::string> args = {"--model_name_or_path", "/m/vicuna", "--version", "plain"};
    const std::vector<std::string> tower = {"--vision_tower", "/m/clip"};
    args.insert(tower_first ? args.begin() : args.end(), tower.begin(), tower.end());
    const LlavaArgs a = translate_llava_args(args);
    EXPECT_NE(std::find(a.sets.begin(), a.sets.end(), "model.language_model=/m/vicuna"), a.sets.end());
    EXPECT_NE(std::find(a.sets.begin(), a.sets.end(), "model.vision_tower=/m/clip"), a.sets.end());
    EXPECT_EQ(std::find(a.sets.begin(), a.sets.end(), "model.name_or_path=/m/vicuna"), a.sets.end());
  }
  EXPECT_EQ(translate_llava_args({"--version", "llava_llama_2"}).sets,
            std::vector<std::string>{"data.template=llava_llama_2"});
  // LLaVA-NeXT's templates.
  EXPECT_EQ(translate_llava_args({"--version", "qwen_1_5"}).sets, std::vector<std::string>{"data.template=qwen_1_5"});
  EXPECT_EQ(translate_llava_args({"--version", "llava_mistral_instruct"}).sets,
            std::vector<std::string>{"data.template=mistral_instruct"});
}

// LLaVA's stage-1 projector (mm_projector.bin's names, as safetensors) loaded over a model's weights.
TEST(LlavaArgs, PretrainMmMlpAdapterLoadsTheProjectorByLlavasNames) {
  using namespace hr::models;
  Llava source(preset("tiny"), core::Device::cpu(), core::DType::F32),
      target(preset("tiny"), core::Device::cpu(), core::DType::F32);
  init_weights(source.params(), 1);
  init_weights(target.params(), 2);
  core::NamedTensors saved;
  for (const auto& p : source.params().all()) {
    const std::string n = p->name;
    if (n.rfind("multi_modal_projector.linear_1.", 0) == 0)
      saved.emplace_back("model.mm_projector.0." + n.substr(31), p->data);
    if (n.rfind("multi_modal_projector.linear_2.", 0) == 0)
      saved.emplace_back("model.mm_projector.2." + n.substr(31), p->data);
  }
  ASSERT_EQ(saved.size(), 4u);
  const std::string path = dir() + "/mm_projector.safetensors";
  core::save_safetensors(path, saved);
  EXPECT_EQ(load_projector(target.params(), path), 4);
  for (const auto& p : target.params().all()) {
    if (p->name.rfind("multi_modal_projector.", 0) != 0) continue;
    for (const auto& q : source.params().all())
      if (q->name == p->name) {
        EXPECT_EQ(p->data.to_floats(), q->data.to_floats()) << p->name;
      }
  }
  // The flag and the key; a pickle and a file of something else are named errors.
  const LlavaArgs a = translate_llava_args({"--pretrain_mm_mlp_adapter", path});
  const RunConfig c = load_config_text("model: {preset: tiny}\n", "t.yaml", a.sets, 1);
  EXPECT_EQ(c.projector_weights, path);
  EXPECT_NE(error_of([&] { load_projector(target.params(), dir() + "/mm_projector.bin"); }).find("convert it once"),
            std::string::npos);
  core::save_safetensors(dir() + "/other.safetensors", {{"model.embed_tokens.weight", saved[0].second}});
  const std::string e = error_of([&] { load_projector(target.params(), dir() + "/other.safetensors"); });
  EXPECT_NE(e.find("unexpected: model.embed_tokens.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("missing: multi_modal_projector."), std::string::npos) << e;
  EXPECT_NE(e.find("multi_modal_projector.linear_2.bias"), std::string::npos) << e;
}

// LLaVA-NeXT's train.py flags: --image_aspect_ratio anyres with its pinpoints (a Python list of (height, width), or
// OneVision's tile range in tiles of the tower's size) and merge type.
TEST(LlavaArgs, LlavaNextAnyresFlagsSetThePinpointsAndTheMerge) {
  const LlavaArgs a = translate_llava_args(
      {"--model_name_or_path", "x", "--image_aspect_ratio", "anyres", "--image_grid_pinpoints",
       "[(336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008)]", "--mm_patch_merge_type", "flat"});
  EXPECT_EQ(a.sets, (std::vector<std::string>{
                        "model.name_or_path=x",
                        "model.image_grid_pinpoints=[[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]",
                        "model.mm_patch_merge_type=flat"}));
  EXPECT_TRUE(has(a.not_acted_on, "--image_aspect_ratio anyres"));
  const std::vector<std::string> next = {a.sets[1], a.sets[2], "model.preset=llava-1.5-7b"};
  const RunConfig c = load_config_text("", "(flags)", next, 1);
  const std::vector<data::Resolution> expected = {{336, 672}, {672, 336}, {672, 672}, {1008, 336}, {336, 1008}};
  EXPECT_EQ(c.model.config.anyres.pinpoints, expected);
  EXPECT_EQ(c.model.config.anyres.merge, models::PatchMerge::Flat);

  const LlavaArgs range = translate_llava_args({"--image_grid_pinpoints", "(1x1),...,(2x3)"});
  ASSERT_EQ(range.sets, std::vector<std::string>{"model.image_grid_pinpoints='(1x1),...,(2x3)'"});
  const RunConfig tiles = load_config_text("", "(flags)", {range.sets[0], "model.preset=llava-1.5-7b"}, 1);
  const std::vector<data::Resolution> grid = {{336, 336}, {336, 672}, {336, 1008}, {672, 336}, {672, 672}, {672, 1008}};
  EXPECT_EQ(tiles.model.config.anyres.pinpoints, grid);

  auto err = [](std::vector<std::string> args) { return error_of([&] { translate_llava_args(args); }); };
  EXPECT_EQ(translate_llava_args({"--image_aspect_ratio", "anyres_max_9"}).sets,
            std::vector<std::string>{"model.vision_aspect_ratio=anyres_max_9"});
  EXPECT_EQ(translate_llava_args({"--image_aspect_ratio", "square"}).sets,
            std::vector<std::string>{"data.image_aspect_ratio=square"});
  EXPECT_NE(err({"--image_aspect_ratio", "crop"}).find("pad (LLaVA-1.5's), square (LLaVA's default"),
            std::string::npos);
  EXPECT_NE(err({"--image_grid_pinpoints", "[(336, 672), (672)]"}).find("expected (height, width) pairs"),
            std::string::npos);
  EXPECT_NE(err({"--image_grid_pinpoints", "[[336; 672]]"}).find("--image_grid_pinpoints [[336; 672]]: expected"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              load_config_text("", "(flags)", {"model.image_grid_pinpoints='(3x3),...,(1x1)'", "model.preset=tiny"}, 1);
            }).find("model.image_grid_pinpoints '(3x3),...,(1x1)' is neither"),
            std::string::npos);
}
