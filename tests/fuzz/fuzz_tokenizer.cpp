// Fuzzes the tokenizer.json reader and its encoder and decoder: the input is the file's text, then
// NUL-separated strings, each encoded (with and without the special tokens) and decoded again. Every id an
// accepted file produces must lie in its vocabulary; a text it cannot encode (a character outside a vocabulary
// without unk_token or byte fallback) is an hr::Error, as the tokenizers library refuses it too.
#include <cstdint>
#include <string>
#include <vector>

#include "core/check.h"
#include "data/tokenizer.h"

using namespace hr;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::size_t end = input.find('\0');
  const std::string file = input.substr(0, end);
  std::vector<std::string> texts;
  while (end != std::string::npos) {
    const std::size_t next = input.find('\0', end + 1);
    texts.push_back(input.substr(end + 1, next == std::string::npos ? std::string::npos : next - end - 1));
    end = next;
  }
  std::shared_ptr<const data::Tokenizer> tok;
  try {
    tok = data::tokenizer_json_from_text(file, "fuzz/tokenizer.json", 0);
  } catch (const Error&) {
    return 0;
  }
  for (const std::string& t : texts)
    for (data::SpecialTokens special : {data::SpecialTokens::Omit, data::SpecialTokens::Add}) {
      std::vector<int64_t> ids;
      try {
        ids = tok->encode(t, special);
      } catch (const Error&) {
        continue;
      }
      for (int64_t id : ids)
        if (id < 0 || id >= tok->vocab_size()) __builtin_trap();
      (void)tok->decode(ids);
    }
  return 0;
}
