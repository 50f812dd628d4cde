// Device presets. Capacities are what cudaMemGetInfo reports as total on each part (MiB from nvidia-smi);
// throughputs are dense datasheet peaks. None of these have been measured here: this machine has no GPU.
#include "train/devices.h"

#include <unistd.h>

#include "core/check.h"
#include "core/suggest.h"

namespace hr::train {

namespace {

constexpr std::size_t MiB = std::size_t(1) << 20;

const std::vector<DevicePreset>& presets() {
  static const std::vector<DevicePreset> v = {
      // name          capacity        reserve     bf16   fp32   mem   host  link
      {"a100-40g", 40536 * MiB, 1024 * MiB, 312, 156, 1555, 25, 300},
      {"a100-80g", 81920 * MiB, 1024 * MiB, 312, 156, 2039, 25, 300},
      {"h100-80g", 81559 * MiB, 1280 * MiB, 989, 495, 3350, 50, 450},
      {"h200-141g", 143771 * MiB, 1280 * MiB, 989, 495, 4800, 50, 450},
      {"l4-24g", 23034 * MiB, 768 * MiB, 121, 60, 300, 25, 25},
      {"rtx4090-24g", 24564 * MiB, 768 * MiB, 165, 83, 1008, 25, 25},
      {"v100-32g", 32510 * MiB, 768 * MiB, 125, 15.7, 900, 12, 150, false},
  };
  return v;
}

}  // namespace

std::vector<std::string> device_preset_names() {
  std::vector<std::string> n;
  for (const auto& p : presets()) n.push_back(p.name);
  n.push_back("cpu:<capacity>");
  return n;
}

DevicePreset device_preset(const std::string& name) {
  for (const auto& p : presets())
    if (p.name == name) return p;
  if (name == "cpu" || name.rfind("cpu:", 0) == 0) {
    DevicePreset p;
    p.name = name;
    p.cuda = false;
    p.bf16 = true;
    // Measured on this project's 2-core reference machine (tests/bench: f32 GEMM 146 GFLOP/s).
    p.tflops_bf16 = p.tflops_fp32 = 0.146;
    p.mem_gbps = 20;
    p.host_gbps = 10;
    p.link_gbps = 5;
    if (name.size() > 4) p.capacity = parse_bytes(name.substr(4), "--device");
    else p.capacity = std::size_t(sysconf(_SC_PHYS_PAGES)) * std::size_t(sysconf(_SC_PAGE_SIZE));
    return p;
  }
  std::vector<std::string> names = device_preset_names();
  throw Error(str("[plan] unknown device '", name, "'", did_you_mean(name, names), "; presets: a100-40g, a100-80g, ",
                  "h100-80g, h200-141g, l4-24g, rtx4090-24g, v100-32g, cpu:<capacity>"));
}

}  // namespace hr::train
