// LLaVA's stage-1 start from two Hugging Face directories: a CLIP vision tower (CLIPVisionModel, or a whole
// CLIPModel such as openai/clip-vit-large-patch14-336, of which the vision half is used) and a LlamaForCausalLM
// (lmsys/vicuna-7b-v1.5), joined by a freshly initialised projector. The joined model is shaped as llava-hf's
// conversion shapes it: "<image>" gets the id after the language model's vocabulary and the vocabulary grows
// to the next multiple of 64 that also holds a "<pad>" (32000 -> 32064), so what headroom writes is a llava-hf
// directory.
#pragma once

#include <string>

#include "core/parameters.h"
#include "models/config.h"

namespace hr::models {

// The LlavaConfig of the two directories' config.json (vision_feature_layer -2, feature strategy "default",
// mlp2x_gelu; the YAML's model keys may override them after). Errors name the file and key.
LlavaConfig stage1_config(const std::string& vision_dir, const std::string& language_dir);

// The language model's own vocabulary size (before the "<image>"/"<pad>" rows).
int64_t language_vocab(const std::string& language_dir);

// Loads the tower (vision_model.* -> vision_tower.vision_model.*) and the language model (model.* ->
// language_model.model.*, lm_head.* -> language_model.lm_head.*) over `store`, whose projector stays as
// initialised. The rows added to embed_tokens and lm_head are the mean of the existing rows (transformers'
// mean_resizing). Tensors of the directories the model has no use for (the text half of a CLIPModel, CLIP's
// post_layernorm) are skipped; a parameter neither directory holds, or a shape that differs, is an error
// naming it. Returns the number of tensors loaded.
int64_t load_stage1_weights(core::ParamStore& store, const std::string& vision_dir, const std::string& language_dir);

}  // namespace hr::models
