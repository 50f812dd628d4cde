// Device names and parsing.
#include "core/device.h"

#include "core/check.h"

namespace hr::core {

std::string Device::name() const {
  switch (type) {
    case DeviceType::CPU:
      return "cpu";
    case DeviceType::Host:
      return "host";
    case DeviceType::CUDA:
      return str("cuda:", index);
    case DeviceType::Meta:
      return "meta";
  }
  return "?";
}

Device Device::parse(const std::string& s) {
  if (s == "cpu") return cpu();
  if (s == "host") return host();
  if (s == "meta") return meta();
  if (s == "cuda") return cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    try {
      std::size_t used = 0;
      int i = std::stoi(s.substr(5), &used);
      if (used == s.size() - 5 && i >= 0) return cuda(i);
    } catch (const std::exception&) {
    }
  }
  throw Error(str("[device] unknown device '", s, "'; allowed: cpu, host, meta, cuda, cuda:N"));
}

}  // namespace hr::core
