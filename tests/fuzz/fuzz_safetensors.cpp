// Fuzzes the safetensors reader (the header checks every checkpoint file goes through) on in-memory bytes,
// then reads every tensor it accepted: an accepted header must describe bytes that exist.
#include <cstdint>
#include <string>

#include "core/io/safetensors.h"

using namespace hr;
using namespace hr::core;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    SafetensorsFile f =
        SafetensorsFile::from_bytes("fuzz.safetensors", std::string(reinterpret_cast<const char*>(data), size));
    for (const std::string& name : f.names()) {
      Tensor t = f.get(name);
      std::vector<float> values = t.to_floats();  // reads every element (ASan: inside the buffer)
      if (values.size() != std::size_t(t.numel())) __builtin_trap();
    }
    for (const auto& [key, value] : f.metadata()) (void)key.size(), (void)value.size();
  } catch (const Error&) {
    // A clear error naming the file is the expected outcome for a bad header.
  }
  return 0;
}
