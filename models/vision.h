// The vision tower: CLIP's (as openai/clip-vit-large-patch14-336: patch embedding, class and position embeddings,
// pre_layrnorm, pre-LN encoder layers with quick_gelu MLPs) or SigLIP's (as google/siglip-so400m-patch14-384: patch
// embedding with bias, position embeddings, no class token and no pre-norm, tanh-GELU MLPs), with select_layer and
// feature selection.
#pragma once

#include <memory>
#include <vector>

#include "models/activation_offload.h"
#include "models/checkpoint_policy.h"
#include "models/config.h"
#include "models/layers.h"

namespace hr::models {

struct VisionLayerSaved {
  Tensor x;                   // (I, N, C) block input
  Tensor ln1_mean, ln1_rstd;  // f32 (I*N)
  Tensor xn1;                 // (I, N, C)
  Tensor q, k, v;             // (I, N, H, D)
  Tensor attn, lse;           // (I, N, H, D), f32 (I, H, N)
  Tensor h;                   // (I, N, C) x + out_proj(attn)
  Tensor ln2_mean, ln2_rstd;  // f32 (I*N)
  Tensor xn2;                 // (I, N, C)
  Tensor fc1, act;            // (I, N, F) each; act = quick_gelu(fc1) (CLIP) or gelu_tanh(fc1) (SigLIP)
};

class VisionLayer {
 public:
  VisionLayer(ParamStore& store, const std::string& prefix, const VisionConfig& cfg);
  Tensor forward(const Tensor& x, VisionLayerSaved& saved, CheckpointKind kind) const;
  Tensor backward(const Tensor& dy, VisionLayerSaved& saved) const;

  const std::string& name() const { return prefix_; }

 private:
  void compute(VisionLayerSaved& s) const;

  std::string prefix_;
  VisionConfig cfg_;
  core::UnaryOp act_;
  LayerNorm ln1_, ln2_;
  Linear q_, k_, v_, o_, fc1_, fc2_;
};

struct VisionSaved {
  Tensor patches;  // (I, P, 3*p*p) patchified pixels: the patch-embedding weight gradient needs them
  Tensor pre_in;   // (I, N, C) embeddings before CLIP's pre_layrnorm
  Tensor pre_mean, pre_rstd;
  std::vector<VisionLayerSaved> layers;
  std::unique_ptr<ActivationOffload> offload;  // memory.offload_activations (last: it outlives no layer's tensors)
};

class VisionTower {
 public:
  // Parameters go to group `stem` (patch/class/position embeddings and the layer norms) and one group per
  // layer after it (stem + 1 + i), which the store must already have.
  VisionTower(ParamStore& store, const std::string& prefix, const VisionConfig& cfg, int stem);
  // pixels (I, 3, S, S) -> features (I, T, C) of hidden_states[select_layer], CLS dropped for `patch`.
  Tensor forward(const Tensor& pixels, VisionSaved& saved, const CheckpointPolicy& policy, Saving saving) const;
  // Accumulates parameter gradients from d(features); pixels need no gradient.
  void backward(const Tensor& d_features, VisionSaved& saved) const;
  bool trainable() const;
  void set_hooks(GroupHooks* hooks) { hooks_ = hooks; }
  void set_watch(OutputWatch* watch) { watch_ = watch; }

 private:
  GroupHooks* hooks_ = nullptr;
  OutputWatch* watch_ = nullptr;
  int group_ = 0;
  std::string prefix_;
  VisionConfig cfg_;
  Param* patch_embedding_;            // (C, 3, p, p)
  Param* class_embedding_ = nullptr;  // (C), CLIP's
  Param* position_embedding_;         // (N, C)
  LayerNorm pre_ln_, post_ln_;        // pre_layrnorm is CLIP's; post_layernorm is in the checkpoints, unused
  Tensor embed(const Tensor& pixels, VisionSaved& saved, Saving saving) const;
  Tensor embed_backward(const Tensor& dh, VisionSaved& saved) const;
  std::vector<VisionLayer> layers_;
  Linear patch_linear_;  // the conv as a linear over flattened patches, sharing patch_embedding_
};

}  // namespace hr::models
