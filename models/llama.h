// LLaMA-style decoder: token embedding, pre-norm blocks (RMSNorm, RoPE grouped-query causal attention,
// SwiGLU MLP), final norm, untied lm_head. Explicit forward and backward, saved tensors per block.
#pragma once

#include <memory>
#include <vector>

#include "core/ops/softmax.h"
#include "models/activation_offload.h"
#include "models/checkpoint_policy.h"
#include "models/config.h"
#include "models/kv_cache.h"
#include "models/layers.h"

namespace hr::models {

struct LlamaLayerSaved {
  Tensor x;              // (B, L, C) block input
  Tensor rms1;           // (B*L) f32 rstd of input_layernorm
  Tensor xn1;            // (B, L, C)
  Tensor q, k, v;        // (B, L, H, D), (B, L, Hkv, D), (B, L, Hkv, D); q and k after RoPE
  Tensor attn, lse;      // (B, L, H, D), f32 (B, H, L)
  Tensor h;              // (B, L, C) x + o_proj(attn)
  Tensor rms2;           // (B*L) f32 rstd of post_attention_layernorm
  Tensor xn2;            // (B, L, C)
  Tensor gate, up, act;  // (B, L, I) each; act = silu(gate) * up
};

// Where a batch's tokens sit: RoPE's positions and, for a packed (padding-free) batch (1, total, C), the lengths
// of its sequences laid back to back, each attending only to itself (empty: a (B, L, C) batch of whole rows).
struct TokenLayout {
  core::Rotary rot;
  std::vector<int64_t> packed;
  // A layer that runs only the last `tails[s]` positions of each sequence s (packed's, or each row of a (B, L, C)
  // batch: `sequences`) past its keys and values: the last layer of a padding-free pass, whose other rows no loss
  // reads. Its output is (1, sum of tails, C); `tail_rows` says where those rows are in its (B*L, C) input, and
  // `tail_rot` is their RoPE. Empty: the layer runs every row.
  std::vector<int64_t> tails, sequences;
  std::vector<RowRun> tail_rows;
  core::Rotary tail_rot;
  int64_t tail_total() const { return tail_rows.empty() ? 0 : tail_rows.back().to + tail_rows.back().count; }
};

class LlamaLayer {
 public:
  // window: the layer's sliding attention window in tokens (0: causal over everything; LlmConfig::window_of).
  LlamaLayer(ParamStore& store, const std::string& prefix, const LlmConfig& cfg, int64_t window);
  // y = block(x); `saved` keeps what `kind` says (frozen_inputs: keep nothing, no backward will come).
  Tensor forward(const Tensor& x, const TokenLayout& at, LlamaLayerSaved& saved, CheckpointKind kind) const;
  // Recomputes what the policy dropped, then returns dx and accumulates parameter gradients.
  Tensor backward(const Tensor& dy, const TokenLayout& at, LlamaLayerSaved& saved) const;
  // Inference with a KV cache: x (B, Lq, C) are the tokens at rot's positions (B, Lq) i64, row b's first at
  // past_host[b]
  // (past, the same as an i64 (B) tensor on the device); their keys and values are written into k_cache and
  // v_cache (B, capacity, Hkv, D) at those positions, and each query attends to its row's cache up to itself.
  Tensor forward_cached(const Tensor& x, const core::Rotary& rot, const Tensor& past,
                        const std::vector<int64_t>& past_host, Tensor& k_cache, Tensor& v_cache) const;
  const std::string& name() const { return prefix_; }

 private:
  void compute(LlamaLayerSaved& s, const TokenLayout& at) const;

  std::string prefix_;
  LlmConfig cfg_;
  int64_t window_ = 0;
  RMSNorm input_norm_, post_norm_;
  Linear q_, k_, v_, o_, gate_, up_, down_;
};

struct LlamaSaved {
  std::vector<LlamaLayerSaved> layers;
  Tensor final_in;                             // (B, L, C) input of the final norm
  Tensor final_rms;                            // (B*L) f32
  std::vector<int64_t> packed;                 // a packed batch's sequence lengths (TokenLayout)
  std::vector<int64_t> tails;                  // the last layer's rows of each sequence (TokenLayout)
  int64_t batch = 0, seq = 0;                  // the blocks' input (batch, seq, C)
  std::unique_ptr<ActivationOffload> offload;  // memory.offload_activations (last: it outlives no layer's tensors)
};

class LlamaModel {
 public:
  // The store's groups for the embedding table, the first layer (the others follow), the final norm and
  // lm_head.
  struct Groups {
    int embed = 0, first_layer = 0, norm = 0, head = 0;
  };
  LlamaModel(ParamStore& store, const std::string& prefix, const std::string& head_name, const LlmConfig& cfg,
             const Groups& groups);
  // Embeddings of ids (B, L) i64, shape (B, L, C).
  Tensor embed(const Tensor& ids) const;
  void embed_backward(const Tensor& ids, const Tensor& d_embeds) const;
  // Runs the blocks and the final norm; returns the final hidden states (B, L, C). With `packed` sequence lengths,
  // embeds is (1, total, C): those sequences back to back, each at positions from 0 and attending only to itself
  // (a padding-free batch: no row computes a token nobody reads). With `tails` (one per sequence: packed's, or each
  // row's), the last block runs only each sequence's last tails[s] positions past its keys and values, and the
  // result is (1, sum of tails, C): those rows, sequence after sequence.
  Tensor forward(const Tensor& embeds, LlamaSaved& saved, const CheckpointPolicy& policy, Saving saving,
                 const std::vector<int64_t>& packed = {}, const std::vector<int64_t>& tails = {}) const;
  // From d(final hidden) to d(embeds); parameter gradients accumulate.
  Tensor backward(const Tensor& d_hidden, LlamaSaved& saved) const;
  // Inference with a KV cache: runs embeds (B, Lq, C), row b's tokens at positions cache.length[b] onwards,
  // through the blocks and the final norm, appends their keys and values to the cache and advances its lengths
  // by Lq. Returns the final hidden states (B, Lq, C). Nothing is kept for backward.
  Tensor forward_cached(const Tensor& embeds, KvCache& cache) const;
  const Linear& lm_head() const { return lm_head_; }
  const LlmConfig& config() const { return cfg_; }
  void set_hooks(GroupHooks* hooks) { hooks_ = hooks; }
  void set_watch(OutputWatch* watch) { watch_ = watch; }

 private:
  GroupHooks* hooks_ = nullptr;
  OutputWatch* watch_ = nullptr;
  int embed_group_ = 0, layer_group_ = 0, norm_group_ = 0;
  // The positions (b, t) -> t of a batch of embeds (or, packed, each sequence's from 0) and, with fused kernels,
  // their RoPE table.
  TokenLayout layout_for(int64_t batch, int64_t seq, Device device, const std::vector<int64_t>& packed) const;
  // `at` for a layer that runs only the last tails[s] positions of each sequence.
  TokenLayout with_tails(const TokenLayout& at, int64_t batch, int64_t seq, Device device,
                         const std::vector<int64_t>& tails) const;
  core::Rotary rotary_at(const std::vector<int64_t>& positions, int64_t batch, int64_t seq, Device device) const;

  LlmConfig cfg_;
  std::string prefix_;
  Param* embed_tokens_;
  std::vector<LlamaLayer> layers_;
  RMSNorm norm_;
  Linear lm_head_;
};

}  // namespace hr::models
