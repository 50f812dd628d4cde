// Parameter store.
#include "models/params.h"

#include "core/check.h"
#include "core/memory/category.h"

namespace hr::models {

using core::Category;
using core::MemoryScope;

std::string owner_of(const std::string& name) {
  std::size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

Tensor& Param::ensure_grad() {
  HR_ASSERT(trainable, "gradient requested for frozen parameter ", name);
  if (!grad.defined()) {
    MemoryScope scope(Category::Grads, owner_of(name));
    grad = Tensor::zeros(shape, dtype, data.device());
  }
  return grad;
}

Param& ParamStore::add(const std::string& name, const Shape& shape) {
  HR_ASSERT(!by_name_.count(name), "duplicate parameter ", name);
  auto p = std::make_unique<Param>();
  p->name = name;
  p->shape = shape;
  p->dtype = dtype_of(name);
  {
    MemoryScope scope(Category::Params, owner_of(name));
    p->data = Tensor::empty(shape, dtype_of(name), device_);
  }
  Param& ref = *p;
  by_name_[name] = p.get();
  params_.push_back(std::move(p));
  return ref;
}

DType ParamStore::dtype_of(const std::string& name) const {
  DType t = dtype_;
  std::size_t best = 0;
  for (const auto& [prefix, dt] : dtype_for_)
    if (name.rfind(prefix, 0) == 0 && prefix.size() >= best) best = prefix.size(), t = dt;
  return t;
}

Param* ParamStore::find(const std::string& name) {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

void ParamStore::set_trainable(const std::string& prefix, bool trainable) {
  for (auto& p : params_)
    if (p->name.rfind(prefix, 0) == 0) {
      p->trainable = trainable;
      if (!trainable) p->grad = Tensor();
    }
}

void ParamStore::zero_grad() {
  for (auto& p : params_) p->grad = Tensor();
}

int64_t ParamStore::count(bool trainable_only) const {
  int64_t n = 0;
  for (const auto& p : params_)
    if (!trainable_only || p->trainable) n += p->numel();
  return n;
}

}  // namespace hr::models
