// Byte-level tokenizer.
#include "data/tokenizer.h"

#include "core/check.h"

namespace hr::data {

ByteTokenizer::ByteTokenizer(int64_t vocab, int64_t image_token) : vocab_(vocab), image_token_(image_token) {
  HR_CHECK(vocab >= kMinVocab, "[tokenizer] the byte-level tokenizer needs model.llm.vocab_size >= ", kMinVocab,
           "; got ", vocab);
  HR_CHECK(image_token >= kMinVocab && image_token < vocab, "[tokenizer] model.image_token_index ", image_token,
           " must lie in [", kMinVocab, ", ", vocab, ") so it collides with no byte");
}

std::vector<int64_t> ByteTokenizer::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  for (unsigned char c : text) ids.push_back(int64_t(c) + kByteOffset);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string s;
  for (int64_t id : ids) {
    if (id == kEos) break;
    if (id >= kByteOffset && id < kByteOffset + 256) s += char(id - kByteOffset);
  }
  return s;
}

}  // namespace hr::data
