// Named parameters (llava-hf names), their gradients, and the store that owns them.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace hr::models {

using core::DType;
using core::Device;
using core::Shape;
using core::Tensor;

struct Param {
  std::string name;
  Shape shape;  // the full shape, also while ZeRO-3 holds only a shard and `data` is released
  DType dtype = DType::F32;
  Tensor data;
  Tensor grad;  // undefined until the first backward that produces it; never allocated when frozen
  bool trainable = true;

  // The gradient buffer, zero-filled on first use (tagged `grads`, owned by the parameter's module).
  Tensor& ensure_grad();
  int64_t numel() const { return core::shape_numel(shape); }
};

// The module a parameter belongs to: its name up to the last '.' ("a.b.weight" -> "a.b").
std::string owner_of(const std::string& param_name);

// A set of parameters used together (a transformer block, the embeddings, the head), in the order the
// forward pass first uses them. ZeRO shards, gathers and reduces per group.
struct ParamGroup {
  std::string name;
  std::vector<Param*> params;
};

enum class Pass : uint8_t { Forward, Backward };

// Called by the model around each group's use. ZeRO-3 gathers a group's parameters before and releases them
// after; ZeRO-2 reduce-scatters a group's gradients after its backward. Null hooks: nothing happens.
class GroupHooks {
 public:
  virtual ~GroupHooks() = default;
  virtual void before(int group, Pass pass) = 0;
  virtual void after(int group, Pass pass) = 0;
};

inline void hook_before(GroupHooks* h, int group, Pass pass) {
  if (h) h->before(group, pass);
}
inline void hook_after(GroupHooks* h, int group, Pass pass) {
  if (h) h->after(group, pass);
}

class ParamStore {
 public:
  ParamStore(Device device, DType dtype) : device_(device), dtype_(dtype) {}
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  // Allocates an uninitialised parameter (category params, owner = its module), in the store's dtype or
  // the dtype set for the longest matching name prefix.
  Param& add(const std::string& name, const Shape& shape);
  void set_dtype_for(const std::string& prefix, DType dtype) { dtype_for_[prefix] = dtype; }
  DType dtype_of(const std::string& name) const;
  Param* find(const std::string& name);
  const std::vector<std::unique_ptr<Param>>& all() const { return params_; }
  Device device() const { return device_; }
  DType dtype() const { return dtype_; }

  // Marks every parameter whose name starts with `prefix` as frozen (no gradient) or trainable.
  void set_trainable(const std::string& prefix, bool trainable);
  // Releases every gradient buffer (the next backward allocates zeroed ones).
  void zero_grad();
  int64_t count(bool trainable_only = false) const;

 private:
  Device device_;
  DType dtype_;
  std::vector<std::unique_ptr<Param>> params_;
  std::map<std::string, Param*> by_name_;
  std::map<std::string, DType> dtype_for_;
};

}  // namespace hr::models
