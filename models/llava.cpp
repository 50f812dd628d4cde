// LLaVA forward and backward: splice image features into token embeddings, shifted chunked loss.
#include "models/llava.h"

#include <numeric>

#include "core/memory/category.h"
#include "core/ops/copy.h"
#include "core/ops/embedding.h"
#include "core/ops/linear.h"
#include "core/ops/reduce.h"
#include "models/anyres.h"

namespace hr::models {

using namespace hr::core;

namespace {
constexpr const char* kVisionPrefix = "vision_tower.vision_model";
constexpr const char* kProjectorPrefix = "multi_modal_projector";
constexpr const char* kLlmPrefix = "language_model.model";
constexpr const char* kHeadName = "language_model.lm_head";
constexpr const char* kImageNewline = "image_newline";  // llava-hf's LlavaNext name
}  // namespace

Llava::Llava(const LlavaConfig& cfg, Device device, DType dtype, std::optional<DType> vision_dtype) : cfg_(cfg) {
  cfg_.validate();
  store_ = std::make_unique<ParamStore>(device, dtype);
  if (vision_dtype)
    for (GroupKind k : {GroupKind::EncoderStem, GroupKind::EncoderLayer}) store_->set_dtype_for(k, *vision_dtype);
  // Groups in the order the forward pass first uses them.
  embed_group_ = store_->add_group(str(kLlmPrefix, ".embed_tokens"), GroupKind::Embedding);
  stem_group_ = store_->add_group(str(kVisionPrefix, ".embeddings"), GroupKind::EncoderStem);
  for (int64_t i = 0; i < cfg_.vision.layers; ++i)
    store_->add_group(str(kVisionPrefix, ".encoder.layers.", i), GroupKind::EncoderLayer);
  projector_group_ = store_->add_group(kProjectorPrefix, GroupKind::Projector);
  LlamaModel::Groups llm;
  llm.embed = embed_group_;
  for (int64_t i = 0; i < cfg_.llm.layers; ++i) {
    const int g = store_->add_group(str(kLlmPrefix, ".layers.", i), GroupKind::DecoderLayer);
    if (i == 0) llm.first_layer = g;
  }
  llm.norm = store_->add_group(str(kLlmPrefix, ".norm"), GroupKind::Head);
  llm.head = head_group_ = store_->add_group(kHeadName, GroupKind::Head);
  vision_ = std::make_unique<VisionTower>(*store_, kVisionPrefix, cfg_.vision, stem_group_);
  {
    ParamStore::GroupScope in(*store_, projector_group_);
    projector_ = std::make_unique<Projector>(*store_, kProjectorPrefix, cfg_.projector, cfg_.vision.hidden,
                                             cfg_.llm.hidden, cfg_.vision.kernels);
    if (cfg_.image_newline()) image_newline_ = &store_->add(kImageNewline, {cfg_.llm.hidden});
  }
  llm_ = std::make_unique<LlamaModel>(*store_, kLlmPrefix, kHeadName, cfg_.llm, llm);
  set_pass_orders();
}

void Llava::set_pass_orders() {
  const int used = int(cfg_.vision.layers_used()), first_llm = projector_group_ + 1;
  forward_order_.clear();
  for (int g = embed_group_; g <= stem_group_ + used; ++g) forward_order_.push_back(g);
  for (int g = projector_group_; g <= head_group_; ++g) forward_order_.push_back(g);
  backward_order_.clear();
  for (int g = head_group_; g >= first_llm; --g) backward_order_.push_back(g);
  if (llm_trainable_) backward_order_.push_back(embed_group_);
  if (projector_trainable_ || vision_trainable_) backward_order_.push_back(projector_group_);
  if (vision_trainable_)
    for (int g = stem_group_ + used; g >= stem_group_; --g) backward_order_.push_back(g);
}

const std::vector<int>& Llava::pass_order(Pass pass) const {
  return pass == Pass::Forward ? forward_order_ : backward_order_;
}

int Llava::borrowed_group(int group) const {
  return cfg_.llm.tied_embeddings && group == head_group_ ? embed_group_ : -1;
}

void Llava::set_hooks(GroupHooks* hooks) {
  hooks_ = hooks;
  vision_->set_hooks(hooks);
  llm_->set_hooks(hooks);
}

void Llava::set_watch(OutputWatch* watch) {
  watch_ = watch;
  vision_->set_watch(watch);
  llm_->set_watch(watch);
}

void Llava::set_trainable(Trainable parts) {
  vision_trainable_ = parts.vision;
  projector_trainable_ = parts.projector;
  const bool lora = cfg_.llm.lora.r > 0;
  llm_trainable_ = parts.llm && !lora;
  llm_adapters_ = parts.llm && lora;
  for (GroupKind k : {GroupKind::EncoderStem, GroupKind::EncoderLayer}) store_->set_trainable(k, parts.vision);
  store_->set_trainable(GroupKind::Projector, parts.projector);
  for (GroupKind k : {GroupKind::Embedding, GroupKind::DecoderLayer, GroupKind::Head})
    store_->set_trainable(k, llm_trainable_);
  if (llm_adapters_)  // LoRA: the decoder's adapters train, its base (and embeddings, norms, head) stays frozen
    for (const auto& p : store_->all())
      if (p->role == ParamRole::LoraA || p->role == ParamRole::LoraB) p->trainable = true;
  set_pass_orders();
}

namespace {

// The flat offset of each image's placeholders: image i is a run of tokens[i] of them, images in order (runs of
// several images are split in turn).
std::vector<int64_t> find_images(const Batch& b, int64_t image_token, const std::vector<int64_t>& tokens) {
  const int64_t B = b.batch, L = b.seq;
  std::vector<int64_t> offsets;
  for (int64_t r = 0; r < B; ++r) {
    int64_t t = 0;
    while (t < L) {
      if (b.input_ids[r * L + t] != image_token) {
        ++t;
        continue;
      }
      const std::size_t i = offsets.size();
      HR_CHECK(i < tokens.size(), "[llava] input_ids hold placeholders for more than the batch's ", tokens.size(),
               " images (sample ", r, " at position ", t, ")");
      int64_t end = t;
      while (end < t + tokens[i] && end < L && b.input_ids[r * L + end] == image_token) ++end;
      HR_CHECK(end - t == tokens[i], "[llava] sample ", r, " has a run of ", end - t, " image tokens at position ", t,
               " where image ", i, " needs exactly ", tokens[i], " (tokens_per_image, or its AnyRes layout)");
      offsets.push_back(r * L + t);
      t = end;
    }
  }
  HR_CHECK(offsets.size() == tokens.size(), "[llava] input_ids hold placeholders for ", offsets.size(),
           " images but pixel_values has ", tokens.size());
  return offsets;
}

// The batch's pixels on `dev`. The loader's batch lives until the step ends: on a GPU the transfer from its
// (pinned) buffer overlaps the embedding lookup and the first layers' launches.
Tensor pixels_on(const Tensor& pixel_values, Device dev) {
  MemoryScope scope(Category::IO, "batch");
  if (pixel_values.device() == dev) return pixel_values;
  Tensor pixels = Tensor::empty(pixel_values.shape(), pixel_values.dtype(), dev);
  copy_async_(pixels, pixel_values);
  return pixels;
}

// The flat positions (b * seq + t) whose logits `opt` asks for by position: logits_at, then each row's last
// logits_to_keep.
std::vector<int64_t> logit_rows(const ModelOptions& opt, int64_t B, int64_t L) {
  std::vector<int64_t> rows = opt.logits_at;
  if (opt.logits_to_keep > 0) {
    const int64_t k = std::min(opt.logits_to_keep, L);
    for (int64_t r = 0; r < B; ++r)
      for (int64_t t = L - k; t < L; ++t) rows.push_back(r * L + t);
  }
  for (int64_t p : rows)
    HR_CHECK(p >= 0 && p < B * L, "[llava.forward] logits_at position ", p, " is outside the batch's ", B, " x ", L,
             " tokens");
  return rows;
}

// The labels shifted by one, (B * (L - 1)) on `dev`: position t predicts token t+1. The labelled positions come
// first, in order, then ignore_index for the rest; `runs` says which (B * L) positions they are (the loss's GEMMs
// then skip the chunks without labels). Counts the labelled ones. The labels are checked here, on the host, once
// per batch: the loss kernels then need not (on a GPU, checking there waits for the device at every chunk).
Tensor shift_labels(const Batch& b, const LlavaConfig& cfg, Device dev, std::vector<RowRun>& runs,
                    int64_t& valid_labels) {
  const int64_t B = b.batch, L = b.seq, vocab = cfg.llm.vocab;
  std::vector<int64_t> shifted(std::size_t(B * (L - 1)), cfg.ignore_index);
  runs.clear();
  int64_t n = 0;
  for (int64_t r = 0; r < B; ++r)
    for (int64_t t = 0; t + 1 < L; ++t) {
      const int64_t lab = b.labels[r * L + t + 1];
      HR_CHECK(lab == cfg.ignore_index || (lab >= 0 && lab < vocab), "[llava] label ", lab, " of sequence ", r,
               " at position ", t + 1, " is outside the vocabulary [0, ", vocab, ") and is not ignore_index ",
               cfg.ignore_index);
      if (lab == cfg.ignore_index) continue;
      if (runs.empty() || runs.back().from + runs.back().count != r * L + t) runs.push_back({r * L + t, n, 0});
      ++runs.back().count;
      shifted[std::size_t(n++)] = lab;
    }
  valid_labels = n;
  return Tensor::from_ints(shifted, {B * (L - 1)}, DType::I64, dev);
}

}  // namespace

std::vector<int64_t> loss_lengths(const Batch& b, int64_t ignore_index) {
  std::vector<int64_t> n(std::size_t(b.batch), 0);
  for (int64_t r = 0; r < b.batch; ++r)
    for (int64_t t = b.seq; t-- > 1;)  // position 0's label is never predicted
      if (b.labels[std::size_t(r * b.seq + t)] != ignore_index) {
        n[std::size_t(r)] = t + 1;
        break;
      }
  return n;
}

std::vector<int64_t> packed_lengths(const Batch& b, int64_t ignore_index) {
  std::vector<int64_t> n = loss_lengths(b, ignore_index);
  int64_t rows = 0;
  for (int64_t len : n) rows += len;
  if (rows == 0 || rows == b.batch * b.seq) n.clear();
  return n;
}

std::vector<int64_t> tail_lengths(const Batch& b, int64_t ignore_index, const std::vector<int64_t>& packed) {
  HR_CHECK(packed.empty() || int64_t(packed.size()) == b.batch, "[llava] ", packed.size(), " packed lengths for ",
           b.batch, " rows");
  std::vector<int64_t> tails;
  int64_t rows = 0, kept = 0;
  for (int64_t r = 0; r < b.batch; ++r) {
    const int64_t n = packed.empty() ? b.seq : packed[std::size_t(r)];
    if (n == 0) continue;  // a row without labels packs nothing
    int64_t first = 0;     // the first position whose next token has a label
    while (first + 1 < n && b.labels[std::size_t(r * b.seq + first + 1)] == ignore_index) ++first;
    if (first + 1 == n) return {};  // no labels at all: nothing packs, and no row is read
    tails.push_back(n - first);
    kept += n - first;
    rows += n;
  }
  if (2 * kept > rows) tails.clear();
  return tails;
}

namespace {
int64_t packed_rows(const LlavaState& st) {
  return st.llm_rows.empty() ? 0 : st.llm_rows.back().to + st.llm_rows.back().count;
}

// The rows of the LLM's output: the batch's, the packed ones, or the last layer's tails.
int64_t hidden_rows(const LlavaState& st) {
  if (!st.tails.empty()) return std::accumulate(st.tails.begin(), st.tails.end(), int64_t(0));
  return st.packed.empty() ? st.batch * st.seq : packed_rows(st);
}

// The labelled positions' runs, from the (B * L) batch's rows to the LLM output's: the packed rows, then the last
// layer's tails (each run lies in one sequence's tail: the loss reads nothing before it).
void remap_label_runs(LlavaState& st) {
  const int64_t L = st.seq;
  if (!st.packed.empty()) {
    std::vector<int64_t> row_at(std::size_t(st.batch), 0);
    for (const RowRun& r : st.llm_rows) row_at[std::size_t(r.from / L)] = r.to;
    for (RowRun& r : st.label_runs) r.from = row_at[std::size_t(r.from / L)] + r.from % L;
  }
  if (st.tails.empty()) return;
  // The sequences' tail rows and where they go, in order; the label runs are in order too.
  const std::vector<RowRun> tails =
      tail_runs(st.packed.empty() ? std::vector<int64_t>(std::size_t(st.batch), L) : st.packed, st.tails);
  std::size_t s = 0;
  for (RowRun& r : st.label_runs) {
    while (s + 1 < tails.size() && tails[s].from + tails[s].count <= r.from) ++s;
    HR_CHECK(r.from >= tails[s].from && r.from + r.count <= tails[s].from + tails[s].count, "[llava] labelled rows ",
             r.from, "..", r.from + r.count, " are outside their sequence's last layer rows");
    r.from = tails[s].to + r.from - tails[s].from;
  }
}
}  // namespace

int64_t Llava::pack_llm_rows(const Batch& b, LlavaState& st, const ModelOptions& opt) const {
  const int64_t B = b.batch, L = b.seq;
  st.llm_rows.clear();
  st.packed.clear();
  st.tails.clear();
  const bool logits = opt.return_logits || opt.logits_to_keep >= 0 || !opt.logits_at.empty();
  if (!opt.padding_free || opt.inference || logits) return B * L;
  const std::vector<int64_t> n = packed_lengths(b, cfg_.ignore_index);
  st.tails = tail_lengths(b, cfg_.ignore_index, n);
  if (n.empty()) return B * L;
  for (int64_t r = 0; r < B; ++r) {
    const int64_t len = n[std::size_t(r)];
    if (len == 0) continue;
    st.llm_rows.push_back({r * L, packed_rows(st), len});
    st.packed.push_back(len);
  }
  return packed_rows(st);
}

Tensor Llava::embed_inputs(const Batch& b, LlavaState& st, const ModelOptions& opt) const {
  const Device dev = store_->device();
  const int64_t B = b.batch, L = b.seq, C = cfg_.llm.hidden, T = cfg_.vision.tokens_per_image();
  HR_CHECK(B > 0 && L > 0, "[llava] a batch needs at least one sequence of at least 1 token; got ", B, " x ", L);
  HR_CHECK(int64_t(b.input_ids.size()) == B * L && int64_t(b.labels.size()) == B * L, "[llava] batch of ", B, " x ", L,
           " needs ", B * L, " input_ids and labels; got ", b.input_ids.size(), " and ", b.labels.size());
  st = LlavaState{};
  st.batch = B;
  st.seq = L;
  const int64_t crops = b.pixel_values.defined() ? b.pixel_values.size(0) : 0;
  if (cfg_.anyres.on()) {
    ImagesMix m = anyres_images(b.image_sizes, cfg_.anyres, cfg_.vision.image_size, cfg_.vision.grid());
    HR_CHECK(m.total_crops == crops, "[llava] the batch's ", b.image_sizes.size(), " image_sizes make ", m.total_crops,
             " AnyRes crops but pixel_values has ", crops);
    st.image_tokens = std::move(m.tokens);
    st.mix = std::move(m.mix);
    st.crop_rows = crops * T;
  } else {
    HR_CHECK(b.image_sizes.empty(),
             "[llava] the batch has image_sizes (AnyRes images) but the model has no "
             "model.image_grid_pinpoints");
    st.image_tokens.assign(std::size_t(crops), T);
  }
  st.image_offsets = find_images(b, cfg_.image_token_id, st.image_tokens);
  st.has_images = !st.image_tokens.empty();
  {
    MemoryScope scope(Category::IO, "batch");
    st.ids = Tensor::from_ints(b.input_ids, {B, L}, DType::I64, dev);
  }
  Tensor embeds = llm_->embed(st.ids);
  if (st.has_images) {
    const Tensor tokens = project_images(b.pixel_values, st, opt);
    Tensor flat = embeds.view({B * L, C});
    int64_t at = 0;
    for (std::size_t i = 0; i < st.image_offsets.size(); ++i) {
      const int64_t n = st.image_tokens[i];
      copy_(flat.slice(0, st.image_offsets[i], st.image_offsets[i] + n), tokens.slice(0, at, at + n));
      at += n;
    }
  }
  return embeds;
}

Tensor Llava::project_images(const Tensor& pixel_values, LlavaState& st, const ModelOptions& opt) const {
  const bool inference = opt.inference;
  const Tensor pixels = pixels_on(pixel_values, store_->device());
  Tensor feats = vision_->forward(pixels, st.vision, opt.vision_policy,
                                  inference || !vision_trainable_ ? Saving::Nothing : Saving::ForBackward);
  const DType llm_dtype = store_->dtype();
  if (feats.dtype() != llm_dtype) {  // a vision tower kept in f32 feeds a low-precision projector
    MemoryScope scope(Category::Activations, "multi_modal_projector");
    feats = cast(feats, llm_dtype);
  }
  hook_before(hooks_, projector_group_, Pass::Forward);
  Tensor proj = projector_->forward(
      feats, st.projector,
      inference || !(projector_trainable_ || vision_trainable_) ? Saving::Nothing : Saving::ForBackward);
  feats = Tensor();
  if (cfg_.anyres.on())  // image_newline is the projector group's: mixed while ZeRO-3 holds it
    proj = mix_image_tokens(proj, st);
  else
    proj = proj.view({proj.size(0) * proj.size(1), proj.size(2)});
  watch_output(watch_, projector_group_, Pass::Forward, proj);
  hook_after(hooks_, projector_group_, Pass::Forward);
  return proj;
}

namespace {
// A mix's index and weight tensors on `dev`.
struct MixTensors {
  Tensor begin, row, weight;
};
MixTensors upload(const HostMix& m, Device dev) {
  MemoryScope scope(Category::IO, "batch");
  return {Tensor::from_ints(m.begin, {int64_t(m.begin.size())}, DType::I64, dev),
          Tensor::from_ints(m.row, {int64_t(m.row.size())}, DType::I64, dev),
          Tensor::from_floats(m.weight, {int64_t(m.weight.size())}, DType::F32, dev)};
}
}  // namespace

Tensor Llava::mix_image_tokens(const Tensor& proj, const LlavaState& st) const {
  const MixTensors m = upload(st.mix, store_->device());
  MemoryScope scope(Category::Activations, kProjectorPrefix);
  const Tensor rows = proj.view({st.crop_rows, cfg_.llm.hidden});
  return mix_rows(rows, image_newline_ ? image_newline_->data : Tensor(), m.begin, m.row, m.weight);
}

Tensor Llava::mix_image_tokens_backward(const Tensor& d_tokens, const LlavaState& st) const {
  const HostMix t = transpose_mix(st.mix.begin, st.mix.row, st.mix.weight, st.crop_rows);
  const MixTensors m = upload(t, store_->device());
  MemoryScope scope(Category::Activations, kProjectorPrefix);
  // (crop rows + 1, C): the last row is image_newline's gradient
  const Tensor d_rows = mix_rows(d_tokens, Tensor(), m.begin, m.row, m.weight);
  if (image_newline_ && image_newline_->trainable)
    sum_leading(d_rows.slice(0, st.crop_rows, st.crop_rows + 1), image_newline_->ensure_grad(), Accumulate::Yes);
  const int64_t T = cfg_.vision.tokens_per_image();
  return d_rows.slice(0, 0, st.crop_rows).view({st.crop_rows / T, T, cfg_.llm.hidden});
}

float Llava::forward(const Batch& b, LlavaState& st, const ModelOptions& opt) const {
  const Device dev = store_->device();
  const int64_t B = b.batch, L = b.seq, C = cfg_.llm.hidden;
  HR_CHECK(B > 0 && L > 1, "[llava] a batch needs at least one sequence of at least 2 tokens; got ", B, " x ", L);
  Tensor embeds = embed_inputs(b, st, opt);
  const bool need_llm_grad = !opt.inference && (llm_trainable_ || llm_adapters_ ||
                                                (st.has_images && (projector_trainable_ || vision_trainable_)));
  // LoRA dropout draws its masks from a key per training pass (the backward draws them again).
  std::optional<LoraDropoutScope> lora_dropout;
  if (need_llm_grad && cfg_.llm.lora.dropout > 0.f) lora_dropout.emplace(st.lora_key = ++lora_passes_);
  const int64_t rows = pack_llm_rows(b, st, opt);
  if (!st.packed.empty()) {
    MemoryScope scope(Category::Activations, str(kLlmPrefix, ".padding_free"));
    embeds = pack_rows(embeds.view({B * L, C}), st.llm_rows, rows).view({1, rows, C});
  }
  Tensor hidden = llm_->forward(embeds, st.llm, opt.llm_policy, need_llm_grad ? Saving::ForBackward : Saving::Nothing,
                                st.packed, st.tails);
  embeds = Tensor();
  MemoryScope scope(Category::Activations, "language_model.loss");
  hook_before(hooks_, head_group_, Pass::Forward);
  keep_logits(hidden, b, st, opt);
  st.labels_shift = shift_labels(b, cfg_, dev, st.label_runs, st.valid_labels);
  remap_label_runs(st);
  st.hidden_shift = pack_rows(hidden.view({hidden_rows(st), C}), st.label_runs, B * (L - 1));
  hidden = Tensor();
  st.ce_options.ignore_index = cfg_.ignore_index;
  st.ce_options.normalizer = float(std::max<int64_t>(st.valid_labels, 1));
  st.ce_options.chunk_rows = opt.ce_chunk_rows;
  st.ce_options.labelled_rows = st.valid_labels;
  st.ce_options.labels = LabelCheck::Done;
  st.backward_ready = need_llm_grad;
  return head_loss(st, opt);
}

void Llava::keep_logits(const Tensor& hidden, const Batch& b, LlavaState& st, const ModelOptions& opt) const {
  const int64_t B = b.batch, L = b.seq, C = cfg_.llm.hidden;
  HR_CHECK(opt.logits_to_keep >= -1, "[llava.forward] logits_to_keep must be -1 (none), 0 (all) or a count; got ",
           opt.logits_to_keep);
  if (opt.return_logits || opt.logits_to_keep == 0) st.logits = llm_->lm_head().forward(hidden);
  const std::vector<int64_t> rows = logit_rows(opt, B, L);
  if (!rows.empty()) st.logits = head_rows(hidden.view({B * L, C}), rows);
}

float Llava::head_loss(LlavaState& st, const ModelOptions& opt) const {
  if (opt.inference && st.valid_labels == 0) {  // generation: only the logits are wanted
    st.hidden_shift = Tensor();
    hook_after(hooks_, head_group_, Pass::Forward);
    hook_end_pass(hooks_, Pass::Forward);
    return 0.f;
  }
  st.ce = cross_entropy_forward(st.hidden_shift, llm_->lm_head().weight->data, st.labels_shift, st.ce_options);
  hook_after(hooks_, head_group_, Pass::Forward);
  hook_end_pass(hooks_, Pass::Forward);
  if (opt.inference) st.hidden_shift = Tensor();
  return store_->device().type == DeviceType::Meta ? 0.f : st.ce.loss.item();
}

void Llava::backward(LlavaState& st, float loss_scale) const {
  if (!st.backward_ready) {  // frozen LLM and no images: nothing to do here, but other ranks may backpropagate
    hook_end_pass(hooks_, Pass::Backward);
    return;
  }
  const Device dev = store_->device();
  const int64_t B = st.batch, L = st.seq, C = cfg_.llm.hidden, T = cfg_.vision.tokens_per_image();
  std::optional<LoraDropoutScope> lora_dropout;
  if (st.lora_key) lora_dropout.emplace(st.lora_key);
  Tensor d_hidden;
  {
    MemoryScope scope(Category::Activations, "language_model.loss");
    hook_before(hooks_, head_group_, Pass::Backward);
    Tensor dloss = Tensor::full({}, loss_scale, DType::F32, dev);
    const Linear& head = llm_->lm_head();
    CrossEntropyBackwardOptions bo;
    bo.weight_grads = head.weight->trainable;
    if (bo.weight_grads) {
      bo.accumulate = Accumulate::Yes;
      bo.dweight_into = head.weight->ensure_grad();
    }
    CrossEntropyGrads g =
        cross_entropy_backward(dloss, st.hidden_shift, head.weight->data, st.labels_shift, st.ce, st.ce_options, bo);
    st.hidden_shift = st.labels_shift = Tensor();
    st.ce = {};
    watch_output(watch_, head_group_, Pass::Backward, g.dhidden);
    hook_after(hooks_, head_group_, Pass::Backward);
    d_hidden = unpack_rows(g.dhidden, st.label_runs,
                           st.packed.empty() && st.tails.empty() ? Shape{B, L, C} : Shape{1, hidden_rows(st), C});
  }
  Tensor d_embeds = llm_->backward(d_hidden, st.llm);
  d_hidden = Tensor();
  if (!st.packed.empty()) {  // the dropped positions' gradient is zero
    MemoryScope scope(Category::Activations, str(kLlmPrefix, ".padding_free"));
    d_embeds = unpack_rows(d_embeds.view({d_embeds.size(1), C}), st.llm_rows, {B, L, C});
  }
  Tensor d_tokens;  // the images' tokens' gradient, (sum of st.image_tokens, C)
  if (st.has_images && (projector_trainable_ || vision_trainable_)) d_tokens = image_token_grads(d_embeds, st);
  if (llm_trainable_) {
    // Image positions took their embeddings from the projector, not the table.
    Tensor flat = d_embeds.view({B * L, C});
    for (std::size_t i = 0; i < st.image_offsets.size(); ++i)
      fill_(flat.slice(0, st.image_offsets[i], st.image_offsets[i] + st.image_tokens[i]), 0.f);
    llm_->embed_backward(st.ids, d_embeds);
  }
  d_embeds = Tensor();
  if (d_tokens.defined()) {
    hook_before(hooks_, projector_group_, Pass::Backward);
    Tensor d_proj = cfg_.anyres.on() ? mix_image_tokens_backward(d_tokens, st)
                                     : d_tokens.view({int64_t(st.image_tokens.size()), T, C});
    d_tokens = Tensor();
    Tensor d_feats =
        projector_->backward(d_proj, st.projector, vision_trainable_ ? InputGrad::Compute : InputGrad::Skip);
    watch_output(watch_, projector_group_, Pass::Backward, d_feats);
    hook_after(hooks_, projector_group_, Pass::Backward);
    d_proj = Tensor();
    if (vision_trainable_) {
      const DType vision_dtype = store_->dtype_of(GroupKind::EncoderLayer);
      if (d_feats.dtype() != vision_dtype) d_feats = cast(d_feats, vision_dtype);
      vision_->backward(d_feats, st.vision);
    }
  }
  hook_end_pass(hooks_, Pass::Backward);
  st.llm = {};
  st.vision = {};
}

Tensor Llava::image_token_grads(const Tensor& d_embeds, const LlavaState& st) const {
  const int64_t C = cfg_.llm.hidden;
  MemoryScope scope(Category::Activations, kProjectorPrefix);
  int64_t total = 0;
  for (int64_t n : st.image_tokens) total += n;
  Tensor d_tokens = Tensor::empty({total, C}, d_embeds.dtype(), store_->device());
  const Tensor flat = d_embeds.view({st.batch * st.seq, C});
  int64_t at = 0;
  for (std::size_t i = 0; i < st.image_offsets.size(); ++i) {
    const int64_t n = st.image_tokens[i];
    copy_(d_tokens.slice(0, at, at + n), flat.slice(0, st.image_offsets[i], st.image_offsets[i] + n));
    at += n;
  }
  return d_tokens;
}

Tensor Llava::head_rows(const Tensor& hidden, const std::vector<int64_t>& rows) const {
  Tensor at;
  {
    MemoryScope io(Category::IO, "batch");
    at = Tensor::from_ints(rows, {int64_t(rows.size())}, DType::I64, hidden.device());
  }
  // The rows wanted, gathered as an embedding lookup in the hidden states.
  return llm_->lm_head().forward(embedding_forward(at, hidden));
}

KvCache Llava::make_cache(int64_t batch, int64_t capacity) const {
  return make_kv_cache(cfg_.llm, kLlmPrefix, batch, capacity, store_->dtype(), store_->device());
}

Tensor Llava::prefill(const Batch& b, const std::vector<int64_t>& lengths, KvCache& cache) const {
  const int64_t B = b.batch, L = b.seq, C = cfg_.llm.hidden;
  HR_CHECK(int64_t(lengths.size()) == B && cache.batch() == B, "[llava.prefill] ", B, " prompts need ", B,
           " lengths and a cache of ", B, " rows; got ", lengths.size(), " and ", cache.batch());
  for (int64_t r = 0; r < B; ++r) {
    HR_CHECK(lengths[std::size_t(r)] >= 1 && lengths[std::size_t(r)] <= L, "[llava.prefill] prompt ", r, " has length ",
             lengths[std::size_t(r)], " in a batch of ", L, " positions");
    HR_CHECK(cache.length[std::size_t(r)] == 0, "[llava.prefill] the cache's row ", r, " is not empty");
  }
  LlavaState st;
  ModelOptions opt;
  opt.inference = true;
  Tensor embeds = embed_inputs(b, st, opt);
  st = LlavaState{};
  Tensor hidden = llm_->forward_cached(embeds, cache);
  embeds = Tensor();
  cache.length = lengths;  // a shorter prompt's padding is overwritten by its first generated token
  MemoryScope scope(Category::Activations, "language_model.loss");
  hook_before(hooks_, head_group_, Pass::Forward);
  std::vector<int64_t> rows(static_cast<std::size_t>(B));
  for (int64_t r = 0; r < B; ++r) rows[std::size_t(r)] = r * L + lengths[std::size_t(r)] - 1;
  Tensor logits = head_rows(hidden.view({B * L, C}), rows);
  hook_after(hooks_, head_group_, Pass::Forward);
  hook_end_pass(hooks_, Pass::Forward);
  return logits;
}

Tensor Llava::decode(const std::vector<int64_t>& tokens, KvCache& cache) const {
  const int64_t B = cache.batch(), C = cfg_.llm.hidden;
  HR_CHECK(int64_t(tokens.size()) == B, "[llava.decode] a cache of ", B, " rows needs ", B, " tokens; got ",
           tokens.size());
  Tensor ids;
  {
    MemoryScope scope(Category::IO, "batch");
    ids = Tensor::from_ints(tokens, {B, 1}, DType::I64, store_->device());
  }
  Tensor hidden = llm_->forward_cached(llm_->embed(ids), cache);
  MemoryScope scope(Category::Activations, "language_model.loss");
  hook_before(hooks_, head_group_, Pass::Forward);
  Tensor logits = llm_->lm_head().forward(hidden.view({B, C}));
  hook_after(hooks_, head_group_, Pass::Forward);
  hook_end_pass(hooks_, Pass::Forward);
  return logits;
}

}  // namespace hr::models
