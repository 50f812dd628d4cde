// Model configuration: the vision tower, projector and language model of a LLaVA-style model, and presets.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/quant.h"
#include "data/batch.h"

namespace hr::models {

enum class FeatureSelect : uint8_t { Patch, ClsPatch };    // LLaVA's mm_vision_select_feature
enum class ProjectorType : uint8_t { Linear, Mlp2xGelu };  // LLaVA's mm_projector_type

// The vision tower's family, transformers' vision_config.model_type. CLIP (clip_vision_model): a class token,
// a patch embedding without bias, pre_layrnorm, quick_gelu MLPs. SigLIP (siglip_vision_model): no class token, a
// patch embedding with bias over the image's whole patches (384 px in 14-px patches: 27 x 27, the last 6 rows and
// columns of pixels unused, as its "valid" conv), no pre-norm, tanh-approximated GELU MLPs.
enum class Tower : uint8_t { Clip, Siglip };

// model.fused_kernels, a kernel choice and not part of the architecture (config.json does not carry it). auto: the
// layers run the fused kernels (RoPE rotating by a table computed once a step, the residual add inside the norm
// after it, a linear layer's bias add inside the activation after it: the tower's fc1 and the projector's linear_1)
// on every back-end, all of which have them; off: the unfused ops, the same values in more passes.
enum class FusedKernels : uint8_t { Auto, Off };
FusedKernels parse_fused_kernels(const std::string& s, const std::string& key);

struct VisionConfig {
  int64_t hidden = 1024, layers = 24, heads = 16, intermediate = 4096;
  int64_t image_size = 336, patch = 14, channels = 3;
  float layer_norm_eps = 1e-5f;
  int select_layer = -2;  // as hidden_states[select_layer]: 0 is the embeddings, -1 the last layer
  FeatureSelect select_feature = FeatureSelect::Patch;
  Tower tower = Tower::Clip;
  FusedKernels kernels = FusedKernels::Auto;  // model.fused_kernels

  int64_t grid() const { return image_size / patch; }  // patches per side
  int64_t num_patches() const { return grid() * grid(); }
  bool class_token() const { return tower == Tower::Clip; }
  int64_t num_positions() const { return num_patches() + (class_token() ? 1 : 0); }
  bool fused() const { return kernels == FusedKernels::Auto; }
  // How many encoder layers actually run (those after the selected one do not influence anything).
  int64_t layers_used() const;
  // Image features per image handed to the projector: `patch` (LLaVA's and llava-hf's "default") drops the first
  // position (CLIP's class token; for SigLIP, a patch, as transformers does), `cls_patch` ("full") keeps all.
  int64_t tokens_per_image() const {
    return select_feature == FeatureSelect::Patch ? num_positions() - 1 : num_positions();
  }
};

// LoRA (PEFT's LoraLayer) on the linear layers it names: y = W x + b + (alpha / r) B A dropout(x), A (r, in) and
// B (out, r) parameters of their own (`<layer>.lora_A.weight`, `<layer>.lora_B.weight`) in the layer's group.
struct LoraSpec {
  int64_t r = 0;  // 0: no adapters
  float alpha = 16.f;
  float dropout = 0.f;
  std::vector<std::string> targets;  // the layers' own names (the last part of theirs): q_proj, v_proj, ...
  // QLoRA's frozen base: 16 keeps the decoder layers' linear weights in the model precision; 8 and 4 hold every
  // one of them quantized (lora.base_bits, lora.quant_type, lora.double_quant), adapted or not.
  int base_bits = 16;
  core::QuantType quant_type = core::QuantType::NF4;
  bool double_quant = true;
  bool adapts(const std::string& layer) const;
  float scale() const { return alpha / float(r); }
  bool quantizes_base() const { return base_bits < 16; }
  core::QuantFormat base_format() const {
    core::QuantFormat f;
    f.type = base_bits == 8 ? core::QuantType::Int8 : quant_type;
    f.double_quant = base_bits == 4 && double_quant;
    return f;
  }
};

// The decoder's family, transformers' text_config.model_type. All three are LLaMA's blocks (RMSNorm, RoPE,
// grouped-query attention, SwiGLU); Qwen2 adds biases to q_proj, k_proj and v_proj. Mistral (every layer) and
// Qwen2 (the layers from max_window_layers on) may set a sliding attention window, which headroom runs where no
// sequence is longer than the window (there it is causal attention) and refuses by name elsewhere.
enum class Decoder : uint8_t { Llama, Qwen2, Mistral };

struct LlmConfig {
  int64_t vocab = 32064, hidden = 4096, layers = 32, heads = 32, kv_heads = 32, intermediate = 11008;
  float rms_norm_eps = 1e-5f;
  float rope_theta = 10000.f;
  LoraSpec lora;  // adapters on the decoder layers' linear layers (lora.*), none by default
  Decoder decoder = Decoder::Llama;
  int64_t sliding_window = 0;  // attention window in tokens; 0: none (causal attention over everything)
  // Qwen2's max_window_layers: layers [0, max_window_layers) attend over everything, the rest through the window
  // (transformers' Qwen2); Mistral's window is every layer's (0).
  int64_t max_window_layers = 0;
  // tie_word_embeddings (Qwen2-0.5B's): lm_head multiplies by embed_tokens' table, one parameter in the embedding's
  // group that both ends of the model read and whose gradient both accumulate.
  bool tied_embeddings = false;
  FusedKernels kernels = FusedKernels::Auto;  // model.fused_kernels
  bool fused() const { return kernels == FusedKernels::Auto; }
  int64_t head_dim() const { return hidden / heads; }
  bool qkv_bias() const { return decoder == Decoder::Qwen2; }
  bool windowed() const { return sliding_window > 0 && max_window_layers < layers; }  // some layer has a window
  // Decoder layer `layer`'s attention window in tokens (0: causal over everything): sliding_window in the layers
  // from max_window_layers on.
  int64_t window_of(int64_t layer) const {
    return sliding_window > 0 && layer >= max_window_layers ? sliding_window : 0;
  }
};

// LLaVA-NeXT's AnyRes (models/anyres.h): each image is cut for the best of `pinpoints` and encoded as its base image
// plus every tile of the tower's size; `merge` turns the crops' features into the image's tokens.
enum class PatchMerge : uint8_t { SpatialUnpad, Flat };  // mm_patch_merge_type
PatchMerge parse_patch_merge(const std::string& s);
// OneVision's vision_aspect_ratio: "anyres_max_N" (N) or "anyres" (0, no pooling); errors name `where`.
int64_t parse_vision_aspect_ratio(const std::string& s, const std::string& where);
struct AnyresConfig {
  std::vector<data::Resolution> pinpoints;  // image_grid_pinpoints; empty: one image of the tower's size (LLaVA-1.5)
  PatchMerge merge = PatchMerge::SpatialUnpad;
  int64_t max_num_patches = 0;  // OneVision's vision_aspect_ratio anyres_max_N (N, in base images); 0: no pooling
  bool on() const { return !pinpoints.empty(); }
};

// How errors name a model key: as the config's model section does (model.llm.hidden_size) or as a Hugging Face
// config.json does (text_config.hidden_size).
enum class KeyNames : uint8_t { Headroom, HuggingFace };

struct LlavaConfig {
  std::string name = "custom";
  VisionConfig vision;
  LlmConfig llm;
  ProjectorType projector = ProjectorType::Mlp2xGelu;
  int64_t image_token_id = 32000;
  int64_t ignore_index = -100;
  AnyresConfig anyres;  // off by default
  // spatial_unpad's learned image_newline (llava-hf's name; (llm hidden) in the projector's group), which ends each
  // row of an AnyRes image's tokens.
  bool image_newline() const { return anyres.on() && anyres.merge == PatchMerge::SpatialUnpad; }

  // Throws naming the offending key: every dimension positive, heads that divide, finite positive epsilons and
  // rope_theta, an image token inside the vocabulary, and parameter counts whose bytes (16 per parameter: an f32
  // weight, its gradient and two optimizer states) fit in 64 bits.
  void validate(KeyNames names = KeyNames::Headroom) const;
  // The model's parameters without adapters, in closed form (the count a model built from it has).
  int64_t parameter_count() const;
  // The keys (with their values) of the part of the model that holds the most parameters, for messages:
  // "model.llm.num_hidden_layers 32, model.llm.hidden_size 4096, model.llm.intermediate_size 11008".
  std::string largest_part() const;
};

// tiny (tests), small (trains on a CPU in minutes), llava-1.5-7b, llava-1.5-13b, llava-v1.6-vicuna-7b and
// llava-v1.6-mistral-7b (LLaVA-NeXT: AnyRes),
// llava-onevision-qwen2-7b (the llava-hf dimensions; the last two with one image of the tower's size until AnyRes),
// llava-onevision-qwen2-0.5b (the 7B's tower with Qwen/Qwen2-0.5B's dimensions, tied embeddings).
LlavaConfig preset(const std::string& name);
std::vector<std::string> preset_names();

const char* projector_name(ProjectorType t);
// "clip_vision_model", "siglip_vision_model": the model_type names, used by config.json and model.vision.model_type.
const char* tower_name(Tower t);
Tower parse_tower(const std::string& s, const std::string& key);
// "llama", "qwen2", "mistral": the model_type names, used by config.json and model.llm.model_type alike.
const char* decoder_name(Decoder d);
// Throws naming `key` for another name.
Decoder parse_decoder(const std::string& s, const std::string& key);
ProjectorType parse_projector(const std::string& s);
FeatureSelect parse_feature_select(const std::string& s);

// What this model expects of its inputs, for the data pipeline.
data::InputSpec input_spec(const LlavaConfig& c);

}  // namespace hr::models
