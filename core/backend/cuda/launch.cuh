// How the CUDA back-end launches its kernels. Every grid is checked against CUDA's limits before the launch, so a
// shape that cannot launch is a named error rather than cudaErrorInvalidConfiguration from somewhere later; an
// element-wise launch over no elements launches nothing (a grid of zero blocks is itself an invalid
// configuration, and the CPU twins accept empty tensors); every launch is checked.
#pragma once

#include <cstdint>
#include <utility>

#include "core/backend/cuda/cuda_common.h"

namespace hr::cuda {

constexpr int64_t kMaxGridX = 2147483647;  // 2^31 - 1 blocks
constexpr int64_t kMaxGridYZ = 65535;

// A grid of x * y * z blocks, refused by name (the op, the grid) where CUDA would refuse it.
inline dim3 checked_grid(const char* op, int64_t x, int64_t y = 1, int64_t z = 1) {
  HR_CHECK(x >= 1 && x <= kMaxGridX && y >= 1 && y <= kMaxGridYZ && z >= 1 && z <= kMaxGridYZ, "[", op, "] grid (", x,
           ", ", y, ", ", z, ") is outside CUDA's limits (x up to ", kMaxGridX, ", y and z up to ", kMaxGridYZ, ")");
  return dim3(unsigned(x), unsigned(y), unsigned(z));
}

// Blocks of `threads` that cover n items.
inline int64_t blocks_of(int64_t n, int64_t threads) {
  return (n + threads - 1) / threads;
}

// `kernel` on `grid` x `block` with `shared` bytes of dynamic shared memory on the back-end's stream; checked.
template <typename... Params, typename... Args>
void launch_kernel(dim3 grid, dim3 block, std::size_t shared, void (*kernel)(Params...), Args&&... args) {
  kernel<<<grid, block, shared, stream()>>>(std::forward<Args>(args)...);
  HR_CUDA_CHECK(cudaGetLastError());
}

// One thread per element of n (kThreads a block): nothing at all when n is 0.
template <typename... Params, typename... Args>
void launch_elements(const char* op, int64_t n, void (*kernel)(Params...), Args&&... args) {
  if (n <= 0) return;
  launch_kernel(checked_grid(op, blocks_of(n, kThreads)), dim3(kThreads), 0, kernel, std::forward<Args>(args)...);
}

// Whether every pointer is 16-byte aligned (null counts as aligned): a kernel over packs (device/pack.cuh) then
// moves each whole pack with one access.
template <typename... P>
bool aligned16(const P*... p) {
  return ((reinterpret_cast<std::uintptr_t>(p) % 16 == 0) && ...);
}

// One thread per pack of `pack` elements of n (kThreads a block): nothing at all when n is 0.
template <typename... Params, typename... Args>
void launch_packs(const char* op, int64_t n, int pack, void (*kernel)(Params...), Args&&... args) {
  if (n <= 0) return;
  launch_kernel(checked_grid(op, blocks_of(blocks_of(n, pack), kThreads)), dim3(kThreads), 0, kernel,
                std::forward<Args>(args)...);
}

// One block of `threads` per row: nothing at all when there are no rows.
template <typename... Params, typename... Args>
void launch_rows(const char* op, int64_t rows, int threads, void (*kernel)(Params...), Args&&... args) {
  if (rows <= 0) return;
  launch_kernel(checked_grid(op, rows), dim3(unsigned(threads)), 0, kernel, std::forward<Args>(args)...);
}

}  // namespace hr::cuda
