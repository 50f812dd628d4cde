// The multimodal projector: `linear` or `mlp2x_gelu` (Linear -> GELU -> Linear), LLaVA's mm_projector_type.
#pragma once

#include "models/config.h"
#include "models/layers.h"

namespace hr::models {

struct ProjectorSaved {
  Tensor x;    // (I, T, Cv) image features
  Tensor h1;   // (I, T, C) linear_1 output (mlp2x_gelu only)
  Tensor act;  // (I, T, C) gelu(h1)
};

class Projector {
 public:
  // kernels: model.fused_kernels (auto: linear_1's bias add inside the GELU's pass).
  Projector(ParamStore& store, const std::string& prefix, ProjectorType type, int64_t in, int64_t out,
            FusedKernels kernels);
  Tensor forward(const Tensor& x, ProjectorSaved& saved, Saving saving) const;
  // Returns d(x) unless `input` skips it (the vision tower is frozen), accumulating parameter gradients.
  Tensor backward(const Tensor& dy, ProjectorSaved& saved, InputGrad input) const;

 private:
  std::string prefix_;
  ProjectorType type_;
  bool fused_;
  Linear l1_, l2_;
};

}  // namespace hr::models
