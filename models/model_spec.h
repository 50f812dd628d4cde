// The `model:` section of a config file: architecture (a preset and/or explicit keys with Hugging Face
// names), parameter dtype and which groups are frozen.
#pragma once

#include <string>

#include "core/dtype.h"
#include "models/config.h"

namespace YAML {
class Node;
}

namespace hr::models {

struct ModelSpec {
  LlavaConfig config;
  // model.name_or_path: a Hugging Face LLaVA directory whose config.json gives the dimensions (and whose
  // weights the run starts from unless model.weights says otherwise).
  std::string name_or_path;
  // LLaVA's stage-1 start (models/hf_start.h): a CLIP directory and a LlamaForCausalLM directory whose
  // config.json give the dimensions and whose weights the run starts from, with a fresh projector.
  std::string vision_tower, language_model;
  core::DType dtype = core::DType::F32;
  bool freeze_vision = false, freeze_projector = false, freeze_llm = false;
};

// Parses a `model:` node; `where` names the file in errors. Unknown keys are errors naming the closest key.
ModelSpec parse_model_spec(const YAML::Node& model, const std::string& where);
// Reads the `model:` section of a YAML file.
ModelSpec load_model_spec(const std::string& path);

}  // namespace hr::models
