// Fuzzes the YAML config loader with its --set overrides: the input is the file's text, then NUL-separated
// "key=value" overrides, all through load_config_text (the path load_config takes after reading the file).
#include <cstdint>
#include <string>
#include <vector>

#include "train/config.h"

using namespace hr;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::size_t end = input.find('\0');
  const std::string yaml = input.substr(0, end);
  std::vector<std::string> sets;
  while (end != std::string::npos) {
    const std::size_t next = input.find('\0', end + 1);
    sets.push_back(input.substr(end + 1, next == std::string::npos ? std::string::npos : next - end - 1));
    end = next;
  }
  for (int world : {1}) {
    try {
      train::RunConfig c = train::load_config_text(yaml, "fuzz.yaml", sets, world);
      if (c.resolved_yaml.empty()) __builtin_trap();
    } catch (const Error&) {
    }
  }
  return 0;
}
