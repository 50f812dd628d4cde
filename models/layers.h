// Parameterised layers (linear, layer norm, RMS norm) over the core ops: forward, and a backward that
// accumulates parameter gradients into their buffers when the parameters are trainable.
#pragma once

#include "core/ops/norm.h"
#include "core/parameters.h"

namespace hr::models {

using core::DType;
using core::Device;
using core::GroupHooks;
using core::OutputWatch;
using core::GroupedParams;
using core::GroupKind;
using core::Param;
using core::ParamGroup;
using core::ParamRole;
using core::ParamStore;
using core::Pass;
using core::Shape;
using core::Tensor;

struct Linear {
  Param* weight = nullptr;  // (out, in); a conv weight (out, c, p, p) is viewed as (out, c*p*p)
  Param* bias = nullptr;    // (out) or null

  static Linear make(ParamStore& store, const std::string& prefix, int64_t in, int64_t out, bool bias);
  Tensor forward(const Tensor& x) const;
  // Adds dW (and db) into the gradient buffers when trainable; returns dx when need_dx.
  Tensor backward(const Tensor& dy, const Tensor& x, bool need_dx = true) const;
  int64_t in() const { return weight->data.numel() / weight->data.size(0); }
  int64_t out() const { return weight->data.size(0); }

 private:
  Tensor w2d() const { return weight->data.view({out(), in()}); }
};

struct LayerNorm {
  Param* weight = nullptr;
  Param* bias = nullptr;
  float eps = 1e-5f;

  static LayerNorm make(ParamStore& store, const std::string& prefix, int64_t dim, float eps);
  core::NormOut forward(const Tensor& x) const;
  Tensor backward(const Tensor& dy, const Tensor& x, const core::NormSaved& saved) const;
};

struct RMSNorm {
  Param* weight = nullptr;
  float eps = 1e-6f;

  static RMSNorm make(ParamStore& store, const std::string& prefix, int64_t dim, float eps);
  core::NormOut forward(const Tensor& x) const;
  Tensor backward(const Tensor& dy, const Tensor& x, const core::NormSaved& saved) const;
};

}  // namespace hr::models
