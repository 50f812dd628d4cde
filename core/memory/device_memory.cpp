// Per-device allocator registry.
#include "core/memory/device_memory.h"

#include <map>
#include <mutex>

namespace hr::core {

namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::pair<int, int>, std::shared_ptr<CachingAllocator>> allocators;
  Backend meta_target = Backend::CPU;
};

Registry& registry() {
  static Registry r;
  return r;
}

std::shared_ptr<CachingAllocator> make_allocator(Device d, const DeviceMemoryOptions& o) {
  std::unique_ptr<RawAllocator> raw;
  switch (d.type) {
    case DeviceType::CPU:
      raw = o.capacity ? make_capped_host_allocator(o.capacity) : make_host_allocator();
      break;
    case DeviceType::Host: raw = make_host_allocator(); break;
    case DeviceType::Meta: raw = make_meta_allocator(o.capacity); break;
    case DeviceType::CUDA: raw = make_cuda_allocator(d.index); break;
  }
  return std::make_shared<CachingAllocator>(std::move(raw), d.name());
}

}  // namespace

std::shared_ptr<CachingAllocator> allocator_for(Device device) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto key = std::make_pair(int(device.type), device.index);
  auto it = r.allocators.find(key);
  if (it != r.allocators.end()) return it->second;
  auto a = make_allocator(device, {});
  r.allocators.emplace(key, a);
  return a;
}

void configure_device(Device device, const DeviceMemoryOptions& options) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto key = std::make_pair(int(device.type), device.index);
  auto it = r.allocators.find(key);
  if (it != r.allocators.end()) {
    int64_t live = it->second->stats().allocated_bytes.current;
    HR_CHECK(live == 0, "[device] cannot reconfigure ", device.name(), " while ", format_bytes(double(live)),
             " of tensors are alive on it");
    r.allocators.erase(it);
  }
  HR_CHECK(!(device.type == DeviceType::Host && options.capacity), "[device] the host device cannot be capped; cap 'cpu'");
  r.allocators.emplace(key, make_allocator(device, options));
  if (device.type == DeviceType::Meta) r.meta_target = options.meta_target;
}

Backend meta_target() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.meta_target;
}

Backend workspace_backend(Device device) {
  switch (device.type) {
    case DeviceType::CUDA: return Backend::CUDA;
    case DeviceType::Meta: return meta_target();
    default: return Backend::CPU;
  }
}

}  // namespace hr::core
