// LLaVA: vision tower -> projector -> image features spliced into the token embeddings at the image
// placeholder tokens -> LLaMA decoder -> cross-entropy on answer tokens, fused with lm_head in chunks.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "core/ops/cross_entropy.h"
#include "core/ops/embedding.h"
#include "data/batch.h"
#include "models/llama.h"
#include "models/projector.h"
#include "models/vision.h"

namespace hr::models {

using data::Batch;

struct ModelOptions {
  CheckpointPolicy vision_policy, llm_policy;
  bool return_logits = false;  // also materialise (batch, seq, vocab) logits (debugging, parity)
  // Logits of these flat positions (b * seq + t) only, as (positions, vocab): what evaluation and generation
  // read, without the (batch, seq, vocab) tensor a large vocabulary makes expensive.
  std::vector<int64_t> logits_at;
  // transformers' logits_to_keep: k > 0 keeps the logits of each row's last k positions, as (batch * k, vocab)
  // in row order; 0 keeps all (as return_logits); -1 (the default) none. Adds to logits_at.
  int64_t logits_to_keep = -1;
  int64_t ce_chunk_rows = 0;  // rows of the fused cross-entropy per chunk; 0: default
  bool inference = false;     // no backward will follow: keep no activations (evaluation, generation)
  // Padding-free training passes (train.padding_free): the LLM runs only the positions the loss reads, each row's
  // tokens up to its last labelled one, packed back to back (loss_lengths); the rest (padding, an unlabelled
  // tail) changes no loss and no gradient. Not with logits asked for, nor in inference.
  bool padding_free = false;
};

// What forward leaves for backward.
struct LlavaState {
  Tensor ids;                          // (B, L) i64 on the device
  std::vector<int64_t> image_offsets;  // flat token offset of each image's placeholder run
  std::vector<int64_t> image_tokens;   // each image's placeholders: tokens_per_image, or its AnyRes layout's
  core::HostMix mix;                   // AnyRes: the images' tokens from their crops' projected rows (models/anyres.h)
  int64_t crop_rows = 0;               // AnyRes: the projected rows the mix reads (crops x tokens_per_image)
  VisionSaved vision;
  ProjectorSaved projector;
  LlamaSaved llm;
  // (B*(L-1), C) and (B*(L-1)): the positions whose next token has a label, in order, then zeros and ignore_index.
  // Position t predicts token t+1.
  Tensor hidden_shift, labels_shift;
  std::vector<RowRun> label_runs;  // where those positions are in the LLM's rows, and where they went
  // Padding-free: where each kept row's positions are in the (B*L) batch and in the LLM's packed (1, total) rows,
  // and the packed sequences' lengths; both empty when the LLM ran the whole (B, L) batch.
  std::vector<RowRun> llm_rows;
  std::vector<int64_t> packed;
  // Padding-free: how many of each LLM sequence's last positions its last layer runs (tail_lengths); empty: all.
  std::vector<int64_t> tails;
  core::CrossEntropyOut ce;
  core::CrossEntropyOptions ce_options;
  int64_t batch = 0, seq = 0;
  bool has_images = false;
  Tensor logits;  // (B, L, V) with return_logits; (positions, V) with logits_at
  int64_t valid_labels = 0;
  bool backward_ready = false;  // forward kept what backward needs
  uint64_t lora_key = 0;        // the LoRA dropout key of this training pass (0: no dropout)
};

// The positions of each row of `b` a training pass's loss depends on: through its last labelled token (that
// token's own hidden state predicts nothing, but keeping it keeps a fully labelled row whole, so the planner's
// worst case is never packed); 0 for a row without labels. In a causal model nothing before a position depends on
// what comes after it, so dropping the rest changes no loss and no gradient.
std::vector<int64_t> loss_lengths(const Batch& b, int64_t ignore_index);
// loss_lengths where a padding-free pass packs `b`, empty where it runs the batch whole: where that would drop
// nothing (every row labelled to its end, as the planner's worst case) or keep nothing (no labels at all). The
// model packs by it and the planner's step shapes count by it, so the two cannot disagree.
std::vector<int64_t> packed_lengths(const Batch& b, int64_t ignore_index);
// Of each sequence a padding-free pass runs through the LLM (`packed`: packed_lengths(b, ignore_index), which every
// caller has already made; or every row where it packs nothing), how many of its last positions the last layer
// runs: from the first position the loss reads (the first whose next token has a label) on. The loss reads no other
// row of the last layer, which needs the rest only as keys and values, so it runs them no further (no query, output
// projection, norm or MLP). Empty (every row) where that would keep over half the rows (a trimmed layer's gathers
// then cost about what it saves, and the planner's worst case, every position labelled, is never trimmed), or where
// nothing is labelled.
std::vector<int64_t> tail_lengths(const Batch& b, int64_t ignore_index, const std::vector<int64_t>& packed);

class Llava final : public GroupedParams {
 public:
  // `vision_dtype` (default: dtype) lets the vision tower run in another precision (vision_precision: fp32).
  Llava(const LlavaConfig& cfg, Device device, DType dtype, std::optional<DType> vision_dtype = std::nullopt);
  ParamStore& params() override { return *store_; }
  const ParamStore& params() const { return *store_; }
  const LlavaConfig& config() const { return cfg_; }

  // Which parts train; frozen groups get no gradient buffers. LLaVA stage 1 is {.projector = true}.
  struct Trainable {
    bool vision = false, projector = false, llm = false;
  };
  void set_trainable(Trainable parts);

  // Parameter groups in the order the forward pass first uses them: the token embeddings, the vision
  // embeddings, each vision layer, the projector, each LLM layer, the final norm, lm_head.
  const std::vector<ParamGroup>& groups() const { return store_->groups(); }
  using GroupedParams::groups;
  // Forward: every group in order (vision layers up to the selected one). Backward: the head, the final
  // norm, the LLM layers in reverse, then what trains of the embeddings, the projector and the vision tower.
  const std::vector<int>& pass_order(Pass pass) const override;
  // With tied embeddings the head (a group with no parameters of its own) computes with the embedding's table.
  int borrowed_group(int group) const override;
  // Hooks called around each group's use and at the end of each pass (ZeRO); null for none. The hooks
  // outlive their use here.
  void set_hooks(GroupHooks* hooks) override;
  // The watch that sees each group's output and input gradient (diagnosing a numerical fault); null for none.
  void set_watch(OutputWatch* watch);

  // Returns the mean loss over the micro-batch's valid labels (0 on the meta device).
  float forward(const Batch& batch, LlavaState& state, const ModelOptions& options) const;
  // Adds d(loss * loss_scale)/d(param) into the gradient buffers of trainable parameters.
  void backward(LlavaState& state, float loss_scale = 1.f) const;

  // Generation with a KV cache. A cache of `capacity` positions for each of `batch` rows.
  KvCache make_cache(int64_t batch, int64_t capacity) const;
  // Runs the prompts of `prompts` (right-padded: row b's prompt is its first lengths[b] tokens, images spliced
  // in as in forward) into an empty cache and returns the logits at each row's last prompt token,
  // (batch, vocab) in the model precision: the [tokens, vocab] logits of the prompt never exist.
  Tensor prefill(const Batch& prompts, const std::vector<int64_t>& lengths, KvCache& cache) const;
  // Appends one token per row (at the row's cache length) and returns the next logits, (batch, vocab).
  Tensor decode(const std::vector<int64_t>& tokens, KvCache& cache) const;

 private:
  // The token embeddings of `b` with the projected image features spliced in at their placeholders; fills
  // st.ids, st.image_offsets and the vision and projector states (kept unless options.inference).
  Tensor embed_inputs(const Batch& b, LlavaState& st, const ModelOptions& options) const;
  // The vision tower and the projector over the batch's images (each of its crops with AnyRes): the images' tokens
  // one after another, (sum of st.image_tokens, C).
  Tensor project_images(const Tensor& pixel_values, LlavaState& st, const ModelOptions& options) const;
  // AnyRes: the images' tokens from the projected crops (crops, T, C) and image_newline, as st.mix says; and the
  // gradient of the crops from the tokens' (adding image_newline's into its gradient).
  Tensor mix_image_tokens(const Tensor& proj, const LlavaState& st) const;
  Tensor mix_image_tokens_backward(const Tensor& d_tokens, const LlavaState& st) const;
  // The gradient of the images' tokens, gathered from the embeddings' one after another: (sum of st.image_tokens, C).
  Tensor image_token_grads(const Tensor& d_embeds, const LlavaState& st) const;
  // st.logits as options ask for them: all (return_logits, logits_to_keep 0) or the rows they name.
  void keep_logits(const Tensor& hidden, const Batch& b, LlavaState& st, const ModelOptions& options) const;
  // Padding-free: fills st.llm_rows and st.packed when the pass drops positions, and st.tails when its last layer
  // runs fewer rows; returns the LLM's rows.
  int64_t pack_llm_rows(const Batch& b, LlavaState& st, const ModelOptions& options) const;
  // The loss of the forward pass, which it ends (0 where generation wants only the logits).
  float head_loss(LlavaState& st, const ModelOptions& options) const;
  // lm_head over the rows `rows` of hidden (tokens, C): (rows, vocab).
  Tensor head_rows(const Tensor& hidden, const std::vector<int64_t>& rows) const;
  LlavaConfig cfg_;
  std::unique_ptr<ParamStore> store_;
  std::unique_ptr<VisionTower> vision_;
  std::unique_ptr<Projector> projector_;
  std::unique_ptr<LlamaModel> llm_;
  core::Param* image_newline_ = nullptr;  // spatial_unpad's row end (cfg_.image_newline())
  void set_pass_orders();
  bool vision_trainable_ = true, projector_trainable_ = true, llm_trainable_ = true;
  bool llm_adapters_ = false;         // LoRA: the decoder's adapters train (its base does not)
  mutable uint64_t lora_passes_ = 0;  // training passes so far: each draws its own dropout masks
  GroupHooks* hooks_ = nullptr;
  OutputWatch* watch_ = nullptr;
  int embed_group_ = 0, stem_group_ = 0, projector_group_ = 0, head_group_ = 0;
  std::vector<int> forward_order_, backward_order_;
};

}  // namespace hr::models
