// The KV cache of generation: every decoder layer's keys (after RoPE) and values for the positions seen so far,
// one row per sequence, in the model precision, grouped-query heads stored once per KV head.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "models/config.h"

namespace hr::models {

using core::Tensor;

struct KvCache {
  std::vector<Tensor> k, v;     // per layer (batch, capacity, kv_heads, head_dim)
  std::vector<int64_t> length;  // per row: the positions written (the next token's position)
  int64_t capacity = 0;

  int64_t batch() const { return int64_t(length.size()); }
  // 2 · layers · batch · capacity · kv_heads · head_dim · bytes per element.
  static int64_t bytes(const LlmConfig& cfg, int64_t batch, int64_t capacity, core::DType dtype);
};

// A cache for `batch` rows of up to `capacity` positions each, allocated on `device` as activations owned by
// "<prefix>.layers.N.kv_cache" (its contents are undefined until written).
KvCache make_kv_cache(const LlmConfig& cfg, const std::string& prefix, int64_t batch, int64_t capacity,
                      core::DType dtype, core::Device device);

}  // namespace hr::models
