// Linear and norm layers.
#include "models/layers.h"

#include <algorithm>

#include "core/ops/copy.h"
#include "core/ops/elementwise.h"
#include "core/ops/linear.h"
#include "core/ops/quant_linear.h"

namespace hr::models {

using namespace hr::core;

namespace {
thread_local const uint64_t* t_lora_key = nullptr;
}  // namespace

LoraDropoutScope::LoraDropoutScope(uint64_t key) : saved_(t_lora_key), key_(key) {
  t_lora_key = &key_;
}
LoraDropoutScope::~LoraDropoutScope() {
  t_lora_key = saved_;
}
const uint64_t* LoraDropoutScope::current() {
  return t_lora_key;
}

Linear Linear::make(ParamStore& store, const std::string& prefix, int64_t in, int64_t out, Bias bias,
                    const LoraSpec* lora) {
  Linear l;
  l.weight = lora && lora->quantizes_base() ? &store.add_quantized(prefix + ".weight", out, in, lora->base_format())
                                            : &store.add(prefix + ".weight", {out, in});
  if (bias == Bias::Yes) l.bias = &store.add(prefix + ".bias", {out}, ParamRole::Bias);
  if (lora && lora->adapts(prefix)) {
    l.lora_a = &store.add(prefix + ".lora_A.weight", {lora->r, in}, ParamRole::LoraA);
    l.lora_b = &store.add(prefix + ".lora_B.weight", {out, lora->r}, ParamRole::LoraB);
    l.lora_scale = lora->scale();
    l.lora_dropout = lora->dropout;
    uint64_t h = 1469598103934665603ull;
    for (char c : prefix) h = (h ^ uint8_t(c)) * 1099511628211ull;
    l.lora_id = h;
  }
  return l;
}

namespace {

// LoRA's input: x, or x with dropout in a training pass (the same mask in its forward and its backward).
Tensor lora_input(const Linear& l, const Tensor& x) {
  const uint64_t* key = LoraDropoutScope::current();
  if (l.lora_dropout <= 0.f || !key) return x;
  return dropout(x.contiguous(), l.lora_dropout, *key ^ l.lora_id);
}

}  // namespace

Tensor Linear::forward(const Tensor& x) const {
  Tensor y = quantized() ? qlinear_forward(x, weight->data, weight->quant, bias ? bias->data : Tensor())
                         : linear_forward(x, w2d(), bias ? bias->data : Tensor());
  if (lora_a) {
    // Two thin GEMMs through the rank-r bottleneck, then y += (alpha / r) * B A x.
    Tensor h = linear_forward(lora_input(*this, x), lora_a->data, Tensor());
    add_(y, linear_forward(h, lora_b->data, Tensor()), lora_scale);
  }
  return y;
}

Linear::Activated Linear::forward_activated(const Tensor& x, UnaryOp op, bool fuse) const {
  if (!fuse || !bias || lora_a || quantized()) {
    Tensor pre = forward(x);
    return {pre, unary_forward(op, pre)};
  }
  Tensor pre = linear_forward(x, w2d(), Tensor());
  return {pre, unary_forward(op, pre, bias->data)};
}

namespace {

// A weight's gradient buffer and its bias's (when `bias`), and whether the kernel that computes both adds onto them
// or writes them: it writes them only when neither exists yet (the first backward of a step). Where one exists and
// the other not, the new one gets zeros to add onto.
Param::GradTarget weights_grads(Param& weight, Param* bias) {
  if (bias && weight.grad.defined() != bias->grad.defined()) {
    bias->ensure_grad();
    return {weight.ensure_grad(), Accumulate::Yes};
  }
  const Param::GradTarget w = weight.grad_target();
  if (bias) bias->grad_target();  // in the same state as the weight's
  return w;
}

// Options that add a trainable weight's gradient into its buffer; a frozen weight gets none, only dx flows.
LinearBackwardOptions grads_into(Param& w, bool need_dx) {
  LinearBackwardOptions o;
  o.need_dx = need_dx;
  o.weight_grads = w.trainable;
  if (o.weight_grads) {
    const Param::GradTarget t = w.grad_target();
    o.dw_into = t.grad, o.accumulate = t.accumulate;
  }
  return o;
}

// The adapters' part: adds dA and dB, returns dx through them (undefined when neither dx nor dA is wanted).
Tensor lora_backward(const Linear& l, const Tensor& dy, const Tensor& x, bool need_dx) {
  // y_l = s B A x': dB += dy^T (s h), dh = s (dy B), dA += dh^T x', dx' = dh A. h = A x' is recomputed and the
  // scale goes on the r-column tensors, never on a (tokens, out) one.
  const Tensor xl = lora_input(l, x);
  const Tensor hs = scale(linear_forward(xl, l.lora_a->data, Tensor()), l.lora_scale);
  const Tensor dh =
      scale(linear_backward(dy, hs, l.lora_b->data, Bias::No, grads_into(*l.lora_b, true)).dx, l.lora_scale);
  const LinearBackwardOptions oa = grads_into(*l.lora_a, need_dx);
  Tensor dx;
  if (oa.need_dx || oa.weight_grads) dx = linear_backward(dh, xl, l.lora_a->data, Bias::No, oa).dx;
  const uint64_t* key = LoraDropoutScope::current();
  if (dx.defined() && l.lora_dropout > 0.f && key)
    dx = dropout(dx, l.lora_dropout, *key ^ l.lora_id);  // dropout's backward: the same mask
  return dx;
}

// A quantized weight is frozen: only dx flows (plus the adapters' dx_lora).
Tensor quantized_backward(const Linear& l, const Tensor& dy, const Tensor& dx_lora, bool need_dx) {
  HR_ASSERT(!l.bias || !l.bias->trainable, "quantized layer ", l.weight->name, " with a trainable bias");
  if (!need_dx) return dx_lora;
  Tensor dx = qlinear_backward_dx(dy, l.weight->data, l.weight->quant);
  if (dx_lora.defined()) add_(dx, dx_lora);
  return dx;
}

}  // namespace

Tensor Linear::backward(const Tensor& dy, const Tensor& x, InputGrad input) const {
  const bool need_dx = input == InputGrad::Compute;
  const Tensor dx_lora = lora_a ? lora_backward(*this, dy, x, need_dx) : Tensor();
  if (quantized()) return quantized_backward(*this, dy, dx_lora, need_dx);
  LinearBackwardOptions o;
  o.need_dx = need_dx;
  o.weight_grads = weight->trainable;
  if (o.weight_grads) {
    const auto [dw, accumulate] = weights_grads(*weight, bias);
    o.accumulate = accumulate;
    o.dw_into = dw.view({out(), in()});
    if (bias) o.dbias_into = bias->grad;
  }
  if (!o.need_dx && !o.weight_grads) return dx_lora;
  Tensor dx = linear_backward(dy, x, w2d(), bias ? Bias::Yes : Bias::No, o).dx;
  if (dx.defined() && dx_lora.defined()) add_(dx, dx_lora);
  return dx;
}

LayerNorm LayerNorm::make(ParamStore& store, const std::string& prefix, int64_t dim, float eps) {
  LayerNorm n;
  n.weight = &store.add(prefix + ".weight", {dim}, ParamRole::NormWeight);
  n.bias = &store.add(prefix + ".bias", {dim}, ParamRole::Bias);
  n.eps = eps;
  return n;
}

NormOut LayerNorm::forward(const Tensor& x, const Tensor& residual) const {
  return layernorm_forward(x, weight->data, bias->data, eps, residual);
}

Tensor LayerNorm::backward(const Tensor& dy, const Tensor& x, const NormSaved& saved, const Tensor& add_to_dx) const {
  NormBackwardOptions o;
  o.add_to_dx = add_to_dx;
  o.weight_grads = weight->trainable;
  if (o.weight_grads) {
    const auto [dw, accumulate] = weights_grads(*weight, bias);
    o.accumulate = accumulate;
    o.dweight_into = dw;
    o.dbias_into = bias->grad;
  }
  return layernorm_backward(dy, x, weight->data, Bias::Yes, saved, o).dx;
}

RMSNorm RMSNorm::make(ParamStore& store, const std::string& prefix, int64_t dim, float eps) {
  RMSNorm n;
  n.weight = &store.add(prefix + ".weight", {dim}, ParamRole::NormWeight);
  n.eps = eps;
  return n;
}

NormOut RMSNorm::forward(const Tensor& x, const Tensor& residual) const {
  return rmsnorm_forward(x, weight->data, eps, residual);
}

Tensor RMSNorm::backward(const Tensor& dy, const Tensor& x, const NormSaved& saved, const Tensor& add_to_dx) const {
  NormBackwardOptions o;
  o.add_to_dx = add_to_dx;
  o.weight_grads = weight->trainable;
  if (o.weight_grads) {
    const auto [dw, accumulate] = weights_grads(*weight, nullptr);
    o.accumulate = accumulate;
    o.dweight_into = dw;
  }
  return rmsnorm_backward(dy, x, weight->data, saved, o).dx;
}

std::vector<RowRun> tail_runs(const std::vector<int64_t>& lengths, const std::vector<int64_t>& tails) {
  HR_CHECK(tails.size() == lengths.size(), "[layers] ", tails.size(), " tails for ", lengths.size(), " sequences");
  std::vector<RowRun> runs;
  runs.reserve(tails.size());
  int64_t start = 0, to = 0;
  for (std::size_t s = 0; s < tails.size(); ++s) {
    const int64_t n = lengths[s], k = tails[s];
    HR_CHECK(k > 0 && k <= n, "[layers] sequence ", s, " of ", n, " rows cannot keep its last ", k);
    runs.push_back({start + n - k, to, k});
    start += n;
    to += k;
  }
  return runs;
}

Tensor pack_rows(const Tensor& x, const std::vector<RowRun>& runs, int64_t rows) {
  Tensor out = Tensor::empty({rows, x.size(1)}, x.dtype(), x.device());
  int64_t packed = 0;
  for (const RowRun& run : runs) {
    copy_(out.slice(0, run.to, run.to + run.count), x.slice(0, run.from, run.from + run.count));
    packed = run.to + run.count;
  }
  if (packed < rows) fill_(out.slice(0, packed, rows), 0.f);
  return out;
}

Tensor unpack_rows(const Tensor& packed, const std::vector<RowRun>& runs, const Shape& shape) {
  Tensor out = Tensor::zeros(shape, packed.dtype(), packed.device());
  const Tensor flat = out.view({-1, packed.size(1)});
  for (const RowRun& run : runs)
    copy_(flat.slice(0, run.from, run.from + run.count), packed.slice(0, run.to, run.to + run.count));
  return out;
}

void add_unpacked_(const Tensor& x, const Tensor& packed, const std::vector<RowRun>& runs) {
  for (const RowRun& run : runs)
    add_(x.slice(0, run.from, run.from + run.count), packed.slice(0, run.to, run.to + run.count));
}

}  // namespace hr::models
