// The built-in byte-level tokenizer: every UTF-8 byte is a token (id = byte + 3), with <pad>=0, <s>=1,
// </s>=2, and the image placeholder at the model's image_token_index. Needs a vocabulary of at least 259.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hr::data {

class ByteTokenizer {
 public:
  static constexpr int64_t kPad = 0, kBos = 1, kEos = 2, kByteOffset = 3;
  static constexpr int64_t kMinVocab = 256 + kByteOffset;

  ByteTokenizer(int64_t vocab, int64_t image_token);
  std::vector<int64_t> encode(const std::string& text) const;  // no specials
  // Bytes of the ids that are bytes; specials are skipped, decoding stops at </s>.
  std::string decode(const std::vector<int64_t>& ids) const;
  int64_t image_token() const { return image_token_; }

 private:
  int64_t vocab_, image_token_;
};

}  // namespace hr::data
