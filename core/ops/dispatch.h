// The one dispatch point: find a kernel in the device's table, allocate workspaces, check arguments.
#pragma once

#include "core/backend/kernels.h"
#include "core/check.h"
#include "core/memory/category.h"

namespace hr::core {

// The kernel `member` of `device`'s backend; nullptr on meta, where ops allocate and compute nothing.
// Throws "[op] has no <backend> implementation" when the backend lacks it.
template <typename F>
F kernel(const char* op, Device device, F Kernels::*member) {
  const Kernels* k = kernels_for(device);
  if (!k) return nullptr;
  F f = k->*member;
  if (!f) throw Error(str("[", op, "] has no ", k->backend, " implementation"));
  return f;
}

// A workspace buffer tagged `workspace` (undefined when bytes is 0, so no allocation happens).
Tensor allocate_workspace(std::size_t bytes, Device device);

void check_same_device(const char* op, const Tensor& a, const Tensor& b);
void check_float(const char* op, const char* name, const Tensor& t);
void check_shape(const char* op, const char* name, const Tensor& t, const Shape& expected);
void check_defined(const char* op, const char* name, const Tensor& t);

}  // namespace hr::core
