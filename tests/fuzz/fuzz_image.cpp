// Fuzzes image decoding as the dataset does it (magic check, PNG chunk CRCs, JPEG end marker, size limit,
// stb's PNG/JPEG decoders) and the CLIP preprocessing of what decodes, padded and resized.
#include <algorithm>
#include <cstdint>
#include <string>

#include "data/image.h"

using namespace hr;
using namespace hr::data;

namespace {
// A lower pixel limit than headroom's: a few hundred bytes of JPEG can declare tens of millions of pixels that stb
// decodes as zeros, seconds under ASan each, which slows the fuzzer a hundredfold and finds nothing new. The
// limit's error path still runs; the production limit itself is a unit test (tests/unit/test_data.cpp).
constexpr int64_t kFuzzMaxPixels = int64_t(1) << 16;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    RgbImage img = decode_image_bytes(data, size, "fuzz.img", kFuzzMaxPixels);
    if (img.pixels.size() != std::size_t(img.width) * img.height * 3) __builtin_trap();
    // The padded square of an elongated image can hold 256 times the pixels: the same limit applies to it.
    const int64_t side = std::max(img.width, img.height);
    if (side * side > kFuzzMaxPixels) return 0;
    // every mode, without three times the work
    const AspectMode mode = size % 3 == 0 ? AspectMode::Pad : size % 3 == 1 ? AspectMode::Resize : AspectMode::Square;
    core::Tensor t = clip_image(img, "fuzz.img", 8, mode);
    if (t.numel() != 3 * 8 * 8) __builtin_trap();
  } catch (const Error&) {
  }
  return 0;
}
