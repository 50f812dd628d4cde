// LLaVA forward and backward: splice image features into token embeddings, shifted chunked loss.
#include "models/llava.h"

#include "core/memory/category.h"
#include "core/ops/copy.h"
#include "core/ops/embedding.h"
#include "core/ops/linear.h"

namespace hr::models {

using namespace hr::core;

namespace {
constexpr const char* kVisionPrefix = "vision_tower.vision_model";
constexpr const char* kProjectorPrefix = "multi_modal_projector";
constexpr const char* kLlmPrefix = "language_model.model";
constexpr const char* kHeadName = "language_model.lm_head";
}  // namespace

Llava::Llava(const LlavaConfig& cfg, Device device, DType dtype, std::optional<DType> vision_dtype) : cfg_(cfg) {
  cfg_.validate();
  store_ = std::make_unique<ParamStore>(device, dtype);
  if (vision_dtype) store_->set_dtype_for("vision_tower.", *vision_dtype);
  vision_ = std::make_unique<VisionTower>(*store_, kVisionPrefix, cfg_.vision);
  projector_ = std::make_unique<Projector>(*store_, kProjectorPrefix, cfg_.projector, cfg_.vision.hidden, cfg_.llm.hidden);
  llm_ = std::make_unique<LlamaModel>(*store_, kLlmPrefix, kHeadName, cfg_.llm);
  // Groups: embed_tokens, vision embeddings (+ norms), vision layers, projector, LLM layers, norm, lm_head.
  const int vl = int(cfg_.vision.layers), ll = int(cfg_.llm.layers);
  projector_group_ = 2 + vl;
  head_group_ = projector_group_ + ll + 2;
  groups_.resize(std::size_t(head_group_ + 1));
  groups_[0].name = str(kLlmPrefix, ".embed_tokens");
  groups_[1].name = str(kVisionPrefix, ".embeddings");
  for (int i = 0; i < vl; ++i) groups_[std::size_t(2 + i)].name = str(kVisionPrefix, ".encoder.layers.", i);
  groups_[std::size_t(projector_group_)].name = kProjectorPrefix;
  for (int i = 0; i < ll; ++i) groups_[std::size_t(projector_group_ + 1 + i)].name = str(kLlmPrefix, ".layers.", i);
  groups_[std::size_t(head_group_ - 1)].name = str(kLlmPrefix, ".norm");
  groups_[std::size_t(head_group_)].name = kHeadName;
  auto layer_of = [](const std::string& name, const std::string& prefix) {
    const std::size_t at = prefix.size();
    return int(std::stol(name.substr(at, name.find('.', at) - at)));
  };
  const std::string vis_layers = str(kVisionPrefix, ".encoder.layers."), llm_layers = str(kLlmPrefix, ".layers.");
  for (const auto& p : store_->all()) {
    const std::string& n = p->name;
    int g = -1;
    if (n.rfind(vis_layers, 0) == 0) g = 2 + layer_of(n, vis_layers);
    else if (n.rfind(kVisionPrefix, 0) == 0) g = 1;
    else if (n.rfind(kProjectorPrefix, 0) == 0) g = projector_group_;
    else if (n.rfind(llm_layers, 0) == 0) g = projector_group_ + 1 + layer_of(n, llm_layers);
    else if (n.rfind(str(kLlmPrefix, ".embed_tokens"), 0) == 0) g = 0;
    else if (n.rfind(str(kLlmPrefix, ".norm"), 0) == 0) g = head_group_ - 1;
    else if (n.rfind(kHeadName, 0) == 0) g = head_group_;
    HR_ASSERT(g >= 0, "parameter ", n, " belongs to no group");
    groups_[std::size_t(g)].params.push_back(p.get());
  }
}

void Llava::skip_groups(int first, int last, Pass pass) const {
  if (!hooks_) return;
  for (int g = first; first <= last ? g <= last : g >= last; g += first <= last ? 1 : -1) {
    hooks_->before(g, pass);
    hooks_->after(g, pass);
  }
}

void Llava::skip_vision_and_projector(Pass pass) const {
  const int used = int(cfg_.vision.layers_used());
  if (pass == Pass::Forward) return skip_groups(1, 1 + used, pass), skip_groups(projector_group_, projector_group_, pass);
  if (!(projector_trainable_ || vision_trainable_)) return;
  skip_groups(projector_group_, projector_group_, pass);
  if (vision_trainable_) skip_groups(1 + used, 1, pass);
}

void Llava::set_hooks(GroupHooks* hooks) {
  hooks_ = hooks;
  vision_->set_hooks(hooks, 1);
  llm_->set_hooks(hooks, 0, projector_group_ + 1, head_group_ - 1);
}

void Llava::set_trainable(bool vision, bool projector, bool llm) {
  vision_trainable_ = vision;
  projector_trainable_ = projector;
  llm_trainable_ = llm;
  store_->set_trainable("vision_tower.", vision);
  store_->set_trainable("multi_modal_projector.", projector);
  store_->set_trainable("language_model.", llm);
}

float Llava::forward(const Batch& b, LlavaState& st, const ModelOptions& opt) const {
  const Device dev = store_->device();
  const int64_t B = b.batch, L = b.seq, C = cfg_.llm.hidden, T = cfg_.vision.tokens_per_image();
  HR_CHECK(B > 0 && L > 1, "[llava] a batch needs at least one sequence of at least 2 tokens; got ", B, " x ", L);
  HR_CHECK(int64_t(b.input_ids.size()) == B * L && int64_t(b.labels.size()) == B * L, "[llava] batch of ", B, " x ", L,
           " needs ", B * L, " input_ids and labels; got ", b.input_ids.size(), " and ", b.labels.size());
  st = LlavaState{};
  st.batch = B;
  st.seq = L;
  // Find each image's run of placeholders.
  for (int64_t r = 0; r < B; ++r) {
    int64_t t = 0;
    while (t < L) {
      if (b.input_ids[r * L + t] != cfg_.image_token_id) {
        ++t;
        continue;
      }
      int64_t end = t;
      while (end < L && b.input_ids[r * L + end] == cfg_.image_token_id) ++end;
      HR_CHECK((end - t) % T == 0, "[llava] sample ", r, " has a run of ", end - t, " image tokens at position ", t,
               "; each image needs exactly ", T, " (tokens_per_image)");
      for (int64_t o = t; o < end; o += T) st.image_offsets.push_back(r * L + o);
      t = end;
    }
  }
  const int64_t images = b.pixel_values.defined() ? b.pixel_values.size(0) : 0;
  HR_CHECK(int64_t(st.image_offsets.size()) == images, "[llava] input_ids hold placeholders for ",
           st.image_offsets.size(), " images but pixel_values has ", images);
  st.has_images = images > 0;
  {
    MemoryScope scope(Category::IO, "batch");
    st.ids = Tensor::from_ints(b.input_ids, {B, L}, DType::I64, dev);
  }
  const bool need_llm_grad =
      !opt.inference && (llm_trainable_ || (st.has_images && (projector_trainable_ || vision_trainable_)));
  Tensor embeds = llm_->embed(st.ids);
  if (st.has_images) {
    Tensor pixels;
    {
      MemoryScope scope(Category::IO, "batch");
      pixels = b.pixel_values.to(dev);
    }
    Tensor feats = vision_->forward(pixels, st.vision, opt.vision_policy, opt.inference || !vision_trainable_);
    const DType llm_dtype = store_->dtype();
    if (feats.dtype() != llm_dtype) {  // a vision tower kept in f32 feeds a low-precision projector
      MemoryScope scope(Category::Activations, "multi_modal_projector");
      feats = cast(feats, llm_dtype);
    }
    hook_before(hooks_, projector_group_, Pass::Forward);
    Tensor proj = projector_->forward(feats, st.projector, opt.inference || !(projector_trainable_ || vision_trainable_));
    hook_after(hooks_, projector_group_, Pass::Forward);
    Tensor flat = embeds.view({B * L, C});
    for (std::size_t i = 0; i < st.image_offsets.size(); ++i)
      copy_(flat.slice(0, st.image_offsets[i], st.image_offsets[i] + T), proj.select(0, int64_t(i)));
  } else {
    skip_vision_and_projector(Pass::Forward);
  }
  Tensor hidden = llm_->forward(embeds, st.llm, opt.llm_policy, !need_llm_grad);
  embeds = Tensor();
  MemoryScope scope(Category::Activations, "language_model.loss");
  hook_before(hooks_, head_group_, Pass::Forward);
  if (opt.return_logits) st.logits = llm_->lm_head().forward(hidden);
  if (!opt.logits_at.empty()) {
    for (int64_t p : opt.logits_at)
      HR_CHECK(p >= 0 && p < B * L, "[llava.forward] logits_at position ", p, " is outside the batch's ", B, " x ", L,
               " tokens");
    Tensor at;
    {
      MemoryScope io(Category::IO, "batch");
      at = Tensor::from_ints(opt.logits_at, {int64_t(opt.logits_at.size())}, DType::I64, dev);
    }
    // The rows wanted, gathered as an embedding lookup in the (B*L, C) hidden states.
    st.logits = llm_->lm_head().forward(embedding_forward(at, hidden.view({B * L, C})));
  }
  std::vector<int64_t> shifted(std::size_t(B * (L - 1)));
  for (int64_t r = 0; r < B; ++r)
    for (int64_t t = 0; t + 1 < L; ++t) {
      const int64_t lab = b.labels[r * L + t + 1];
      shifted[r * (L - 1) + t] = lab;
      if (lab != cfg_.ignore_index) ++st.valid_labels;
    }
  st.labels_shift = Tensor::from_ints(shifted, {B * (L - 1)}, DType::I64, dev);
  st.hidden_shift = slice_copy(hidden, 1, 0, L - 1).view({B * (L - 1), C});
  hidden = Tensor();
  st.ce_options.ignore_index = cfg_.ignore_index;
  st.ce_options.normalizer = float(std::max<int64_t>(st.valid_labels, 1));
  st.ce_options.chunk_rows = opt.ce_chunk_rows;
  st.backward_ready = need_llm_grad;
  if (opt.inference && st.valid_labels == 0) {  // generation: only the logits are wanted
    st.hidden_shift = Tensor();
    hook_after(hooks_, head_group_, Pass::Forward);
    return 0.f;
  }
  st.ce = cross_entropy_forward(st.hidden_shift, llm_->lm_head().weight->data, st.labels_shift, st.ce_options);
  hook_after(hooks_, head_group_, Pass::Forward);
  if (opt.inference) st.hidden_shift = Tensor();
  return dev.type == DeviceType::Meta ? 0.f : st.ce.loss.item();
}

void Llava::backward(LlavaState& st, float loss_scale) const {
  if (!st.backward_ready) {  // frozen LLM and no images: nothing to do here, but other ranks may backpropagate
    skip_groups(head_group_, projector_group_ + 1, Pass::Backward);
    if (llm_trainable_) skip_groups(0, 0, Pass::Backward);
    skip_vision_and_projector(Pass::Backward);
    return;
  }
  const Device dev = store_->device();
  const int64_t B = st.batch, L = st.seq, C = cfg_.llm.hidden, T = cfg_.vision.tokens_per_image();
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
    CrossEntropyGrads g = cross_entropy_backward(dloss, st.hidden_shift, head.weight->data, st.labels_shift, st.ce,
                                                 st.ce_options, bo);
    st.hidden_shift = st.labels_shift = Tensor();
    st.ce = {};
    hook_after(hooks_, head_group_, Pass::Backward);
    d_hidden = slice_backward(g.dhidden.view({B, L - 1, C}), {B, L, C}, 1, 0);
  }
  Tensor d_embeds = llm_->backward(d_hidden, st.llm);
  d_hidden = Tensor();
  Tensor d_proj;
  if (st.has_images && (projector_trainable_ || vision_trainable_)) {
    MemoryScope scope(Category::Activations, "multi_modal_projector");
    const int64_t images = int64_t(st.image_offsets.size());
    d_proj = Tensor::empty({images, T, C}, d_embeds.dtype(), dev);
    Tensor flat = d_embeds.view({B * L, C});
    for (int64_t i = 0; i < images; ++i) copy_(d_proj.select(0, i), flat.slice(0, st.image_offsets[i], st.image_offsets[i] + T));
  }
  if (llm_trainable_) {
    // Image positions took their embeddings from the projector, not the table.
    Tensor flat = d_embeds.view({B * L, C});
    for (int64_t off : st.image_offsets) fill_(flat.slice(0, off, off + T), 0.f);
    llm_->embed_backward(st.ids, d_embeds);
  }
  d_embeds = Tensor();
  if (d_proj.defined()) {
    hook_before(hooks_, projector_group_, Pass::Backward);
    Tensor d_feats = projector_->backward(d_proj, st.projector, vision_trainable_);
    hook_after(hooks_, projector_group_, Pass::Backward);
    d_proj = Tensor();
    if (vision_trainable_) {
      if (d_feats.dtype() != store_->dtype_of("vision_tower.")) d_feats = cast(d_feats, store_->dtype_of("vision_tower."));
      vision_->backward(d_feats, st.vision);
    }
  } else if (!st.has_images) {
    skip_vision_and_projector(Pass::Backward);
  }
  st.llm = {};
  st.vision = {};
}

}  // namespace hr::models
