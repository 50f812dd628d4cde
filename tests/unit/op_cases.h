// The op test table: one small struct per op case (inputs, forward, backward, double-precision reference).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/ops/params.h"
#include "core/tensor.h"

namespace hr::test {

using core::Shape;
using core::Tensor;

struct Input {
  Shape shape;
  bool index = false;  // i64 indices (ids, labels, positions) instead of floats
  bool differentiable = true;
  std::vector<double> values;
};

using Values = std::vector<std::vector<double>>;

struct OpCase {
  std::string name;
  std::vector<Input> inputs;
  // The output whose gradient is checked.
  std::function<Tensor(const std::vector<Tensor>&)> forward;
  // Gradients of sum(forward(inputs) * dy) for each differentiable input, in input order; empty for a
  // forward-only op (inference: the KV-cache attention).
  std::function<std::vector<Tensor>(const std::vector<Tensor>&, const Tensor& dy)> backward;
  // The same forward, naively, in double precision on the host.
  std::function<std::vector<double>(const Values&)> reference;
  double tol_f32 = 1e-4;  // max |error| / max |reference|
  double tol_bf16_fwd = 2e-2;
  double tol_bf16_bwd = 5e-2;
  bool empty = false;  // its tensors hold no elements: there may be nothing to allocate or compare
  // An attention case: its shape (the dtype set per run) and whether its queries run against a KV cache, to say
  // which kernel a GPU must take for it.
  std::optional<core::AttentionDesc> attention;
  bool kv_cache = false;
};

std::vector<OpCase> op_cases();

double round_to(double v, core::DType t);  // v as a value of dtype t holds it
// The case's input values as a device of dtype `dt` holds them (floats rounded to it), and tensors of them.
Values rounded_inputs(const OpCase& c, core::DType dt);
std::vector<Tensor> make_tensors(const OpCase& c, const Values& v, core::DType dt, core::Device dev);

}  // namespace hr::test
