// The caching allocator of each device, and how a device is configured (capacity, meta target).
#pragma once

#include <memory>

#include "core/device.h"
#include "core/memory/caching_allocator.h"

namespace hr::core {

struct DeviceMemoryOptions {
  std::size_t capacity = 0;            // 0: unlimited (cpu, host, meta) or the GPU's own size (cuda)
  Backend meta_target = Backend::CPU;  // meta only: whose workspace sizes to mirror
};

// The allocator serving `device`, created with default options on first use.
std::shared_ptr<CachingAllocator> allocator_for(Device device);

// Replaces the device's allocator. Throws if the current one still has live allocations.
void configure_device(Device device, const DeviceMemoryOptions& options);

// The backend whose workspace sizes a meta device mirrors.
Backend meta_target();

// The backend an op on `device` sizes its workspace for.
Backend workspace_backend(Device device);

}  // namespace hr::core
