// Hugging Face model directories: a LlavaConfig as transformers' LlavaConfig JSON (config.json with its
// text_config and vision_config, generation_config.json) and back, so that headroom opens what
// `save_pretrained` writes and transformers opens what headroom writes.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/dtype.h"
#include "models/config.h"

namespace hr::models {

// The special token ids config.json and generation_config.json name (the byte tokenizer's by default; a real
// tokenizer's bos/eos, and its <unk> as pad, which is what LLaVA pads with).
// A tokenizer without one of them (Qwen2's has no BOS) gives -1, written as null, as transformers writes a
// token a tokenizer lacks.
struct TokenIds {
  int64_t bos = 1, eos = 2, pad = 0;
};

// config.json of a LlavaForConditionalGeneration with these dimensions; `dtype` becomes torch_dtype.
// Throws for what transformers' LLaVA cannot express (the linear projector), naming it.
nlohmann::json to_hf_config(const LlavaConfig& config, core::DType dtype, const TokenIds& tokens = {});
// Whether to_hf_config can express `config` (and why not, when it cannot).
bool hf_expressible(const LlavaConfig& config, std::string* why = nullptr);
// The LlavaConfig of a transformers LlavaConfig JSON; `where` (the file) names errors. What headroom does
// not implement (a text model type other than llama, qwen2 and mistral, rope_scaling, LLaMA's attention or MLP
// biases, Qwen2's sliding window, tied embeddings, another
// activation, a feature-select strategy other than default/full) is an error naming the key.
LlavaConfig from_hf_config(const nlohmann::json& config, const std::string& where);
// The decoder of a LlamaForCausalLM, Qwen2ForCausalLM or MistralForCausalLM config (a LLaVA's text_config, or a
// language model's own config.json); `where` and `path` ("text_config.") name errors, transformers' defaults
// fill what is absent.
LlmConfig llm_from_hf(const nlohmann::json& text, const std::string& where, const std::string& path);
// The tower of a CLIPVisionConfig or SiglipVisionConfig (a LLaVA's vision_config, or a tower's own config.json).
VisionConfig vision_from_hf(const nlohmann::json& vision, const std::string& where, const std::string& path);
// The ids `text` (a text_config, or generation_config.json) names: null is -1, an absent key keeps TokenIds'
// default. A value other than a whole number or null is an error naming `where` and the key.
TokenIds token_ids_from_hf(const nlohmann::json& text, const std::string& where, const std::string& path);
// DIR/config.json read and converted.
LlavaConfig read_hf_config(const std::string& dir);
// Writes DIR/config.json and DIR/generation_config.json.
void write_hf_config(const std::string& dir, const LlavaConfig& config, core::DType dtype, const TokenIds& tokens = {});

}  // namespace hr::models
