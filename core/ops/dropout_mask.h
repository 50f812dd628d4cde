// Dropout's mask as a function of (key, element): the same on every backend and on every call, so a backward
// pass (or a recomputation) draws the mask of its forward pass again instead of keeping it.
#pragma once

#include <cstdint>

#include "hr_host_device.h"

namespace hr::core {

// The drop threshold of probability p: an element is kept when the top 32 bits of its hash reach it.
inline uint32_t dropout_threshold(float p) {
  const double t = double(p) * 4294967296.0;
  return t >= 4294967295.0 ? 0xffffffffu : uint32_t(t);
}

// splitmix64 of the key and the element's index.
HR_HOST_DEVICE inline bool dropout_keep(uint64_t key, uint64_t i, uint32_t threshold) {
  uint64_t z = key + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return uint32_t(z >> 32) >= threshold;
}

}  // namespace hr::core
