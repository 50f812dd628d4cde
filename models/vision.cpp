// CLIP vision tower: forward, policy-driven recompute, backward.
#include "models/vision.h"

#include <cmath>

#include "core/memory/category.h"
#include "core/memory/timeline.h"
#include "core/ops/attention.h"
#include "core/ops/copy.h"
#include "core/ops/elementwise.h"
#include "core/ops/embedding.h"
#include "core/ops/reduce.h"

namespace hr::models {

using namespace hr::core;

namespace {
using S = VisionLayerSaved;
constexpr std::array<std::pair<Tensor S::*, Keep>, 15> kFields = {{
    {&S::x, Keep::Input},
    {&S::ln1_mean, Keep::Internal},
    {&S::ln1_rstd, Keep::Internal},
    {&S::xn1, Keep::Internal},
    {&S::q, Keep::Internal},
    {&S::k, Keep::Internal},
    {&S::v, Keep::Internal},
    {&S::attn, Keep::Selective},
    {&S::lse, Keep::Selective},
    {&S::h, Keep::Selective},
    {&S::ln2_mean, Keep::Internal},
    {&S::ln2_rstd, Keep::Internal},
    {&S::xn2, Keep::Internal},
    {&S::fc1, Keep::Internal},
    {&S::act, Keep::Internal},
}};
}  // namespace

VisionLayer::VisionLayer(ParamStore& store, const std::string& prefix, const VisionConfig& cfg)
    : prefix_(prefix), cfg_(cfg), act_(cfg.tower == Tower::Siglip ? UnaryOp::GeluTanh : UnaryOp::QuickGelu) {
  const int64_t c = cfg.hidden;
  k_ = Linear::make(store, prefix + ".self_attn.k_proj", c, c, Bias::Yes);
  v_ = Linear::make(store, prefix + ".self_attn.v_proj", c, c, Bias::Yes);
  q_ = Linear::make(store, prefix + ".self_attn.q_proj", c, c, Bias::Yes);
  o_ = Linear::make(store, prefix + ".self_attn.out_proj", c, c, Bias::Yes);
  ln1_ = LayerNorm::make(store, prefix + ".layer_norm1", c, cfg.layer_norm_eps);
  fc1_ = Linear::make(store, prefix + ".mlp.fc1", c, cfg.intermediate, Bias::Yes);
  fc2_ = Linear::make(store, prefix + ".mlp.fc2", cfg.intermediate, c, Bias::Yes);
  ln2_ = LayerNorm::make(store, prefix + ".layer_norm2", c, cfg.layer_norm_eps);
}

void VisionLayer::compute(S& s) const {
  const int64_t I = s.x.size(0), N = s.x.size(1), H = cfg_.heads, D = cfg_.hidden / cfg_.heads;
  if (!s.xn1.defined()) {
    NormOut n = ln1_.forward(s.x);
    s.xn1 = n.y;
    s.ln1_mean = n.saved.mean;
    s.ln1_rstd = n.saved.rstd;
  }
  if (!s.q.defined() || !s.k.defined() || !s.v.defined()) {
    s.q = q_.forward(s.xn1).view({I, N, H, D});
    s.k = k_.forward(s.xn1).view({I, N, H, D});
    s.v = v_.forward(s.xn1).view({I, N, H, D});
  }
  if (!s.attn.defined()) {
    AttentionOut a = attention_forward(s.q, s.k, s.v, Mask::None, 1.f / std::sqrt(float(D)));
    s.attn = a.out;
    s.lse = a.lse;
  }
  Tensor residual;  // with fused kernels, added by the norm below when both run here
  if (!s.h.defined()) {
    s.h = o_.forward(s.attn.view({I, N, cfg_.hidden}));
    if (cfg_.fused() && !s.xn2.defined())
      residual = s.x;
    else
      add_(s.h, s.x);
  }
  if (!s.xn2.defined()) {
    NormOut n = ln2_.forward(s.h, residual);
    s.xn2 = n.y;
    s.ln2_mean = n.saved.mean;
    s.ln2_rstd = n.saved.rstd;
  }
  if (!s.act.defined()) {
    Linear::Activated a = fc1_.forward_activated(s.xn2, act_, cfg_.fused());
    s.fc1 = a.pre;
    s.act = a.act;
  }
}

Tensor VisionLayer::forward(const Tensor& x, S& s, CheckpointKind kind) const {
  MemoryScope scope(Category::Activations, prefix_);
  s = S{};
  s.x = x;
  compute(s);
  Tensor y = fc2_.forward(s.act);
  add_(y, s.h);
  apply_policy(s, kFields, kind);
  return y;
}

Tensor VisionLayer::backward(const Tensor& dy, S& s) const {
  MemoryScope scope(Category::Activations, prefix_);
  {
    TraceSpan span(TraceSpan::When{!all_kept(s, kFields)}, "recompute", "recompute ", prefix_);
    compute(s);
  }
  const int64_t I = s.x.size(0), N = s.x.size(1), H = cfg_.heads, D = cfg_.hidden / cfg_.heads;
  Tensor d_act = fc2_.backward(dy, s.act);
  s.act = Tensor();
  Tensor d_fc1 = unary_backward(act_, s.fc1, d_act);
  d_act = s.fc1 = Tensor();
  Tensor dxn2 = fc1_.backward(d_fc1, s.xn2);
  d_fc1 = s.xn2 = Tensor();
  Tensor dh = ln2_.backward(dxn2, s.h, {s.ln2_mean, s.ln2_rstd}, cfg_.fused() ? dy : Tensor());
  if (!cfg_.fused()) add_(dh, dy);
  s.h = s.ln2_mean = s.ln2_rstd = Tensor();
  Tensor dattn = o_.backward(dh, s.attn.view({I, N, cfg_.hidden}));
  AttentionGrads ag = attention_backward(dattn.view({I, N, H, D}), s.q, s.k, s.v, {s.attn, s.lse}, Mask::None,
                                         1.f / std::sqrt(float(D)));
  dattn = Tensor();
  s.q = s.k = s.v = s.attn = s.lse = Tensor();
  Tensor dxn1 = q_.backward(ag.dq.view({I, N, cfg_.hidden}), s.xn1);
  add_(dxn1, k_.backward(ag.dk.view({I, N, cfg_.hidden}), s.xn1));
  add_(dxn1, v_.backward(ag.dv.view({I, N, cfg_.hidden}), s.xn1));
  ag = {};
  s.xn1 = Tensor();
  Tensor dx = ln1_.backward(dxn1, s.x, {s.ln1_mean, s.ln1_rstd}, cfg_.fused() ? dh : Tensor());
  if (!cfg_.fused()) add_(dx, dh);
  s = S{};
  return dx;
}

VisionTower::VisionTower(ParamStore& store, const std::string& prefix, const VisionConfig& cfg, int stem)
    : group_(stem), prefix_(prefix), cfg_(cfg) {
  const int64_t c = cfg.hidden, p = cfg.patch;
  {
    ParamStore::GroupScope in(store, stem);
    if (cfg.class_token()) class_embedding_ = &store.add(prefix + ".embeddings.class_embedding", {c});
    patch_embedding_ = &store.add(prefix + ".embeddings.patch_embedding.weight", {c, cfg.channels, p, p});
    if (cfg.tower == Tower::Siglip)
      patch_linear_.bias = &store.add(prefix + ".embeddings.patch_embedding.bias", {c}, ParamRole::Bias);
    position_embedding_ = &store.add(prefix + ".embeddings.position_embedding.weight", {cfg.num_positions(), c});
    if (cfg.tower == Tower::Clip) pre_ln_ = LayerNorm::make(store, prefix + ".pre_layrnorm", c, cfg.layer_norm_eps);
  }
  for (int64_t i = 0; i < cfg.layers; ++i) {
    ParamStore::GroupScope in(store, stem + 1 + int(i));
    layers_.emplace_back(store, str(prefix, ".encoder.layers.", i), cfg);
  }
  ParamStore::GroupScope in(store, stem);
  post_ln_ = LayerNorm::make(store, prefix + ".post_layernorm", c, cfg.layer_norm_eps);
  patch_linear_.weight = patch_embedding_;
}

bool VisionTower::trainable() const {
  return patch_embedding_->trainable;
}

// pixels (I, 3, S, S) -> the encoder's input (I, N, C): patches through the patch embedding, CLIP's class token in
// front, position embeddings added, CLIP's pre_layrnorm.
Tensor VisionTower::embed(const Tensor& pixels, VisionSaved& saved, Saving saving) const {
  const int64_t I = pixels.size(0), N = cfg_.num_positions(), C = cfg_.hidden, used = cfg_.grid() * cfg_.patch;
  Tensor x;
  {
    MemoryScope scope(Category::Activations, prefix_ + ".embeddings");
    Tensor typed = pixels.to(patch_embedding_->data.dtype());
    if (used < cfg_.image_size)  // SigLIP's "valid" conv: the pixels past the last whole patch are never read
      typed = slice_copy(slice_copy(typed, 2, 0, used), 3, 0, used);
    Tensor patches = patchify(typed, cfg_.patch);
    typed = Tensor();
    Tensor pe = patch_linear_.forward(patches);  // (I, P, C)
    if (saving == Saving::ForBackward) saved.patches = patches;
    if (!cfg_.class_token()) {
      add_(pe, position_embedding_->data);
      return pe;
    }
    x = Tensor::empty({I, N, C}, pe.dtype(), pe.device());
    copy_(x.slice(1, 0, 1), class_embedding_->data.view({1, 1, C}).expand({I, 1, C}));
    copy_(x.slice(1, 1, N), pe);
    add_(x, position_embedding_->data);
  }
  MemoryScope scope(Category::Activations, prefix_ + ".pre_layrnorm");
  NormOut n = pre_ln_.forward(x);
  if (saving == Saving::ForBackward) {
    saved.pre_in = x;
    saved.pre_mean = n.saved.mean;
    saved.pre_rstd = n.saved.rstd;
  }
  return n.y;
}

Tensor VisionTower::forward(const Tensor& pixels, VisionSaved& saved, const CheckpointPolicy& policy,
                            Saving saving) const {
  HR_CHECK(pixels.dim() == 4 && pixels.size(1) == cfg_.channels && pixels.size(2) == cfg_.image_size &&
               pixels.size(3) == cfg_.image_size,
           "[vision] pixel_values must be (images, ", cfg_.channels, ", ", cfg_.image_size, ", ", cfg_.image_size,
           "); got ", pixels.describe());
  saved = VisionSaved{};
  hook_before(hooks_, group_, Pass::Forward);
  Tensor h = embed(pixels, saved, saving);
  watch_output(watch_, group_, Pass::Forward, h);
  hook_after(hooks_, group_, Pass::Forward);
  const int64_t used = cfg_.layers_used();
  saved.layers.resize(std::size_t(used));
  if (saving == Saving::ForBackward && policy.offload) saved.offload = std::make_unique<ActivationOffload>();
  for (int64_t i = 0; i < used; ++i) {
    hook_before(hooks_, group_ + 1 + int(i), Pass::Forward);
    h = layers_[i].forward(h, saved.layers[i], policy.for_block(i));
    watch_output(watch_, group_ + 1 + int(i), Pass::Forward, h);
    if (saved.offload && offloads(policy, i, used))
      saved.offload->send(std::size_t(i), kept_fields(saved.layers[std::size_t(i)], kFields), layers_[i].name());
    hook_after(hooks_, group_ + 1 + int(i), Pass::Forward);
    if (saving == Saving::Nothing) saved.layers[i] = {};
  }
  if (saved.offload) saved.offload->sent_all();
  if (cfg_.select_feature == FeatureSelect::ClsPatch) return h;
  MemoryScope scope(Category::Activations, prefix_ + ".select_feature");
  return slice_copy(h, 1, 1, cfg_.num_positions());
}

void VisionTower::backward(const Tensor& d_features, VisionSaved& saved) const {
  const int64_t I = d_features.size(0);
  Tensor dh;
  {
    MemoryScope scope(Category::Activations, prefix_ + ".select_feature");
    dh = cfg_.select_feature == FeatureSelect::ClsPatch
             ? d_features
             : slice_backward(d_features, {I, cfg_.num_positions(), cfg_.hidden}, 1, 1);
  }
  for (std::size_t i = saved.layers.size(); i-- > 0;) {
    if (saved.offload) saved.offload->before_backward(i, layers_[i].name(), i > 0 ? &layers_[i - 1].name() : nullptr);
    hook_before(hooks_, group_ + 1 + int(i), Pass::Backward);
    dh = layers_[i].backward(dh, saved.layers[i]);
    watch_output(watch_, group_ + 1 + int(i), Pass::Backward, dh);
    hook_after(hooks_, group_ + 1 + int(i), Pass::Backward);
  }
  hook_before(hooks_, group_, Pass::Backward);
  MemoryScope scope(Category::Activations, prefix_ + ".embeddings");
  Tensor dx = embed_backward(dh, saved);
  dh = Tensor();
  watch_output(watch_, group_, Pass::Backward, dx);
  const int64_t N = cfg_.num_positions(), C = cfg_.hidden;
  if (position_embedding_->trainable)
    sum_leading(dx.view({I, N * C}), position_embedding_->ensure_grad().view({N * C}), Accumulate::Yes);
  if (class_embedding_ && class_embedding_->trainable)
    sum_leading(dx.select(1, 0), class_embedding_->ensure_grad(), Accumulate::Yes);
  patch_linear_.backward(cfg_.class_token() ? slice_copy(dx, 1, 1, N) : dx, saved.patches, InputGrad::Skip);
  saved = VisionSaved{};
  hook_after(hooks_, group_, Pass::Backward);
}

// d(encoder input) -> d(embeddings): through CLIP's pre_layrnorm; SigLIP has none.
Tensor VisionTower::embed_backward(const Tensor& dh, VisionSaved& saved) const {
  if (!cfg_.class_token()) return dh;
  Tensor dx = pre_ln_.backward(dh, saved.pre_in, {saved.pre_mean, saved.pre_rstd});
  saved.pre_in = saved.pre_mean = saved.pre_rstd = Tensor();
  return dx;
}

}  // namespace hr::models
