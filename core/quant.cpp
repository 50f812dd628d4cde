// Quantization formats of frozen weights, their blobs, and the reference quantize/dequantize.
#include "core/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"

namespace hr::core {

const char* quant_type_name(QuantType t) {
  switch (t) {
    case QuantType::Int8:
      return "int8";
    case QuantType::NF4:
      return "nf4";
    case QuantType::FP4:
      return "fp4";
  }
  return "?";
}

QuantType parse_quant_type(const std::string& s) {
  if (s == "nf4") return QuantType::NF4;
  if (s == "fp4") return QuantType::FP4;
  throw Error(str("[config] quant type '", s, "' is not one of: nf4, fp4"));
}

std::string QuantFormat::describe() const {
  if (type == QuantType::Int8) return "int8 (absmax per output channel)";
  return str(quant_type_name(type), " (block ", block, double_quant ? ", double quant)" : ")");
}

std::string QuantLayout::describe() const {
  return str(format.describe(), " ", rows, "x", cols);
}

namespace {
int64_t align4(int64_t v) {
  return (v + 3) / 4 * 4;
}

struct Header {
  char magic[4];
  uint8_t type, double_quant;
  uint16_t reserved;
  int32_t block;
  float offset;
  int64_t rows, cols;
};
static_assert(sizeof(Header) == kQuantHeaderBytes, "the blob header is 32 bytes");

Header header_of(const uint8_t* blob) {
  Header h;
  std::memcpy(&h, blob, sizeof h);
  return h;
}
float f32_at(const uint8_t* blob, int64_t offset) {
  float v;
  std::memcpy(&v, blob + offset, 4);
  return v;
}
}  // namespace

QuantLayout QuantLayout::of(const QuantFormat& f, int64_t rows, int64_t cols) {
  HR_CHECK(rows > 0 && cols > 0, "[quant] a quantized weight needs rows and columns; got ", rows, "x", cols);
  HR_CHECK(f.type == QuantType::Int8 || f.block > 0, "[quant] block size must be positive; got ", f.block);
  QuantLayout l;
  l.format = f;
  if (f.type == QuantType::Int8) l.format.double_quant = false, l.format.block = cols;
  l.rows = rows;
  l.cols = cols;
  const int64_t n = rows * cols;
  l.blocks = f.type == QuantType::Int8 ? rows : (n + f.block - 1) / f.block;
  const int64_t code_bytes = f.type == QuantType::Int8 ? n : (n + 1) / 2;
  l.absmax = align4(l.codes + code_bytes);
  if (l.format.double_quant) {
    l.absmax2 = align4(l.absmax + l.blocks);
    l.bytes = l.absmax2 + 4 * l.blocks2();
  } else {
    l.bytes = l.absmax + 4 * l.blocks;
  }
  return l;
}

const std::array<float, 16>& code4(QuantType t) {
  // NF4: QLoRA's Appendix E values (bitsandbytes' get_4bit_type('nf4')).
  static const std::array<float, 16> nf4 = {-1.0f,
                                            -0.6961928009986877f,
                                            -0.5250730514526367f,
                                            -0.39491748809814453f,
                                            -0.28444138169288635f,
                                            -0.18477343022823334f,
                                            -0.09105003625154495f,
                                            0.0f,
                                            0.07958029955625534f,
                                            0.16093020141124725f,
                                            0.24611230194568634f,
                                            0.33791524171829224f,
                                            0.44070982933044434f,
                                            0.5626170039176941f,
                                            0.7229568362236023f,
                                            1.0f};
  // FP4: bitsandbytes' e2m1 code (sign bit 3; 0b000 zero, 0b001 the subnormal), divided by its largest, 12.
  static const std::array<float, 16> fp4 = [] {
    const float raw[16] = {0, 0.0625f, 8, 12, 4, 6, 2, 3, -0.f, -0.0625f, -8, -12, -4, -6, -2, -3};
    std::array<float, 16> a{};
    for (int i = 0; i < 16; ++i) a[std::size_t(i)] = raw[i] / 12.f;
    return a;
  }();
  HR_ASSERT(t != QuantType::Int8, "code4 of int8");
  return t == QuantType::NF4 ? nf4 : fp4;
}

const std::array<float, 256>& dynamic_code8() {
  // bitsandbytes' create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): for exponent i = 0..6, the
  // midpoints of 2^i + 1 points spread over [0.1, 1], scaled by 10^(i - 6), with both signs; then 0 and 1.
  static const std::array<float, 256> code = [] {
    std::vector<float> v;
    for (int i = 0; i < 7; ++i) {
      const int items = (1 << i) + 1;
      std::vector<float> b(static_cast<std::size_t>(items));
      for (int j = 0; j < items; ++j) b[std::size_t(j)] = 0.1f + (1.f - 0.1f) * float(j) / float(items - 1);
      const float scale = float(std::pow(10.0, double(i - 6)));
      for (int j = 0; j + 1 < items; ++j) {
        const float mean = (b[std::size_t(j)] + b[std::size_t(j + 1)]) / 2.f;
        v.push_back(scale * mean);
        v.push_back(-scale * mean);
      }
    }
    v.push_back(0.f);
    v.push_back(1.f);
    HR_ASSERT(v.size() == 256, "dynamic code has ", v.size(), " values");
    std::sort(v.begin(), v.end());
    std::array<float, 256> a{};
    std::copy(v.begin(), v.end(), a.begin());
    return a;
  }();
  return code;
}

int nearest_code(const float* code, int n, float x) {
  int best = 0;
  float d = std::fabs(x - code[0]);
  for (int i = 1; i < n; ++i) {
    const float e = std::fabs(x - code[i]);
    if (e < d) d = e, best = i;
  }
  return best;
}

namespace {
// The nearest value of the sorted dynamic code (binary search, then the closer neighbour; the lower on a tie).
int nearest_sorted(const std::array<float, 256>& code, float x) {
  const auto it = std::lower_bound(code.begin(), code.end(), x);
  if (it == code.begin()) return 0;
  if (it == code.end()) return 255;
  const int hi = int(it - code.begin());
  return (x - code[std::size_t(hi - 1)] <= *it - x) ? hi - 1 : hi;
}
}  // namespace

namespace {

void put_f32(std::vector<uint8_t>& blob, int64_t offset, float v) {
  std::memcpy(blob.data() + offset, &v, 4);
}

// Int8: each row scaled by its absmax to [-127, 127].
void quantize_rows_int8(const float* w, const QuantLayout& l, int64_t rows, int64_t cols, std::vector<uint8_t>& blob) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = w + r * cols;
    float am = 0.f;
    for (int64_t c = 0; c < cols; ++c) am = std::max(am, std::fabs(row[c]));
    for (int64_t c = 0; c < cols; ++c) {
      const float q = am > 0.f ? std::nearbyint(row[c] * (127.f / am)) : 0.f;
      blob[std::size_t(l.codes + r * cols + c)] = uint8_t(int8_t(std::clamp(q, -127.f, 127.f)));
    }
    put_f32(blob, l.absmax + 4 * r, am);
  }
}

// NF4 / FP4: each block's elements by their nearest 4-bit code of the block's absmax scale, two to a byte; returns
// the absmax of every block.
std::vector<float> quantize_blocks_4bit(const float* w, const QuantLayout& l, std::vector<uint8_t>& blob) {
  const auto& code = code4(l.format.type);
  const int64_t n = l.numel();
  std::vector<float> absmax(std::size_t(l.blocks));
  for (int64_t b = 0; b < l.blocks; ++b) {
    const int64_t lo = b * l.format.block, hi = std::min(n, lo + l.format.block);
    float am = 0.f;
    for (int64_t i = lo; i < hi; ++i) am = std::max(am, std::fabs(w[i]));
    absmax[std::size_t(b)] = am;
    for (int64_t i = lo; i < hi; ++i) {
      const int q = nearest_code(code.data(), 16, am > 0.f ? w[i] / am : 0.f);
      uint8_t& byte = blob[std::size_t(l.codes + i / 2)];
      byte = uint8_t(i % 2 ? (byte & 0xF0) | q : (byte & 0x0F) | (q << 4));
    }
  }
  return absmax;
}

// QLoRA's double quantization: the block constants minus their mean, in 8-bit blocks of 256 (dynamic code); returns
// the mean (the header's offset).
float double_quantize(const std::vector<float>& absmax, const QuantLayout& l, std::vector<uint8_t>& blob) {
  double sum = 0;
  for (float a : absmax) sum += a;
  const float offset = float(sum / double(l.blocks));
  const auto& dyn = dynamic_code8();
  for (int64_t c = 0; c < l.blocks2(); ++c) {
    const int64_t lo = c * kDoubleQuantBlock, hi = std::min(l.blocks, lo + kDoubleQuantBlock);
    float am2 = 0.f;
    for (int64_t b = lo; b < hi; ++b) am2 = std::max(am2, std::fabs(absmax[std::size_t(b)] - offset));
    for (int64_t b = lo; b < hi; ++b)
      blob[std::size_t(l.absmax + b)] =
          uint8_t(nearest_sorted(dyn, am2 > 0.f ? (absmax[std::size_t(b)] - offset) / am2 : 0.f));
    put_f32(blob, l.absmax2 + 4 * c, am2);
  }
  return offset;
}

}  // namespace

std::vector<uint8_t> quantize(const float* w, int64_t rows, int64_t cols, const QuantFormat& f) {
  const QuantLayout l = QuantLayout::of(f, rows, cols);
  std::vector<uint8_t> blob(std::size_t(l.bytes), 0);
  for (int64_t i = 0; i < l.numel(); ++i)
    HR_CHECK(std::isfinite(w[i]), "[quant] element ", i, " (row ", i / cols, ", column ", i % cols, ") is ", w[i],
             "; only finite weights can be quantized");
  Header h{{'H', 'R', 'Q', '1'},
           uint8_t(l.format.type),
           uint8_t(l.format.double_quant),
           0,
           int32_t(l.format.block),
           0.f,
           rows,
           cols};
  if (l.format.type == QuantType::Int8) {
    quantize_rows_int8(w, l, rows, cols, blob);
  } else {
    const std::vector<float> absmax = quantize_blocks_4bit(w, l, blob);
    if (l.format.double_quant)
      h.offset = double_quantize(absmax, l, blob);
    else
      for (int64_t b = 0; b < l.blocks; ++b) put_f32(blob, l.absmax + 4 * b, absmax[std::size_t(b)]);
  }
  std::memcpy(blob.data(), &h, sizeof h);
  return blob;
}

QuantLayout read_layout(const uint8_t* blob, int64_t bytes, const std::string& what) {
  HR_CHECK(bytes >= kQuantHeaderBytes && std::memcmp(blob, "HRQ1", 4) == 0, "[quant] ", what,
           " is not a quantized weight (no HRQ1 header in its ", bytes, " bytes)");
  const Header h = header_of(blob);
  HR_CHECK(h.type <= uint8_t(QuantType::FP4) && h.rows > 0 && h.cols > 0 && h.block > 0, "[quant] ", what,
           " has a damaged quantization header");
  QuantFormat f;
  f.type = QuantType(h.type);
  f.block = h.block;
  f.double_quant = h.double_quant != 0;
  const QuantLayout l = QuantLayout::of(f, h.rows, h.cols);
  HR_CHECK(l.bytes == bytes, "[quant] ", what, " is ", bytes, " bytes; its header (", l.describe(), ") says ", l.bytes);
  return l;
}

float dequantized_absmax(const uint8_t* blob, const QuantLayout& l, int64_t block) {
  if (!l.format.double_quant) return f32_at(blob, l.absmax + 4 * block);
  return dynamic_code8()[blob[l.absmax + block]] * f32_at(blob, l.absmax2 + 4 * (block / kDoubleQuantBlock)) +
         header_of(blob).offset;
}

float dequantized_element(const uint8_t* blob, const QuantLayout& l, int64_t i) {
  if (l.format.type == QuantType::Int8) {
    const int8_t q = int8_t(blob[l.codes + i]);
    return float(q) * f32_at(blob, l.absmax + 4 * (i / l.cols)) / 127.f;
  }
  const uint8_t byte = blob[l.codes + i / 2];
  const int q = i % 2 ? byte & 0x0F : byte >> 4;
  return code4(l.format.type)[std::size_t(q)] * dequantized_absmax(blob, l, i / l.format.block);
}

std::vector<float> dequantize(const uint8_t* blob, const QuantLayout& l) {
  std::vector<float> out(std::size_t(l.numel()));
  for (int64_t i = 0; i < l.numel(); ++i) out[std::size_t(i)] = dequantized_element(blob, l, i);
  return out;
}

}  // namespace hr::core
