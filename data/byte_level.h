// The text side of byte-level BPE tokenizers (GPT-2, Qwen2, Llama 3) as Hugging Face `tokenizers` 0.20 runs it:
// GPT-2's byte<->character map, the regex Split pre-tokenizer (PCRE2 in UTF + UCP mode, standing in for the
// Oniguruma regexes of `tokenizers`), NFC (utf8proc) and Rust's lossy UTF-8 decoding.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace hr::data::tok {

// ByteLevel's pre-tokenizer step: each byte of `text` becomes its GPT-2 character ("Ġ" for a space), in UTF-8.
std::string bytes_to_chars(const std::string& text);
// ByteLevel's decoder: each token's characters back to bytes (a token holding a character outside the map, such
// as an added token with a space, gives its own bytes), then the bytes as text, lossily (see utf8_lossy).
std::string chars_to_bytes(const std::vector<std::string>& tokens);
// Rust's String::from_utf8_lossy: each maximal ill-formed subsequence becomes one U+FFFD.
std::string utf8_lossy(const std::string& bytes);
// The offset of the first byte that is not well-formed UTF-8, or npos when `text` is valid.
std::size_t utf8_error(const std::string& text);
// Unicode NFC (`tokenizers`' NFC normalizer); `text` must be valid UTF-8.
std::string nfc(const std::string& text);

// A compiled pattern of a Split pre-tokenizer. `literal`: the pattern is a String (matched as written), else a
// Regex in Oniguruma's syntax, which PCRE2 shares for what tokenizer files use; `\s` and `\S` are rewritten to
// Oniguruma's Unicode whitespace (PCRE2's also holds U+180E). Throws hr::Error prefixed by `where` when PCRE2
// refuses the pattern. Safe to match from several threads.
class Regex {
 public:
  Regex(const std::string& pattern, bool literal, const std::string& where);
  // The matches in `text` (valid UTF-8) as the onig crate's find_iter yields them: [start, end) byte offsets, an
  // empty match right after the previous match skipped.
  std::vector<std::pair<std::size_t, std::size_t>> find_all(const std::string& text) const;

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
  std::string where_;
};

// tokenizers' SplitDelimiterBehavior.
enum class SplitBehavior : uint8_t { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

// NormalizedString::split over a pattern's matches (flags flipped when `invert`), empty pieces dropped.
std::vector<std::string> split_text(const std::string& text, const Regex& re, SplitBehavior behavior, bool invert);

// GPT-2's pattern, the one ByteLevel splits with when its use_regex is true.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace hr::data::tok
