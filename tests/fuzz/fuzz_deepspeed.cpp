// Fuzzes the DeepSpeed JSON importer (LLaVA's zero2.json, zero3.json and the like, as users download them): the
// input is the file's text, read for 1, 2 and 8 ranks. What it accepts are headroom keys with YAML values, and the
// config loader must take them, or refuse them with an hr::Error naming the key; any other exception is a finding.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "train/config.h"
#include "train/deepspeed.h"

using namespace hr;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<std::string> keys = train::config_keys();
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (int world : {1, 2, 8}) {
    train::DeepSpeedConfig ds;
    try {
      ds = train::deepspeed_from_text(text, "fuzz/ds.json", world);
    } catch (const Error&) {
      continue;
    }
    std::vector<std::string> sets = {"model.preset=tiny"};
    for (const auto& [key, value] : ds.sets) {
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) __builtin_trap();  // a key headroom does not have
      sets.push_back(key + "=" + value);
    }
    try {
      const train::RunConfig c = train::load_config_text("", "fuzz.yaml", sets, world);
      if (c.resolved_yaml.empty()) __builtin_trap();
    } catch (const Error&) {
    }
  }
  return 0;
}
