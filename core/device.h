// Devices: where a tensor's bytes live and which backend runs its ops.
#pragma once

#include <cstdint>
#include <string>

namespace hr::core {

// cpu: the compute device of the CPU backend (optionally capped, so it runs out like a GPU).
// host: plain host memory beside an accelerator (loader buffers, offloaded states); runs CPU kernels, never capped.
// cuda:N: a GPU. meta: computes nothing, allocates exactly as its target backend would.
enum class DeviceType : uint8_t { CPU, Host, CUDA, Meta };

// The backend a meta device mirrors when it sizes workspaces.
enum class Backend : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device host() { return {DeviceType::Host, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
  static Device meta() { return {DeviceType::Meta, 0}; }
  static Device parse(const std::string& s);  // "cpu", "host", "cuda", "cuda:1", "meta"

  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  bool runs_cpu_kernels() const { return type == DeviceType::CPU || type == DeviceType::Host; }
  std::string name() const;
};

}  // namespace hr::core
