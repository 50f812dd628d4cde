// Image decode (stb), padding, bicubic resize and CLIP normalisation.
#include "data/image.h"

#include <stb/stb_image.h>
#include <stb/stb_image_write.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/memory/category.h"
#include "data/stb.h"

namespace hr::data {

using namespace hr::core;

namespace {

double cubic(double x) {  // Keys kernel with a = -0.5
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2) return (((x - 5) * x + 8) * x - 4) * a;
  return 0;
}

// Resamples one axis: for each output index, weights over input indices, as PIL's precompute_coeffs makes them
// and normalize_coeffs_8bpc turns them into fixed point (22 fractional bits, rounded half away from zero).
constexpr int kPrecisionBits = 32 - 8 - 2;

struct Axis {
  std::vector<int> first;
  std::vector<std::vector<int32_t>> weights;
};

Axis make_axis(int in, int out) {
  Axis ax;
  const double scale = double(in) / out, filter_scale = std::max(scale, 1.0), support = 2.0 * filter_scale;
  for (int o = 0; o < out; ++o) {
    const double center = (o + 0.5) * scale;
    const int lo = std::max(0, int(center - support + 0.5)), hi = std::min(in, int(center + support + 0.5));
    std::vector<double> w;
    double total = 0;
    for (int i = lo; i < hi; ++i) {
      const double v = cubic((i - center + 0.5) / filter_scale);
      w.push_back(v);
      total += v;
    }
    std::vector<int32_t> fixed;
    for (double v : w) {
      const double k = total != 0.0 ? v / total : v;
      fixed.push_back(int32_t(k < 0 ? -0.5 + k * (1 << kPrecisionBits) : 0.5 + k * (1 << kPrecisionBits)));
    }
    ax.first.push_back(lo);
    ax.weights.push_back(std::move(fixed));
  }
  return ax;
}

uint8_t clip8(int64_t v) {  // PIL's clip8: the accumulator back to a byte
  if (v >= (int64_t(1) << kPrecisionBits << 8)) return 255;
  if (v <= 0) return 0;
  return uint8_t(v >> kPrecisionBits);
}
}  // namespace

AspectMode parse_aspect(const std::string& s) {
  if (s == "pad") return AspectMode::Pad;
  if (s == "resize") return AspectMode::Resize;
  if (s == "square") return AspectMode::Square;
  throw Error(str("[config] data.image_aspect_ratio '", s, "' is not one of: pad, resize, square"));
}

namespace {

constexpr uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
constexpr std::size_t kPngChunkOverhead = 12;  // length, type, CRC: 4 bytes each

uint32_t big_endian32(const uint8_t* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3];
}

std::string chunk_name(const uint8_t* type) {
  std::string s;
  for (int i = 0; i < 4; ++i) {
    const bool letter = (type[i] >= 'A' && type[i] <= 'Z') || (type[i] >= 'a' && type[i] <= 'z');
    s += letter ? std::string(1, char(type[i]))
                : str("\\x", "0123456789abcdef"[type[i] >> 4], "0123456789abcdef"[type[i] & 15]);
  }
  return s;
}

// stb skips PNG CRCs, so a corrupt file would decode into wrong pixels and train silently; libpng and Pillow
// refuse it. Every chunk up to IEND must be whole and carry the CRC (zlib's crc32) of its type and data.
void check_png_chunks(const uint8_t* data, std::size_t size, const std::string& name) {
  std::size_t at = sizeof kPngSignature;
  for (bool first = true;; first = false) {
    HR_CHECK(size - at >= kPngChunkOverhead, "[image] ", name, ": PNG ends at byte ", size,
             " before its IEND chunk (truncated file?)");
    const uint32_t length = big_endian32(data + at);
    const uint8_t* type = data + at + 4;
    const std::string chunk = chunk_name(type);
    HR_CHECK(length <= size - at - kPngChunkOverhead, "[image] ", name, ": PNG chunk '", chunk, "' at byte ", at,
             " claims ", length, " bytes, past the end of the ", size, "-byte file (truncated file?)");
    HR_CHECK(!first || std::memcmp(type, "IHDR", 4) == 0, "[image] ", name, ": PNG starts with chunk '", chunk,
             "', not IHDR");
    const uint32_t stored = big_endian32(type + 4 + length);
    const uint32_t computed = uint32_t(crc32(crc32(0L, Z_NULL, 0), type, 4 + length));
    HR_CHECK(stored == computed, "[image] ", name, ": PNG chunk '", chunk, "' at byte ", at, " has CRC ",
             str(std::hex, stored), " but its bytes give ", str(std::hex, computed), " (corrupt file)");
    if (std::memcmp(type, "IEND", 4) == 0) return;
    at += kPngChunkOverhead + length;
  }
}

// A JPEG cut short still decodes in stb (missing data reads as zeros); its end-of-image marker is gone. Byte
// stuffing keeps FF D9 out of entropy-coded data, so its absence means the file is truncated.
void check_jpeg_end(const uint8_t* data, std::size_t size, const std::string& name) {
  for (std::size_t i = size; i >= 4; --i)
    if (data[i - 2] == 0xFF && data[i - 1] == 0xD9) return;
  throw Error(str("[image] ", name, ": JPEG has no end-of-image marker (truncated file?)"));
}

constexpr uint8_t kJpegDht = 0xC4, kJpegEoi = 0xD9, kJpegSos = 0xDA, kJpegSof0 = 0xC0, kJpegSof2 = 0xC2;
constexpr std::size_t kHuffmanCounts = 16, kMaxHuffmanCodes = 256, kHuffmanSlots = 4;

// The Huffman tables defined so far, by class (DC, AC) and slot, and the frame type: stb keeps them in memory
// it does not initialise, so a scan may only use a table a DHT segment defined before it.
struct JpegTables {
  bool defined[2][kHuffmanSlots] = {};
  bool progressive = false;
};

// The Huffman tables of one DHT segment: per table a class/id byte, 16 code counts, then that many symbols.
void check_jpeg_dht(const uint8_t* p, std::size_t length, std::size_t at, const std::string& name, JpegTables& tables) {
  while (length > 0) {
    HR_CHECK(length >= 1 + kHuffmanCounts, "[image] ", name, ": JPEG Huffman table segment at byte ", at,
             " is cut short");
    std::size_t codes = 0;
    for (std::size_t i = 0; i < kHuffmanCounts; ++i) codes += p[1 + i];
    HR_CHECK(codes <= kMaxHuffmanCodes, "[image] ", name, ": JPEG Huffman table at byte ", at, " has ", codes,
             " codes; at most ", kMaxHuffmanCodes, " exist (corrupt file)");
    HR_CHECK(length >= 1 + kHuffmanCounts + codes, "[image] ", name, ": JPEG Huffman table segment at byte ", at,
             " is cut short");
    const int table_class = p[0] >> 4, slot = p[0] & 15;
    if (table_class <= 1 && slot < int(kHuffmanSlots)) tables.defined[table_class][slot] = true;  // else stb refuses
    p += 1 + kHuffmanCounts + codes;
    length -= 1 + kHuffmanCounts + codes;
  }
}

// A scan header: component count, then per component its id and DC/AC table slots, then the spectral range
// and successive-approximation bits. The tables the scan decodes with must be defined: a baseline scan uses
// both, a progressive DC scan its DC table (none when refining), a progressive AC scan its AC table.
void check_jpeg_sos(const uint8_t* p, std::size_t length, std::size_t at, const std::string& name,
                    const JpegTables& tables) {
  if (length < 1 || length != 1 + 2 * std::size_t(p[0]) + 3) return;  // stb refuses the header itself
  const std::size_t components = p[0];
  const uint8_t spectral_start = p[1 + 2 * components], high_bit = p[1 + 2 * components + 2] >> 4;
  const bool uses_dc = !tables.progressive || (spectral_start == 0 && high_bit == 0);
  const bool uses_ac = !tables.progressive || spectral_start != 0;
  for (std::size_t i = 0; i < components; ++i) {
    const int dc = p[2 + 2 * i] >> 4, ac = p[2 + 2 * i] & 15;
    const auto check = [&](bool used, int table_class, int slot) {
      if (!used || slot >= int(kHuffmanSlots)) return;  // stb refuses slots past 3
      HR_CHECK(tables.defined[table_class][slot], "[image] ", name, ": JPEG scan at byte ", at, " decodes with ",
               table_class == 0 ? "DC" : "AC", " Huffman table ", slot,
               ", which no DHT segment before it defines (corrupt file)");
    };
    check(uses_dc, 0, dc);
    check(uses_ac, 1, ac);
  }
}

// stb_image 2.27 (Debian 12's libstb) does not check that a Huffman table's code counts sum to at most 256
// and writes past its tables when they do (checked upstream since 2.28), nor that a scan's tables were ever
// defined. Every marker segment, before and between scans, is walked here as stb reads them, and each DHT
// and SOS checked before stb sees it.
void check_jpeg_segments(const uint8_t* data, std::size_t size, const std::string& name) {
  JpegTables tables;
  std::size_t at = 2;  // after SOI
  while (at + 1 < size) {
    if (data[at] != 0xFF || data[at + 1] == 0xFF) {  // entropy-coded data, or fill bytes before a marker
      ++at;
      continue;
    }
    const uint8_t marker = data[at + 1];
    if (marker == kJpegEoi) return;
    if (marker == 0x00 || marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) {  // stuffed FF, TEM, RSTn: no length
      at += 2;
      continue;
    }
    HR_CHECK(at + 4 <= size, "[image] ", name, ": JPEG segment at byte ", at, " is cut short (truncated file?)");
    const std::size_t length = std::size_t(data[at + 2]) << 8 | data[at + 3];
    HR_CHECK(length >= 2 && length <= size - at - 2, "[image] ", name, ": JPEG segment at byte ", at, " claims ",
             length, " bytes, past the end of the ", size, "-byte file (truncated file?)");
    if (marker >= kJpegSof0 && marker <= kJpegSof2) tables.progressive = marker == kJpegSof2;
    if (marker == kJpegDht) check_jpeg_dht(data + at + 4, length - 2, at, name, tables);
    if (marker == kJpegSos) check_jpeg_sos(data + at + 4, length - 2, at, name, tables);
    at += 2 + length;
  }
}

}  // namespace

RgbImage decode_image_bytes(const uint8_t* data, std::size_t size, const std::string& name, int64_t max_pixels) {
  max_pixels = std::min(max_pixels, kMaxImagePixels);
  const bool png = size >= sizeof kPngSignature && std::memcmp(data, kPngSignature, sizeof kPngSignature) == 0;
  const bool jpeg = size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF;
  HR_CHECK(png || jpeg, "[image] ", name, ": not a PNG or JPEG file");
  if (png) {
    check_png_chunks(data, size, name);
  } else {
    check_jpeg_end(data, size, name);
    check_jpeg_segments(data, size, name);
  }
  HR_CHECK(size <= std::size_t(INT32_MAX), "[image] ", name, ": ", size, " bytes is more than stb reads");
  const auto reason = [] { return stbi_failure_reason() ? stbi_failure_reason() : "unknown"; };
  stb::DecodeScope scope;  // frees what stb holds if anything below throws
  try {
    int w = 0, h = 0, c = 0;
    HR_CHECK(stbi_info_from_memory(data, int(size), &w, &h, &c), "[image] ", name, ": cannot decode (", reason(), ")");
    HR_CHECK(int64_t(w) * h <= max_pixels, "[image] ", name, ": ", w, " x ", h, " pixels is above the limit of ",
             max_pixels, " (a decompression bomb?)");
    unsigned char* pixels = stbi_load_from_memory(data, int(size), &w, &h, &c, 3);
    HR_CHECK(pixels, "[image] ", name, ": cannot decode (", reason(), ")");
    return RgbImage{w, h, std::vector<uint8_t>(pixels, pixels + std::size_t(w) * h * 3)};
  } catch (const stb::StbAssertion& e) {
    throw Error(str("[image] ", name, ": cannot decode (corrupt ", png ? "PNG" : "JPEG", ": ", e.what(), ")"));
  }
}

RgbImage decode_image(const std::string& path) {
  // A directory opens as a stream and fails only when read, with std::ios_base::failure.
  std::error_code ec;
  HR_CHECK(std::filesystem::is_regular_file(path, ec), "[image] ", path, ": not a regular file");
  std::ifstream in(path, std::ios::binary);
  HR_CHECK(in, "[image] ", path, ": cannot open");
  std::string bytes;
  try {
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } catch (const std::exception& e) {
    throw Error(str("[image] ", path, ": cannot read (", e.what(), ")"));
  }
  return decode_image_bytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), path);
}

std::optional<Resolution> image_resolution(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  // A PNG's size is in its first 24 bytes; a JPEG's frame header can come after its metadata segments (EXIF, a
  // thumbnail): 4 KiB, then more, up to 1 MiB, until stb's probe finds it.
  std::string head;
  for (std::size_t want = 4096; want <= (std::size_t(1) << 20); want *= 16) {
    const std::size_t had = head.size();
    head.resize(want);
    in.read(head.data() + had, std::streamsize(want - had));
    head.resize(had + std::size_t(in.gcount()));
    stb::DecodeScope scope;
    try {
      int w = 0, h = 0, c = 0;
      if (stbi_info_from_memory(reinterpret_cast<const uint8_t*>(head.data()), int(head.size()), &w, &h, &c) && w > 0 &&
          h > 0)
        return Resolution{h, w};
    } catch (const stb::StbAssertion&) {
      return std::nullopt;
    }
    if (!in) return std::nullopt;  // the whole file was read
  }
  return std::nullopt;
}

void write_png(const std::string& path, const RgbImage& image) {
  HR_CHECK(stbi_write_png(path.c_str(), image.width, image.height, 3, image.pixels.data(), image.width * 3),
           "[image] cannot write ", path);
}

RgbImage expand_to_square(const RgbImage& img, const uint8_t fill[3]) {
  if (img.width == img.height) return img;
  const int side = std::max(img.width, img.height);
  RgbImage out{side, side, std::vector<uint8_t>(std::size_t(side) * side * 3)};
  for (int i = 0; i < side * side; ++i)
    for (int ch = 0; ch < 3; ++ch) out.pixels[std::size_t(i) * 3 + ch] = fill[ch];
  const int ox = (side - img.width) / 2, oy = (side - img.height) / 2;
  for (int y = 0; y < img.height; ++y)
    std::copy_n(&img.pixels[std::size_t(y) * img.width * 3], img.width * 3,
                &out.pixels[(std::size_t(y + oy) * side + ox) * 3]);
  return out;
}

// PIL's ImagingResample on 8-bit RGB: a horizontal pass into an 8-bit image, then a vertical one, each in fixed
// point with rounding; a pass is skipped where that side keeps its size.
RgbImage resize_bicubic(const RgbImage& img, int width, int height) {
  if (img.width == width && img.height == height) return img;
  RgbImage mid = img;
  if (img.width != width) {
    const Axis ax = make_axis(img.width, width);
    mid = RgbImage{width, img.height, std::vector<uint8_t>(std::size_t(width) * img.height * 3)};
    for (int y = 0; y < img.height; ++y)
      for (int x = 0; x < width; ++x)
        for (int ch = 0; ch < 3; ++ch) {
          int64_t s = int64_t(1) << (kPrecisionBits - 1);
          for (std::size_t k = 0; k < ax.weights[x].size(); ++k)
            s += int64_t(img.pixels[(std::size_t(y) * img.width + ax.first[x] + k) * 3 + ch]) * ax.weights[x][k];
          mid.pixels[(std::size_t(y) * width + x) * 3 + ch] = clip8(s);
        }
  }
  if (img.height == height) return mid;
  const Axis ay = make_axis(img.height, height);
  RgbImage out{width, height, std::vector<uint8_t>(std::size_t(width) * height * 3)};
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int ch = 0; ch < 3; ++ch) {
        int64_t s = int64_t(1) << (kPrecisionBits - 1);
        for (std::size_t k = 0; k < ay.weights[y].size(); ++k)
          s += int64_t(mid.pixels[((ay.first[y] + k) * std::size_t(width) + x) * 3 + ch]) * ay.weights[y][k];
        out.pixels[(std::size_t(y) * width + x) * 3 + ch] = clip8(s);
      }
  return out;
}

RgbImage crop(const RgbImage& img, int x, int y, int w, int h) {
  w = std::min(w, img.width - x);
  h = std::min(h, img.height - y);
  RgbImage out{w, h, std::vector<uint8_t>(std::size_t(w) * std::size_t(h) * 3)};
  for (int r = 0; r < h; ++r)
    std::memcpy(&out.pixels[std::size_t(r) * std::size_t(w) * 3],
                &img.pixels[(std::size_t(y + r) * std::size_t(img.width) + std::size_t(x)) * 3], std::size_t(w) * 3);
  return out;
}

RgbImage shortest_edge_and_crop(const RgbImage& img, int size) {
  const bool portrait = img.width <= img.height;
  const int shorter = portrait ? img.width : img.height, longer = portrait ? img.height : img.width;
  const auto scaled = int(int64_t(size) * longer / shorter);  // Python's int(size * long / short), both positive
  const int w = portrait ? size : scaled, h = portrait ? scaled : size;
  const RgbImage r = resize_bicubic(img, w, h);
  return crop(r, (w - size) / 2, (h - size) / 2, size, size);
}

Tensor clip_tensor(const RgbImage& sq, int64_t size, const ImageNorm& norm) {
  RgbImage img = resize_bicubic(sq, int(size), int(size));
  MemoryScope scope(Category::IO, "loader");
  Tensor t = Tensor::empty({3, size, size}, DType::F32, Device::host());
  float* p = t.data<float>();
  for (int64_t ch = 0; ch < 3; ++ch)
    for (int64_t i = 0; i < size * size; ++i)
      p[ch * size * size + i] = (img.pixels[std::size_t(i) * 3 + ch] / 255.f - norm.mean[ch]) / norm.std[ch];
  return t;
}

Tensor clip_image(RgbImage img, const std::string& name, int64_t size, AspectMode mode, const ImageNorm& norm,
                  ImageProcessor processor) {
  HR_CHECK(img.width > 0 && img.height > 0, "[image] ", name, " has no pixels");
  if (mode == AspectMode::Square && processor == ImageProcessor::Clip) {
    const int64_t longer = size * std::max(img.width, img.height) / std::min(img.width, img.height);
    HR_CHECK(size * longer <= kMaxImagePixels, "[image] ", name, ": ", img.width, " x ", img.height, " resizes to ",
             size, " x ", longer, " before its centre crop, above the limit of ", kMaxImagePixels, " pixels");
    return clip_tensor(shortest_edge_and_crop(img, int(size)), size, norm);
  }
  if (mode == AspectMode::Pad) {
    const int64_t side = std::max(img.width, img.height);
    HR_CHECK(side * side <= kMaxImagePixels, "[image] ", name, ": ", img.width, " x ", img.height, " pads to a ", side,
             " x ", side, " square, above the limit of ", kMaxImagePixels, " pixels");
    uint8_t fill[3];
    for (int ch = 0; ch < 3; ++ch)
      fill[ch] = uint8_t(std::clamp(int(norm.mean[ch] * 255), 0, 255));  // int(): truncates
    img = expand_to_square(img, fill);
  }
  return clip_tensor(img, size, norm);
}

Tensor load_clip_image(const std::string& path, int64_t size, AspectMode mode, const ImageNorm& norm,
                       ImageProcessor processor) {
  return clip_image(decode_image(path), path, size, mode, norm, processor);
}

namespace {

using json = nlohmann::json;

// The error for `key` of the preprocessor_config.json `path`: its value and why it is refused.
Error refuse(const json& j, const std::string& path, const std::string& key, const std::string& why) {
  return Error(str("[image] ", path, ": ", key, " = ", j.contains(key) ? j[key].dump() : "(absent)", ": ", why));
}

bool three_numbers(const json& v) {
  return v.is_array() && v.size() == 3 && v[0].is_number() && v[1].is_number() && v[2].is_number();
}

// image_mean and image_std, where the file gives them.
ImageNorm read_norm(const json& j, const std::string& path) {
  ImageNorm n;
  for (const char* key : {"image_mean", "image_std"}) {
    if (!j.contains(key)) continue;
    const auto& v = j[key];
    if (!three_numbers(v)) throw refuse(j, path, key, "needs three numbers (R, G, B)");
    for (int ch = 0; ch < 3; ++ch) {
      const double x = v[std::size_t(ch)].get<double>();
      if (!(std::fabs(x) <= 1e6)) throw refuse(j, path, key, "values must be finite numbers of a sensible size");
      (std::string(key) == "image_mean" ? n.mean : n.std)[ch] = float(x);
    }
  }
  for (int ch = 0; ch < 3; ++ch)
    if (!(n.std[ch] > 0)) throw refuse(j, path, "image_std", "every value must be positive");
  return n;
}

// The steps headroom always takes as LLaVA's CLIP processor does: bicubic, rescale by 1/255, normalise, RGB.
void check_fixed_steps(const json& j, const std::string& path) {
  if (j.contains("resample") && j["resample"] != 3)
    throw refuse(j, path, "resample", "only 3 (bicubic) is implemented");
  for (const char* key : {"do_rescale", "do_normalize", "do_convert_rgb"})
    if (j.contains(key) && j[key] == false)
      throw refuse(j, path, key, "headroom always does it, as LLaVA's CLIP processor");
  if (j.contains("rescale_factor") &&
      (!j["rescale_factor"].is_number() || std::fabs(j["rescale_factor"].get<double>() - 1.0 / 255) > 1e-9))
    throw refuse(j, path, "rescale_factor", "only 1/255 is implemented");
}

// Whether `key` asks for `size` x `size`: a number, or an object with shortest_edge, or with height and width
// (each where given); true where the key is absent.
bool asks_for(const json& j, const std::string& path, const char* key, int64_t size) {
  if (!j.contains(key)) return true;
  const auto& v = j[key];
  if (v.is_number_integer()) return v.get<int64_t>() == size;
  bool any = false, all = true;
  for (const char* field : {"shortest_edge", "height", "width"})
    if (v.is_object() && v.contains(field) && !v[field].is_null()) {
      if (!v[field].is_number_integer()) throw refuse(j, path, key, str("its ", field, " is not a whole number"));
      any = true;
      all = all && v[field].get<int64_t>() == size;
    }
  if (!any) throw refuse(j, path, key, "is neither a number nor an object with shortest_edge or height and width");
  if (v.contains("height") != v.contains("width")) throw refuse(j, path, key, "gives one of height and width");
  return all;
}

ImageNorm parse_preprocessor(const json& j, const std::string& path, int64_t size) {
  const ImageNorm n = read_norm(j, path);
  check_fixed_steps(j, path);
  // The resize (shortest edge, or height and width) and the crop must both land on the vision tower's size.
  if (j.value("do_resize", true) && !asks_for(j, path, "size", size))
    throw refuse(j, path, "size", str("the vision tower takes ", size, " x ", size, " images"));
  if (j.value("do_center_crop", true) && !asks_for(j, path, "crop_size", size))
    throw refuse(j, path, "crop_size", str("the vision tower takes ", size, " x ", size, " images"));
  return n;
}

}  // namespace

ImageNorm read_preprocessor_config(const std::string& path, int64_t size) {
  nlohmann::json j;
  try {
    std::ifstream in(path, std::ios::binary);
    HR_CHECK(in, "[image] cannot open ", path);
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(str("[image] ", path, " is not valid JSON: ", e.what()));
  }
  HR_CHECK(j.is_object(), "[image] ", path, " is not a JSON object");
  try {
    return parse_preprocessor(j, path, size);
  } catch (const nlohmann::json::exception& e) {
    throw Error(str("[image] ", path, " is malformed: ", e.what()));
  }
}

std::string preprocessor_config_json(int64_t size, const ImageNorm& n, ImageProcessor kind,
                                     const std::vector<Resolution>& pinpoints) {
  nlohmann::json j = {{"do_convert_rgb", true},
                      {"do_normalize", true},
                      {"do_rescale", true},
                      {"do_resize", true},
                      {"image_mean", {n.mean[0], n.mean[1], n.mean[2]}},
                      {"image_std", {n.std[0], n.std[1], n.std[2]}},
                      {"processor_class", "LlavaProcessor"},
                      {"resample", 3},
                      {"rescale_factor", 1.0 / 255}};
  if (kind == ImageProcessor::Siglip) {  // transformers' SiglipImageProcessor: the whole image to the square
    j["image_processor_type"] = "SiglipImageProcessor";
    j["size"] = {{"height", size}, {"width", size}};
  } else {  // CLIPImageProcessor: the shortest edge, then a centre crop
    j["image_processor_type"] = "CLIPImageProcessor";
    j["size"] = {{"shortest_edge", size}};
    j["crop_size"] = {{"height", size}, {"width", size}};
    j["do_center_crop"] = true;
  }
  if (!pinpoints.empty()) {
    j["image_processor_type"] =
        kind == ImageProcessor::Siglip ? "LlavaOnevisionImageProcessor" : "LlavaNextImageProcessor";
    j["processor_class"] = kind == ImageProcessor::Siglip ? "LlavaOnevisionProcessor" : "LlavaNextProcessor";
    j["do_pad"] = true;
    nlohmann::json grid = nlohmann::json::array();
    for (const Resolution& p : pinpoints) grid.push_back({p.height, p.width});
    j["image_grid_pinpoints"] = grid;
  }
  return j.dump(2) + "\n";
}

}  // namespace hr::data
