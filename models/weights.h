// Model weights: random initialisation, loading from llava-hf safetensors checkpoints (either name layout),
// and saving in the llava-hf layout.
#pragma once

#include <string>

#include "core/io/safetensors.h"
#include "core/parameters.h"
#include "models/config.h"

namespace hr::models {

using core::ParamStore;

// Normal(0, 0.02) for matrices and embeddings, ones for norm weights, zeros for biases, and LoRA adapters as
// init_lora. Deterministic.
void init_weights(ParamStore& store, uint64_t seed);
// A LoRA adapter as PEFT starts it: A Kaiming-uniform with a = sqrt(5), i.e. U(-1/sqrt(in), 1/sqrt(in)); B zeros
// (the adapted layer starts as the base layer). Deterministic in (seed, name).
void init_lora(core::Param& p, uint64_t seed);

enum class MissingWeights : uint8_t { Error, Keep };  // Keep: leave missing parameters as initialised

// Loads every parameter by name from a checkpoint in the classic llava-hf layout
// (language_model.model.*, language_model.lm_head.*, vision_tower.*, multi_modal_projector.*) or the newer
// one (model.language_model.*, lm_head.*, model.vision_tower.*, model.multi_modal_projector.*), converting
// f32/bf16/f16 to the store's dtype. Missing, unexpected and mis-shaped tensors are all reported by name in
// one error; LoRA adapters a checkpoint does not have are started by init_lora (a base model gets new adapters).
// Returns the number of tensors loaded.
int64_t load_weights(ParamStore& store, const core::Checkpoint& ckpt, MissingWeights missing = MissingWeights::Error);

// Loads the projector alone from a safetensors file, as LLaVA's pretraining saves it (mm_projector.bin's
// `model.mm_projector.0.*` / `.2.*`, or `mm_projector.weight` for a linear one) or under llava-hf names
// (`multi_modal_projector.linear_1.*`). A PyTorch pickle (.bin) is an error that says how to convert it; a
// missing, unexpected or mis-shaped tensor is an error naming it. Returns the number of tensors loaded.
int64_t load_projector(ParamStore& store, const std::string& path);

// The parameters under their llava-hf names, for save_safetensors / save_sharded (LoRA adapters left out: they
// go to adapter_model.safetensors, named_adapters).
core::NamedTensors named_weights(const ParamStore& store);

// LoRA adapters as PEFT saves them (adapter_model.safetensors): base_model.model.<layer>.lora_A.weight / lora_B.
bool is_lora(const core::Param& p);
core::NamedTensors named_adapters(const ParamStore& store);
// Loads every adapter of the model from PEFT's file; a missing, unexpected or mis-shaped one is an error naming
// it. Returns the number loaded.
int64_t load_adapters(ParamStore& store, const core::Checkpoint& adapters);
// PEFT's adapter_config.json for the model's adapters: LoRA on the language model's layers it names.
std::string adapter_config_json(const LoraSpec& lora, const std::string& base_model);
// The gradients of trainable parameters under their parameter names (zeros where none was produced).
core::NamedTensors named_grads(ParamStore& store);

// Copies a checkpoint's tensor `t` into parameter `p`:
//   a float tensor of the weight's shape into a float parameter (cast), or quantized into a quantized one;
//   a quantized blob (u8, core/quant.h) into a quantized parameter of the same format, or dequantized into a float
//   parameter of its shape.
// Returns "" when done, or what does not match ("(4, 8) f32 (model wants (8, 8))") without touching `p`.
std::string assign_param(core::Param& p, const core::Tensor& t);
// What a parameter wants: "(8, 8)", or "(8, 8) as nf4 (block 64, double quant)".
std::string wanted(const core::Param& p);

// The name a parameter has in the newer transformers layout.
std::string new_layout_name(const std::string& classic);

}  // namespace hr::models
