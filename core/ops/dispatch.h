// The one dispatch point: find a kernel in the device's table, allocate workspaces, check arguments.
#pragma once

#include <utility>

#include "core/backend/kernels.h"
#include "core/check.h"
#include "core/memory/category.h"

namespace hr::core {

// Watches kernel launches: tests use it to see what a kernel allocates outside the caching allocator.
// At most one is installed; kernels run on the thread that launches them (and its OpenMP team).
class KernelObserver {
 public:
  virtual ~KernelObserver() = default;
  virtual void enter(const char* op) = 0;
  virtual void leave(const char* op) = 0;
};
void set_kernel_observer(KernelObserver* observer);  // nullptr removes it
KernelObserver* kernel_observer();

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

// The one way an op runs a kernel: finds it in `device`'s table and calls it with `args`. On meta there is
// no kernel and nothing runs: the op has already allocated everything the kernel would use.
template <typename F, typename... Args>
void launch(const char* op, Device device, F Kernels::*member, Args&&... args) {
  F f = kernel(op, device, member);
  if (!f) return;
  KernelObserver* o = kernel_observer();
  if (o) o->enter(op);
  struct Leave {
    KernelObserver* o;
    const char* op;
    ~Leave() {
      if (o) o->leave(op);
    }
  } leave{o, op};
  f(std::forward<Args>(args)...);
}

// The FLOPs the matrix products have run in this process, on every device but meta (whose ops compute nothing):
// GEMMs at 2 m n k, attention at 4 d per query-key pair its mask lets through (forward: S = QK^T, PV), 2.5 times that
// in the backward (the forward's two products recomputed or read back, and dV, dP, dQ, dK: FlashAttention's
// count). The KV cache's attention (generation) is not counted. The trainer logs each step's share (`flops` in the
// memory log), so a step's checkpointing recompute is in it and its dry run is not.
double matmul_flops();
void add_matmul_flops(Device device, double flops);

// A workspace buffer tagged `workspace` (undefined when bytes is 0, so no allocation happens).
Tensor allocate_workspace(std::size_t bytes, Device device);

void check_same_device(const char* op, const Tensor& a, const Tensor& b);
void check_float(const char* op, const char* name, const Tensor& t);
void check_shape(const char* op, const char* name, const Tensor& t, const Shape& expected);

}  // namespace hr::core
