// Quantized frozen weights (QLoRA's base): per-output-channel absmax int8, and 4-bit NF4 / FP4 in blocks of 64
// with optionally double-quantized constants, as QLoRA (Dettmers et al., 2023) and bitsandbytes define them.
//
// A quantized (rows, cols) weight is one self-describing byte blob, so that ZeRO shards it, checkpoints save it
// and loaders recognise it like any other tensor:
//   header (32 bytes): "HRQ1", type, double_quant, block, the constants' offset, rows, cols
//   codes: int8 one byte per element; 4-bit two per byte, the first element of a pair in the high nibble
//   constants (4-byte aligned): int8 an f32 absmax per row; 4-bit an f32 absmax per block of `block` elements
//   of the row-major weight, or with double_quant (absmax - offset) quantized blockwise (256 per block) to
//   bitsandbytes' signed dynamic 8-bit code, one u8 per block plus an f32 absmax per 256 blocks, offset being
//   the mean absmax.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace hr::core {

enum class QuantType : uint8_t { Int8 = 0, NF4 = 1, FP4 = 2 };

// What a quantized weight is: the type, its block and whether its constants are quantized again.
struct QuantFormat {
  QuantType type = QuantType::NF4;
  int64_t block = 64;         // 4-bit: elements per absmax (int8 has one per row)
  bool double_quant = false;  // 4-bit only
  int bits() const { return type == QuantType::Int8 ? 8 : 4; }
  std::string describe() const;  // "nf4 (block 64, double quant)", "int8 (per output channel)"
};
const char* quant_type_name(QuantType t);          // "int8", "nf4", "fp4"
QuantType parse_quant_type(const std::string& s);  // nf4 or fp4; throws naming the allowed values

constexpr int64_t kQuantHeaderBytes = 32;
constexpr int64_t kDoubleQuantBlock = 256;

// Where everything of a (rows, cols) weight lies in its blob.
struct QuantLayout {
  QuantFormat format;
  int64_t rows = 0, cols = 0;
  int64_t blocks = 0;  // 4-bit: absmax values; int8: rows
  int64_t codes = kQuantHeaderBytes;
  int64_t absmax = 0;   // f32[blocks], or with double_quant u8[blocks]
  int64_t absmax2 = 0;  // double_quant: f32[ceil(blocks / 256)]
  int64_t bytes = 0;    // the whole blob

  static QuantLayout of(const QuantFormat& f, int64_t rows, int64_t cols);
  int64_t numel() const { return rows * cols; }
  int64_t blocks2() const { return (blocks + kDoubleQuantBlock - 1) / kDoubleQuantBlock; }
  std::string describe() const;  // "nf4 (block 64, double quant) 64x128"
};

// The 16 values a 4-bit code stands for (NF4: QLoRA's normal-float quantiles; FP4: bitsandbytes' e2m1 code).
const std::array<float, 16>& code4(QuantType t);
// bitsandbytes' signed dynamic 8-bit code (create_dynamic_map: 7 exponent bits), sorted ascending.
const std::array<float, 256>& dynamic_code8();
// The index of the nearest of `code`'s sorted-or-not values (the first of equals).
int nearest_code(const float* code, int n, float x);

// Quantizes a row-major (rows, cols) f32 weight into its blob.
std::vector<uint8_t> quantize(const float* w, int64_t rows, int64_t cols, const QuantFormat& f);
// The layout a blob's header states; throws naming `what` when the bytes are not a quantized weight.
QuantLayout read_layout(const uint8_t* blob, int64_t bytes, const std::string& what);
// A blob's weight as f32, row-major (rows, cols).
std::vector<float> dequantize(const uint8_t* blob, const QuantLayout& l);
// Element i (row-major) of the weight, and the absmax of its block: what every dequantizing kernel computes.
float dequantized_absmax(const uint8_t* blob, const QuantLayout& l, int64_t block);
float dequantized_element(const uint8_t* blob, const QuantLayout& l, int64_t i);

}  // namespace hr::core
