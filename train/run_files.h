// The files a run reads and writes beside its data and weights: its tokenizer, its image normalisation, and the
// Hugging Face files its checkpoints carry.
#pragma once

#include <memory>

#include "data/image.h"
#include "data/tokenizer.h"
#include "train/checkpoint.h"
#include "train/config.h"

namespace hr::train {

// The run's tokenizer (data.tokenizer, see config.h).
std::shared_ptr<const data::Tokenizer> load_run_tokenizer(const RunConfig& config);
// The tokenizer files a Hugging Face directory may hold, which checkpoints carry.
inline constexpr const char* kHfTokenizerFiles[] = {"tokenizer.model", "tokenizer.json", "tokenizer_config.json",
                                                    "special_tokens_map.json", "added_tokens.json"};
// What checkpoints carry for Hugging Face (checkpoint.h): the run's tokenizer files (data.tokenizer's directory,
// or model.name_or_path's) and preprocessor_config.json, its token ids, train.max_shard_size.
HfSidecar run_hf_sidecar(const RunConfig& config);
// The image normalisation: model.name_or_path's (or model.vision_tower's) preprocessor_config.json, else the
// tower's processor's (CLIP's, SigLIP's).
data::ImageNorm run_image_norm(const RunConfig& config);
// The tower's image processor: SigLIP's or CLIP's steps.
data::ImageProcessor run_image_processor(const RunConfig& config);
// The preprocessor_config.json a checkpoint of this run carries: the tower's processor (CLIPImageProcessor,
// SiglipImageProcessor) at the tower's size with the run's normalisation.
std::string run_preprocessor_json(const RunConfig& config);

}  // namespace hr::train
