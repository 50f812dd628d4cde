// LLaMA decoder blocks: forward, policy-driven recompute, backward.
#include "models/llama.h"

#include <cmath>

#include "core/memory/category.h"
#include "core/memory/timeline.h"
#include "core/ops/attention.h"
#include "core/ops/copy.h"
#include "core/ops/elementwise.h"
#include "core/ops/embedding.h"
#include "core/ops/softmax.h"

namespace hr::models {

using namespace hr::core;

namespace {
using S = LlamaLayerSaved;
constexpr std::array<std::pair<Tensor S::*, Keep>, 14> kFields = {{
    {&S::x, Keep::Input},
    {&S::rms1, Keep::Internal},
    {&S::xn1, Keep::Internal},
    {&S::q, Keep::Internal},
    {&S::k, Keep::Internal},
    {&S::v, Keep::Internal},
    {&S::attn, Keep::Selective},
    {&S::lse, Keep::Selective},
    {&S::h, Keep::Selective},
    {&S::rms2, Keep::Internal},
    {&S::xn2, Keep::Internal},
    {&S::gate, Keep::Internal},
    {&S::up, Keep::Internal},
    {&S::act, Keep::Internal},
}};
}  // namespace

LlamaLayer::LlamaLayer(ParamStore& store, const std::string& prefix, const LlmConfig& cfg, int64_t window)
    : prefix_(prefix), cfg_(cfg), window_(window) {
  const int64_t c = cfg.hidden, kv = cfg.kv_heads * cfg.head_dim(), i = cfg.intermediate;
  input_norm_ = RMSNorm::make(store, prefix + ".input_layernorm", c, cfg.rms_norm_eps);
  const LoraSpec* lora = &cfg.lora;
  const Bias qkv = cfg.qkv_bias() ? Bias::Yes : Bias::No;
  q_ = Linear::make(store, prefix + ".self_attn.q_proj", c, c, qkv, lora);
  k_ = Linear::make(store, prefix + ".self_attn.k_proj", c, kv, qkv, lora);
  v_ = Linear::make(store, prefix + ".self_attn.v_proj", c, kv, qkv, lora);
  o_ = Linear::make(store, prefix + ".self_attn.o_proj", c, c, Bias::No, lora);
  post_norm_ = RMSNorm::make(store, prefix + ".post_attention_layernorm", c, cfg.rms_norm_eps);
  gate_ = Linear::make(store, prefix + ".mlp.gate_proj", c, i, Bias::No, lora);
  up_ = Linear::make(store, prefix + ".mlp.up_proj", c, i, Bias::No, lora);
  down_ = Linear::make(store, prefix + ".mlp.down_proj", i, c, Bias::No, lora);
}

namespace {
// A layer's rows as one (1, B*L, ...) sequence of rows, as a tail layer's packed attention takes its keys.
Tensor as_rows(const Tensor& t) {
  return t.view({1, t.size(0) * t.size(1), t.size(2), t.size(3)});
}
}  // namespace

void LlamaLayer::compute(S& s, const TokenLayout& at) const {
  const int64_t B = s.x.size(0), L = s.x.size(1), D = cfg_.head_dim();
  // A tail layer's queries and everything after them: its rows of each sequence's end, (1, T, ...).
  const bool tail = !at.tails.empty();
  const int64_t Bq = tail ? 1 : B, Lq = tail ? at.tail_total() : L;
  auto tail_rows_of = [&](const Tensor& t) { return pack_rows(t.view({B * L, cfg_.hidden}), at.tail_rows, Lq); };
  if (!s.xn1.defined()) {
    NormOut n = input_norm_.forward(s.x);
    s.xn1 = n.y;
    s.rms1 = n.saved.rstd;
  }
  if (!s.q.defined() || !s.k.defined() || !s.v.defined()) {
    const Tensor xq = tail ? tail_rows_of(s.xn1) : s.xn1;
    s.q = (tail ? at.tail_rot : at.rot).rotate(q_.forward(xq).view({Bq, Lq, cfg_.heads, D}));
    s.k = at.rot.rotate(k_.forward(s.xn1).view({B, L, cfg_.kv_heads, D}));
    s.v = v_.forward(s.xn1).view({B, L, cfg_.kv_heads, D});
  }
  if (!s.attn.defined()) {
    const float scale = 1.f / std::sqrt(float(D));
    AttentionOut a = tail ? attention_forward_packed(s.q, as_rows(s.k), as_rows(s.v), at.sequences, Mask::Causal, scale,
                                                     window_, at.tails)
                     : at.packed.empty()
                         ? attention_forward(s.q, s.k, s.v, Mask::Causal, scale, window_)
                         : attention_forward_packed(s.q, s.k, s.v, at.packed, Mask::Causal, scale, window_);
    s.attn = a.out;
    s.lse = a.lse;
  }
  Tensor residual;  // with fused kernels, added by the norm below when both run here
  if (!s.h.defined()) {
    s.h = o_.forward(s.attn.view({Bq, Lq, cfg_.hidden}));
    const Tensor x = tail ? tail_rows_of(s.x).view({Bq, Lq, cfg_.hidden}) : s.x;
    if (cfg_.fused() && !s.xn2.defined())
      residual = x;
    else
      add_(s.h, x);
  }
  if (!s.xn2.defined()) {
    NormOut n = post_norm_.forward(s.h, residual);
    s.xn2 = n.y;
    s.rms2 = n.saved.rstd;
  }
  if (!s.act.defined()) {
    s.gate = gate_.forward(s.xn2);
    s.up = up_.forward(s.xn2);
    s.act = swiglu_forward(s.gate, s.up);
  }
}

Tensor LlamaLayer::forward(const Tensor& x, const TokenLayout& at, S& s, CheckpointKind kind) const {
  MemoryScope scope(Category::Activations, prefix_);
  s = S{};
  s.x = x;
  compute(s, at);
  Tensor y = down_.forward(s.act);
  add_(y, s.h);
  apply_policy(s, kFields, kind);
  return y;
}

Tensor LlamaLayer::backward(const Tensor& dy, const TokenLayout& at, S& s) const {
  MemoryScope scope(Category::Activations, prefix_);
  {
    TraceSpan span(TraceSpan::When{!all_kept(s, kFields)}, "recompute", "recompute ", prefix_);
    compute(s, at);
  }
  const int64_t B = s.x.size(0), L = s.x.size(1), D = cfg_.head_dim();
  const bool tail = !at.tails.empty();
  const int64_t Bq = tail ? 1 : B, Lq = tail ? at.tail_total() : L;
  // A tail layer's residual gradient (dh) reaches only its rows of the input: added there after the norm's backward.
  const bool fused_residual = cfg_.fused() && !tail;
  // MLP: y = h + down(silu(gate) * up)
  Tensor d_act = down_.backward(dy, s.act);
  s.act = Tensor();
  SwigluGrads sg = swiglu_backward(s.gate, s.up, d_act);
  d_act = Tensor();
  Tensor dxn2 = gate_.backward(sg.dgate, s.xn2);
  add_(dxn2, up_.backward(sg.dup, s.xn2));
  s.gate = s.up = s.xn2 = Tensor();
  sg = {};
  Tensor dh = post_norm_.backward(dxn2, s.h, {Tensor(), s.rms2}, cfg_.fused() ? dy : Tensor());
  if (!cfg_.fused()) add_(dh, dy);
  s.h = s.rms2 = Tensor();
  // Attention: h = x + o(attn(rope(q(xn1)), rope(k(xn1)), v(xn1)))
  Tensor dattn = o_.backward(dh, s.attn.view({Bq, Lq, cfg_.hidden}));
  const float scale = 1.f / std::sqrt(float(D));
  const Tensor dout = dattn.view({Bq, Lq, cfg_.heads, D});
  const AttentionOut saved{s.attn, s.lse};
  AttentionGrads ag = tail ? attention_backward_packed(dout, s.q, as_rows(s.k), as_rows(s.v), saved, at.sequences,
                                                       Mask::Causal, scale, window_, at.tails)
                      : at.packed.empty() ? attention_backward(dout, s.q, s.k, s.v, saved, Mask::Causal, scale, window_)
                                          : attention_backward_packed(dout, s.q, s.k, s.v, saved, at.packed,
                                                                      Mask::Causal, scale, window_);
  dattn = Tensor();
  s.q = s.k = s.v = s.attn = s.lse = Tensor();
  Tensor dq = (tail ? at.tail_rot : at.rot).unrotate(ag.dq).view({Bq, Lq, cfg_.hidden});
  Tensor dk = at.rot.unrotate(ag.dk.view({B, L, cfg_.kv_heads, D})).view({B, L, cfg_.kv_heads * D});
  Tensor dv = ag.dv.view({B, L, cfg_.kv_heads * D});
  ag = {};
  Tensor dxn1;
  if (tail) {
    dxn1 = k_.backward(dk, s.xn1);
    add_(dxn1, v_.backward(dv, s.xn1));
    const Tensor xq = pack_rows(s.xn1.view({B * L, cfg_.hidden}), at.tail_rows, Lq);
    add_unpacked_(dxn1.view({B * L, cfg_.hidden}), q_.backward(dq.view({Lq, cfg_.hidden}), xq), at.tail_rows);
  } else {
    dxn1 = q_.backward(dq, s.xn1);
    add_(dxn1, k_.backward(dk, s.xn1));
    add_(dxn1, v_.backward(dv, s.xn1));
  }
  s.xn1 = Tensor();
  Tensor dx = input_norm_.backward(dxn1, s.x, {Tensor(), s.rms1}, fused_residual ? dh : Tensor());
  if (tail)
    add_unpacked_(dx.view({B * L, cfg_.hidden}), dh.view({Lq, cfg_.hidden}), at.tail_rows);
  else if (!cfg_.fused())
    add_(dx, dh);
  s = S{};
  return dx;
}

Tensor LlamaLayer::forward_cached(const Tensor& x, const Rotary& rot, const Tensor& past,
                                  const std::vector<int64_t>& past_host, Tensor& k_cache, Tensor& v_cache) const {
  MemoryScope scope(Category::Activations, prefix_);
  const int64_t B = x.size(0), L = x.size(1), D = cfg_.head_dim();
  Tensor h;
  {
    Tensor xn1 = input_norm_.forward(x).y;
    Tensor q = rot.rotate(q_.forward(xn1).view({B, L, cfg_.heads, D}));
    Tensor k = rot.rotate(k_.forward(xn1).view({B, L, cfg_.kv_heads, D}));
    Tensor v = v_.forward(xn1).view({B, L, cfg_.kv_heads, D});
    xn1 = Tensor();
    for (int64_t b = 0; b < B; ++b) {
      const int64_t p = past_host[std::size_t(b)];
      copy_(k_cache.select(0, b).slice(0, p, p + L), k.select(0, b));
      copy_(v_cache.select(0, b).slice(0, p, p + L), v.select(0, b));
    }
    k = v = Tensor();
    Tensor attn = attention_cached(q, k_cache, v_cache, past, 1.f / std::sqrt(float(D)), window_).out;
    q = Tensor();
    h = o_.forward(attn.view({B, L, cfg_.hidden}));
  }
  if (!cfg_.fused()) add_(h, x);
  Tensor act;
  {
    Tensor xn2 = post_norm_.forward(h, cfg_.fused() ? x : Tensor()).y;
    act = swiglu_forward(gate_.forward(xn2), up_.forward(xn2));
  }
  Tensor y = down_.forward(act);
  act = Tensor();
  add_(y, h);
  return y;
}

LlamaModel::LlamaModel(ParamStore& store, const std::string& prefix, const std::string& head_name, const LlmConfig& cfg,
                       const Groups& groups)
    : embed_group_(groups.embed),
      layer_group_(groups.first_layer),
      norm_group_(groups.norm),
      cfg_(cfg),
      prefix_(prefix) {
  {
    ParamStore::GroupScope in(store, groups.embed);
    embed_tokens_ = &store.add(prefix + ".embed_tokens.weight", {cfg.vocab, cfg.hidden});
  }
  for (int64_t i = 0; i < cfg.layers; ++i) {
    ParamStore::GroupScope in(store, groups.first_layer + int(i));
    layers_.emplace_back(store, str(prefix, ".layers.", i), cfg, cfg.window_of(i));
  }
  {
    ParamStore::GroupScope in(store, groups.norm);
    norm_ = RMSNorm::make(store, prefix + ".norm", cfg.hidden, cfg.rms_norm_eps);
  }
  if (cfg.tied_embeddings) {  // the head's group holds nothing; its matrix is the table
    lm_head_.weight = embed_tokens_;
    return;
  }
  ParamStore::GroupScope in(store, groups.head);
  lm_head_ = Linear::make(store, head_name, cfg.hidden, cfg.vocab, Bias::No);
}

Tensor LlamaModel::embed(const Tensor& ids) const {
  MemoryScope scope(Category::Activations, prefix_ + ".embed_tokens");
  hook_before(hooks_, embed_group_, Pass::Forward);
  Tensor out = embedding_forward(ids, embed_tokens_->data);
  watch_output(watch_, embed_group_, Pass::Forward, out);
  hook_after(hooks_, embed_group_, Pass::Forward);
  return out;
}

void LlamaModel::embed_backward(const Tensor& ids, const Tensor& d_embeds) const {
  if (!embed_tokens_->trainable) return;
  MemoryScope scope(Category::Activations, prefix_ + ".embed_tokens");
  hook_before(hooks_, embed_group_, Pass::Backward);
  embedding_backward(ids, d_embeds, embed_tokens_->shape, embed_tokens_->dtype, embed_tokens_->ensure_grad());
  hook_after(hooks_, embed_group_, Pass::Backward);
}

Rotary LlamaModel::rotary_at(const std::vector<int64_t>& positions, int64_t batch, int64_t seq, Device device) const {
  Rotary r;
  r.theta = cfg_.rope_theta;
  {
    MemoryScope scope(Category::IO, prefix_);
    r.positions = Tensor::from_ints(positions, {batch, seq}, DType::I64, device);
  }
  if (cfg_.fused()) {
    MemoryScope scope(Category::Activations, prefix_ + ".rotary");
    r.table = rope_table(r.positions, cfg_.head_dim(), cfg_.rope_theta);
  }
  return r;
}

TokenLayout LlamaModel::layout_for(int64_t B, int64_t L, Device device, const std::vector<int64_t>& packed) const {
  std::vector<int64_t> pos(std::size_t(B * L));
  if (packed.empty()) {
    for (int64_t i = 0; i < B * L; ++i) pos[std::size_t(i)] = i % L;
  } else {
    int64_t total = 0;
    for (int64_t n : packed) {
      HR_CHECK(n > 0 && total + n <= L, "[llama] packed sequences of lengths ", n, " and more overrun the batch's ", L,
               " tokens");
      for (int64_t t = 0; t < n; ++t) pos[std::size_t(total + t)] = t;
      total += n;
    }
    HR_CHECK(B == 1 && total == L, "[llama] a packed batch is (1, total, C) with total the sum of its ", packed.size(),
             " sequences' lengths, ", total, "; got ", B, " x ", L);
  }
  TokenLayout at;
  at.rot = rotary_at(pos, B, L, device);
  at.packed = packed;
  return at;
}

TokenLayout LlamaModel::with_tails(const TokenLayout& at, int64_t B, int64_t L, Device device,
                                   const std::vector<int64_t>& tails) const {
  TokenLayout t = at;
  t.sequences = at.packed.empty() ? std::vector<int64_t>(std::size_t(B), L) : at.packed;
  t.tails = tails;
  t.tail_rows = tail_runs(t.sequences, tails);
  std::vector<int64_t> pos;
  for (std::size_t i = 0; i < tails.size(); ++i)
    for (int64_t p = t.sequences[i] - tails[i]; p < t.sequences[i]; ++p) pos.push_back(p);
  t.tail_rot = rotary_at(pos, 1, int64_t(pos.size()), device);
  return t;
}

Tensor LlamaModel::forward(const Tensor& embeds, LlamaSaved& saved, const CheckpointPolicy& policy, Saving saving,
                           const std::vector<int64_t>& packed, const std::vector<int64_t>& tails) const {
  const int64_t B = embeds.size(0), L = embeds.size(1);
  const TokenLayout at = layout_for(B, L, embeds.device(), packed);
  const TokenLayout last = tails.empty() ? at : with_tails(at, B, L, embeds.device(), tails);
  saved = LlamaSaved{};
  saved.packed = packed;
  saved.tails = tails;
  saved.batch = B;
  saved.seq = L;
  saved.layers.resize(layers_.size());
  const int64_t blocks = int64_t(layers_.size());
  if (saving == Saving::ForBackward && policy.offload) saved.offload = std::make_unique<ActivationOffload>();
  Tensor x = embeds;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    hook_before(hooks_, layer_group_ + int(i), Pass::Forward);
    x = layers_[i].forward(x, i + 1 == layers_.size() ? last : at, saved.layers[i],
                           policy.for_block(int64_t(i), blocks));
    watch_output(watch_, layer_group_ + int(i), Pass::Forward, x);
    if (saved.offload && offloads(policy, int64_t(i), blocks))
      saved.offload->send(i, kept_fields(saved.layers[i], kFields), layers_[i].name());
    hook_after(hooks_, layer_group_ + int(i), Pass::Forward);
    if (saving == Saving::Nothing) saved.layers[i] = {};
  }
  if (saved.offload) saved.offload->sent_all();
  MemoryScope scope(Category::Activations, prefix_ + ".norm");
  hook_before(hooks_, norm_group_, Pass::Forward);
  NormOut n = norm_.forward(x);
  watch_output(watch_, norm_group_, Pass::Forward, n.y);
  hook_after(hooks_, norm_group_, Pass::Forward);
  if (saving == Saving::ForBackward) {
    saved.final_in = x;
    saved.final_rms = n.saved.rstd;
  }
  return n.y;
}

Tensor LlamaModel::backward(const Tensor& d_hidden, LlamaSaved& saved) const {
  const TokenLayout at = layout_for(saved.batch, saved.seq, d_hidden.device(), saved.packed);
  const TokenLayout last =
      saved.tails.empty() ? at : with_tails(at, saved.batch, saved.seq, d_hidden.device(), saved.tails);
  Tensor dx;
  {
    MemoryScope scope(Category::Activations, prefix_ + ".norm");
    hook_before(hooks_, norm_group_, Pass::Backward);
    dx = norm_.backward(d_hidden, saved.final_in, {Tensor(), saved.final_rms});
    hook_after(hooks_, norm_group_, Pass::Backward);
    saved.final_in = saved.final_rms = Tensor();
  }
  for (std::size_t i = layers_.size(); i-- > 0;) {
    if (saved.offload) saved.offload->before_backward(i, layers_[i].name(), i > 0 ? &layers_[i - 1].name() : nullptr);
    hook_before(hooks_, layer_group_ + int(i), Pass::Backward);
    dx = layers_[i].backward(dx, i + 1 == layers_.size() ? last : at, saved.layers[i]);
    watch_output(watch_, layer_group_ + int(i), Pass::Backward, dx);
    hook_after(hooks_, layer_group_ + int(i), Pass::Backward);
  }
  return dx;
}

}  // namespace hr::models

namespace hr::models {

int64_t KvCache::bytes(const LlmConfig& cfg, int64_t batch, int64_t capacity, DType dtype) {
  return 2 * cfg.layers * batch * capacity * cfg.kv_heads * cfg.head_dim() * int64_t(dtype_size(dtype));
}

KvCache make_kv_cache(const LlmConfig& cfg, const std::string& prefix, int64_t batch, int64_t capacity, DType dtype,
                      Device device) {
  HR_CHECK(batch > 0 && capacity > 0, "[kv_cache] needs at least one row and one position; got ", batch, " x ",
           capacity);
  KvCache c;
  c.capacity = capacity;
  c.length.assign(std::size_t(batch), 0);
  for (int64_t i = 0; i < cfg.layers; ++i) {
    MemoryScope scope(Category::Activations, str(prefix, ".layers.", i, ".kv_cache"));
    c.k.push_back(Tensor::empty({batch, capacity, cfg.kv_heads, cfg.head_dim()}, dtype, device));
    c.v.push_back(Tensor::empty({batch, capacity, cfg.kv_heads, cfg.head_dim()}, dtype, device));
  }
  return c;
}

Tensor LlamaModel::forward_cached(const Tensor& embeds, KvCache& cache) const {
  const int64_t B = embeds.size(0), L = embeds.size(1);
  HR_CHECK(B == cache.batch() && int64_t(cache.k.size()) == cfg_.layers, "[llama.forward_cached] a batch of ", B,
           " rows needs a cache of ", B, " rows and ", cfg_.layers, " layers; it has ", cache.batch(), " and ",
           cache.k.size());
  std::vector<int64_t> pos(std::size_t(B * L));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t p = cache.length[std::size_t(b)];
    HR_CHECK(p + L <= cache.capacity, "[llama.forward_cached] row ", b, " would reach position ", p + L,
             " but the KV cache holds ", cache.capacity);
    for (int64_t t = 0; t < L; ++t) pos[std::size_t(b * L + t)] = p + t;
  }
  const Rotary rot = rotary_at(pos, B, L, embeds.device());
  Tensor past;
  {
    MemoryScope scope(Category::IO, prefix_);
    past = Tensor::from_ints(cache.length, {B}, DType::I64, embeds.device());
  }
  Tensor x = embeds;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    hook_before(hooks_, layer_group_ + int(i), Pass::Forward);
    x = layers_[i].forward_cached(x, rot, past, cache.length, cache.k[i], cache.v[i]);
    hook_after(hooks_, layer_group_ + int(i), Pass::Forward);
  }
  for (int64_t& n : cache.length) n += L;
  MemoryScope scope(Category::Activations, prefix_ + ".norm");
  hook_before(hooks_, norm_group_, Pass::Forward);
  Tensor y = norm_.forward(x).y;
  hook_after(hooks_, norm_group_, Pass::Forward);
  return y;
}

}  // namespace hr::models
