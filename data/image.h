// Image input: PNG/JPEG decode, LLaVA's expand2square padding or a plain resize, bicubic resampling to the
// vision tower's size, CLIP mean/std normalisation into a (3, size, size) f32 tensor.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/batch.h"

namespace hr::data {

// data.image_aspect_ratio. pad: LLaVA's expand2square, then the tower's size; resize: the whole image resized to
// the tower's size; square: the tower's own processor on the image as it is, as LLaVA does for every value but
// pad and anyres (CLIPImageProcessor: the shortest edge to the size and a centre crop; SiglipImageProcessor: resize).
enum class AspectMode : uint8_t { Pad, Resize, Square };
AspectMode parse_aspect(const std::string& s);

struct RgbImage {
  int width = 0, height = 0;
  std::vector<uint8_t> pixels;  // row-major RGB
};

// Images above Pillow's decompression-bomb warning size (its Image.MAX_IMAGE_PIXELS) are refused before any
// pixel is decoded; so is a padded square above it.
constexpr int64_t kMaxImagePixels = 89'478'485;

// Throws naming the file when it is missing or not a decodable PNG/JPEG: other formats, a PNG chunk whose CRC
// is wrong, a JPEG without its end-of-image marker (truncated) and images above kMaxImagePixels are refused.
RgbImage decode_image(const std::string& path);
// The same on bytes in memory; `name` stands for the path in errors. `max_pixels` may only lower the limit.
RgbImage decode_image_bytes(const uint8_t* data, std::size_t size, const std::string& name,
                            int64_t max_pixels = kMaxImagePixels);
void write_png(const std::string& path, const RgbImage& image);
// A PNG's or JPEG's size from its header, nothing decoded; nothing where the file cannot be read as one (its
// decoding says why, when the sample is loaded).
std::optional<Resolution> image_resolution(const std::string& path);

// Pads the shorter side with `fill` so the image becomes square, content centred (LLaVA's expand2square).
RgbImage expand_to_square(const RgbImage& image, const uint8_t fill[3]);
// Bicubic resampling (a = -0.5, antialiased when shrinking, as PIL's BICUBIC).
RgbImage resize_bicubic(const RgbImage& image, int width, int height);
// The rectangle at (x, y) of `image`, `w` x `h` (clipped to the image).
RgbImage crop(const RgbImage& image, int x, int y, int w, int h);
// CLIPImageProcessor's resize (the shortest edge to `size`, the other int(size x long / short)) and centre crop.
RgbImage shortest_edge_and_crop(const RgbImage& image, int size);

// The image processor's normalisation: CLIP's mean and std unless a preprocessor_config.json says otherwise.
struct ImageNorm {
  float mean[3] = {0.48145466f, 0.4578275f, 0.40821073f};
  float std[3] = {0.26862954f, 0.26130258f, 0.27577711f};
  // SiglipImageProcessor's: 0.5 for every channel.
  static ImageNorm siglip() { return {{0.5f, 0.5f, 0.5f}, {0.5f, 0.5f, 0.5f}}; }
};

// A Hugging Face preprocessor_config.json (CLIPImageProcessor, as llava-hf and CLIP directories hold it, or
// SiglipImageProcessor, as SigLIP's do): its mean and std. Throws naming the file and key when it asks for what
// LLaVA's pipeline does not do here: a resample other than bicubic, a resize or crop to another size than the
// vision tower's `size` x `size`, no rescale/normalise, a rescale factor other than 1/255.
ImageNorm read_preprocessor_config(const std::string& path, int64_t size);

// The image processor a checkpoint names for its tower: CLIPImageProcessor (the shortest edge to `size`, then
// a centre crop) or SiglipImageProcessor (a resize of the whole image to `size` x `size`, no crop). On a padded
// square (data.image_aspect_ratio: pad, LLaVA's) both equal headroom's resize; with `resize` headroom's equals
// SiglipImageProcessor's.
enum class ImageProcessor : uint8_t { Clip, Siglip };
// The preprocessor_config.json that processor at `size` with `norm` reads (what checkpoints carry). With AnyRes
// `pinpoints` it is LLaVA-NeXT's processor over CLIP's steps (LlavaNextImageProcessor) or OneVision's over SigLIP's
// (LlavaOnevisionImageProcessor), with image_grid_pinpoints.
std::string preprocessor_config_json(int64_t size, const ImageNorm& norm, ImageProcessor kind = ImageProcessor::Clip,
                                     const std::vector<Resolution>& pinpoints = {});

// decode + pad/resize/crop + normalise: a (3, size, size) f32 tensor on the host, tagged io. The padding colour is
// LLaVA's tuple(int(x * 255) for x in image_mean); `processor` is what `square` runs.
core::Tensor load_clip_image(const std::string& path, int64_t size, AspectMode mode, const ImageNorm& norm = {},
                             ImageProcessor processor = ImageProcessor::Clip);
// pad/resize/crop + normalise of a decoded image; `name` stands for its file in errors.
core::Tensor clip_image(RgbImage image, const std::string& name, int64_t size, AspectMode mode,
                        const ImageNorm& norm = {}, ImageProcessor processor = ImageProcessor::Clip);
core::Tensor clip_tensor(const RgbImage& square, int64_t size, const ImageNorm& norm = {});

}  // namespace hr::data
