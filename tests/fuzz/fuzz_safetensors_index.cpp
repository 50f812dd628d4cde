// Fuzzes the model.safetensors.index.json reader (parse_safetensors_index, which Checkpoint::open calls on the
// file's text before it opens the shards the index names; the shards are the safetensors target's).
#include <cstdint>
#include <string>

#include "core/io/safetensors.h"

using namespace hr;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto weight_map = core::parse_safetensors_index(std::string(reinterpret_cast<const char*>(data), size),
                                                          "fuzz/model.safetensors.index.json");
    for (const auto& [tensor, file] : weight_map)
      if (file.empty() || file.find('/') != std::string::npos) __builtin_trap();
  } catch (const Error&) {
  }
  return 0;
}
