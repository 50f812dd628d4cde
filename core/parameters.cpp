// The parameter store and its groups.
#include "core/parameters.h"

#include "core/check.h"
#include "core/memory/category.h"
#include "core/ops/copy.h"

namespace hr::core {

std::string owner_of(const std::string& name) {
  std::size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

const char* group_kind_name(GroupKind k) {
  switch (k) {
    case GroupKind::Embedding:
      return "embedding";
    case GroupKind::EncoderStem:
      return "encoder stem";
    case GroupKind::EncoderLayer:
      return "encoder layer";
    case GroupKind::Projector:
      return "projector";
    case GroupKind::DecoderLayer:
      return "decoder layer";
    case GroupKind::Head:
      return "head";
  }
  return "?";
}

bool is_encoder(GroupKind k) {
  return k == GroupKind::EncoderStem || k == GroupKind::EncoderLayer;
}
bool is_decoder(GroupKind k) {
  return k == GroupKind::Embedding || k == GroupKind::DecoderLayer || k == GroupKind::Head;
}

Tensor& Param::ensure_grad() {
  if (grad_target().accumulate == Accumulate::No) fill_(grad, 0.f);
  return grad;
}

Param::GradTarget Param::grad_target() {
  HR_ASSERT(trainable, "gradient requested for frozen parameter ", name);
  if (grad.defined()) return {grad, Accumulate::Yes};
  MemoryScope scope(Category::Grads, owner_of(name));
  grad = Tensor::empty(shape, grad_dtype, data.device());
  return {grad, Accumulate::No};
}

int ParamStore::add_group(const std::string& name, GroupKind kind) {
  groups_.push_back({name, kind, {}});
  return int(groups_.size()) - 1;
}

ParamStore::GroupScope::GroupScope(ParamStore& store, int group) : store_(store), saved_(store.current_group_) {
  HR_ASSERT(group >= 0 && group < int(store.groups_.size()), "no parameter group ", group);
  store.current_group_ = group;
}

ParamStore::GroupScope::~GroupScope() {
  store_.current_group_ = saved_;
}

Param& ParamStore::add(const std::string& name, const Shape& shape, ParamRole role) {
  HR_ASSERT(current_group_ >= 0, "parameter ", name, " added outside any group");
  return add_typed(name, shape, role, dtype_of(groups_[std::size_t(current_group_)].kind));
}

Param& ParamStore::add_typed(const std::string& name, const Shape& shape, ParamRole role, DType dtype) {
  HR_ASSERT(!by_name_.count(name), "duplicate parameter ", name);
  HR_ASSERT(current_group_ >= 0, "parameter ", name, " added outside any group");
  ParamGroup& g = groups_[std::size_t(current_group_)];
  auto p = std::make_unique<Param>();
  p->name = name;
  p->shape = shape;
  p->dtype = dtype;
  p->grad_dtype = accumulate_wide_ && (dtype == DType::BF16 || dtype == DType::F16) ? accumulate_in_ : dtype;
  p->group = current_group_;
  p->role = role;
  {
    MemoryScope scope(Category::Params, owner_of(name));
    p->data = Tensor::empty(shape, p->dtype, device_);
  }
  Param& ref = *p;
  by_name_[name] = p.get();
  g.params.push_back(p.get());
  params_.push_back(std::move(p));
  return ref;
}

void ParamStore::accumulate_grads_in(DType dtype) {
  HR_CHECK(is_float(dtype), "[params] gradients accumulate in a float dtype; got ", dtype_name(dtype));
  accumulate_in_ = dtype;
  accumulate_wide_ = true;
  for (auto& p : params_) {
    HR_ASSERT(!p->grad.defined(), "the gradient dtype of ", p->name, " changed while it has a gradient");
    if (p->dtype == DType::BF16 || p->dtype == DType::F16) p->grad_dtype = dtype;
  }
}

Param& ParamStore::add_quantized(const std::string& name, int64_t rows, int64_t cols, const QuantFormat& format) {
  const QuantLayout l = QuantLayout::of(format, rows, cols);
  Param& p = add_typed(name, {l.bytes}, ParamRole::Weight, DType::U8);
  p.quant = l;
  p.trainable = false;
  return p;
}

DType ParamStore::dtype_of(GroupKind kind) const {
  auto it = dtype_for_.find(kind);
  return it == dtype_for_.end() ? dtype_ : it->second;
}

Param* ParamStore::find(const std::string& name) {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

void ParamStore::set_trainable(GroupKind kind, bool trainable) {
  for (ParamGroup& g : groups_)
    if (g.kind == kind)
      for (Param* p : g.params) {
        p->trainable = trainable && !p->quantized();
        if (!trainable) p->grad = Tensor();
      }
}

void ParamStore::zero_grad() {
  for (auto& p : params_) p->grad = Tensor();
}

int64_t ParamStore::count(Counting which) const {
  int64_t n = 0;
  for (const auto& p : params_)
    if (which == Counting::All || p->trainable) n += p->count();
  return n;
}

}  // namespace hr::core
