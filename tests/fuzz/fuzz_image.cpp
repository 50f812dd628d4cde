// Fuzzes image decoding as the dataset does it (magic check, PNG chunk CRCs, JPEG end marker, size limit,
// stb's PNG/JPEG decoders) and the CLIP preprocessing of what decodes, padded and resized.
#include <cstdint>
#include <string>

#include "data/image.h"

using namespace hr;
using namespace hr::data;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    RgbImage img = decode_image_bytes(data, size, "fuzz.img");
    if (img.pixels.size() != std::size_t(img.width) * img.height * 3) __builtin_trap();
    for (AspectMode mode : {AspectMode::Pad, AspectMode::Resize}) {
      core::Tensor t = clip_image(img, "fuzz.img", 8, mode);
      if (t.numel() != 3 * 8 * 8) __builtin_trap();
    }
  } catch (const Error&) {
  }
  return 0;
}
