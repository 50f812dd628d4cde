// Fuzzes the LLaVA dataset reader (a JSON array or JSON lines) and the processing of every entry it holds:
// templates, truncation, and images from a real synthetic image folder. Bad entries must be BadSample.
#include <algorithm>
#include <cstdint>
#include <string>

#include "data/dataset.h"
#include "fuzz_inputs.h"

using namespace hr;
using namespace hr::data;

namespace {
std::string g_dir;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_dir = fuzz::scratch_dir("dataset");
  write_synthetic_vqa(fuzz::synth_options(g_dir));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  DataOptions o;
  o.json_path = "fuzz.json";
  o.image_folder = g_dir;
  o.max_seq_len = 96;  // the synthetic entries run past it: truncation is exercised
  o.chat_template = size % 2 ? Template::Plain : Template::VicunaV1;  // both templates, without twice the work
  try {
    LlavaDataset d(o, fuzz::input_spec(), text);
    for (int64_t i = 0; i < d.size(); ++i) {
      (void)d.length(i), (void)d.name(i);
      try {
        Example ex = d.get(i);
        if (ex.ids.size() != ex.labels.size() || int64_t(ex.ids.size()) > o.max_seq_len) __builtin_trap();
        // Truncation keeps an image only with all its placeholders (the model needs one run of them per image).
        const auto placeholders = std::count(ex.ids.begin(), ex.ids.end(), fuzz::input_spec().image_token_id);
        if (placeholders != int64_t(ex.images.size()) * fuzz::input_spec().tokens_per_image) __builtin_trap();
      } catch (const BadSample&) {
      }
    }
  } catch (const Error&) {
    // The whole file is unusable (not JSON): a clear error naming it.
  }
  return 0;
}
