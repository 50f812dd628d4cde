// Byte-level BPE's text steps: GPT-2's byte map, regex splits through PCRE2, NFC through utf8proc, lossy UTF-8.
#include "data/byte_level.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstdlib>

#include "core/check.h"

namespace hr::data::tok {

namespace {

constexpr char32_t kNoByte = 0x110000;
constexpr std::size_t kJitStackStart = 32_KiB, kJitStackMax = 16_MiB;

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xC0 | (c >> 6)), out += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += char(0xE0 | (c >> 12)), out += char(0x80 | ((c >> 6) & 0x3F)), out += char(0x80 | (c & 0x3F));
  } else {
    out += char(0xF0 | (c >> 18)), out += char(0x80 | ((c >> 12) & 0x3F));
    out += char(0x80 | ((c >> 6) & 0x3F)), out += char(0x80 | (c & 0x3F));
  }
}

// GPT-2's bytes_to_unicode: the printable bytes ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) stand for themselves,
// the others take U+0100 onwards in byte order.
struct ByteMap {
  std::array<std::string, 256> to_char;  // UTF-8 of each byte's character
  std::array<int, 512> to_byte{};        // a character below U+0200 -> its byte, or -1
  ByteMap() {
    to_byte.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t c = printable ? char32_t(b) : next++;
      append_utf8(to_char[std::size_t(b)], c);
      to_byte[std::size_t(c)] = b;
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// The length of the well-formed UTF-8 sequence at `i` (its code point in `c`), or 0 with `bad` set to the length
// of the maximal ill-formed subpart there (at least 1), as Unicode's "substitution of maximal subparts" counts.
std::size_t utf8_at(const std::string& s, std::size_t i, char32_t& c, std::size_t& bad) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  bad = 1;
  if (b0 < 0x80) return c = b0, 1;
  std::size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1, c = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2, c = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3, c = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (std::size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return bad = k, 0;
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (b < lo || b > hi) return bad = k, 0;
    lo = 0x80, hi = 0xBF;
    c = (c << 6) | (b & 0x3F);
  }
  return need + 1;
}

// Oniguruma's \s under Unicode: U+0009..U+000D, U+0085 and the separators (Zs, Zl, Zp).
constexpr const char* kOnigSpace = R"(\t-\r\x{85}\p{Z})";

// The pattern with \s and \S as Oniguruma reads them (a \S inside a class stays PCRE2's).
std::string onig_spaces(const std::string& p) {
  std::string out;
  bool in_class = false;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char ch = p[i];
    if (ch == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      if (e == 's') {
        out += in_class ? std::string(kOnigSpace) : str("[", kOnigSpace, "]");
      } else if (e == 'S' && !in_class) {
        out += str("[^", kOnigSpace, "]");
      } else {
        out += ch, out += e;
      }
      continue;
    }
    if (!in_class && ch == '[') {
      in_class = true;
      out += ch;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a leading ']' is a member
      continue;
    }
    if (in_class && ch == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // a POSIX class [:name:]
      const std::size_t end = p.find(":]", i + 2);
      if (end != std::string::npos) {
        out.append(p, i, end + 2 - i);
        i = end + 1;
        continue;
      }
    }
    if (in_class && ch == ']') in_class = false;
    out += ch;
  }
  return out;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

// Each thread's JIT stack, larger than PCRE2's 32 KiB default so that long whitespace runs match.
struct JitStack {
  pcre2_jit_stack* stack = pcre2_jit_stack_create(kJitStackStart, kJitStackMax, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  JitStack() {
    if (stack && context) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~JitStack() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
  }
};

}  // namespace

std::string bytes_to_chars(const std::string& text) {
  const ByteMap& m = byte_map();
  std::string out;
  out.reserve(text.size() * 2);
  for (unsigned char b : text) out += m.to_char[b];
  return out;
}

std::string chars_to_bytes(const std::vector<std::string>& tokens) {
  const ByteMap& m = byte_map();
  std::string bytes;
  for (const std::string& t : tokens) {
    std::string mapped;
    bool all = true;
    for (std::size_t i = 0; i < t.size() && all;) {
      char32_t c = 0;
      std::size_t bad = 0;
      const std::size_t n = utf8_at(t, i, c, bad);
      all = n > 0 && c < m.to_byte.size() && m.to_byte[c] >= 0;
      if (all) mapped += char(m.to_byte[c]);
      i += n;
    }
    bytes += all ? mapped : t;
  }
  return utf8_lossy(bytes);
}

std::string utf8_lossy(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (std::size_t i = 0; i < bytes.size();) {
    char32_t c = 0;
    std::size_t bad = 0;
    const std::size_t n = utf8_at(bytes, i, c, bad);
    if (n > 0) {
      out.append(bytes, i, n);
      i += n;
    } else {
      out += "\xef\xbf\xbd";
      i += bad;
    }
  }
  return out;
}

std::size_t utf8_error(const std::string& text) {
  for (std::size_t i = 0; i < text.size();) {
    char32_t c = 0;
    std::size_t bad = 0;
    const std::size_t n = utf8_at(text, i, c, bad);
    if (n == 0) return i;
    i += n;
  }
  return std::string::npos;
}

std::string nfc(const std::string& text) {
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), utf8proc_ssize_t(text.size()), &out,
                   utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  HR_CHECK(n >= 0, "[tokenizer] NFC: ", utf8proc_errmsg(n));
  std::string s(reinterpret_cast<const char*>(out), std::size_t(n));
  std::free(out);
  return s;
}

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

Regex::Regex(const std::string& pattern, bool literal, const std::string& where) : where_(where) {
  const std::string p = literal ? pattern : onig_spaces(pattern);
  int error = 0;
  PCRE2_SIZE at = 0;
  auto code = std::make_shared<Code>();
  code->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(),
                             literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP, &error, &at, nullptr);
  HR_CHECK(code->code, where, ": ", pcre2_message(error), " at offset ", at, " of ", pattern);
  pcre2_jit_compile(code->code, PCRE2_JIT_COMPLETE);  // where JIT is unavailable, the interpreter matches
  code_ = std::move(code);
}

std::vector<std::pair<std::size_t, std::size_t>> Regex::find_all(const std::string& text) const {
  thread_local JitStack jit;
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> data(
      pcre2_match_data_create_from_pattern(code_->code, nullptr), pcre2_match_data_free);
  HR_CHECK(data, where_, ": out of memory for a match");
  std::vector<std::pair<std::size_t, std::size_t>> out;
  std::size_t from = 0;
  bool matched = false;
  std::size_t last_end = 0;
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  while (from <= text.size()) {
    // The text was checked once (utf8_error): each further check would be another pass over it.
    const int rc = pcre2_match(code_->code, subject, text.size(), from, PCRE2_NO_UTF_CHECK, data.get(), jit.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    HR_CHECK(rc >= 0, where_, ": matching failed: ", pcre2_message(rc));
    const PCRE2_SIZE* v = pcre2_get_ovector_pointer(data.get());
    const std::size_t s = v[0], e = v[1];
    if (s == e && matched && last_end == e) {  // the onig crate steps one character past such an empty match
      char32_t c = 0;
      std::size_t bad = 0;
      const std::size_t n = from < text.size() ? utf8_at(text, from, c, bad) : 1;
      from += n > 0 ? n : 1;
      continue;
    }
    out.emplace_back(s, e);
    from = last_end = e, matched = true;
  }
  return out;
}

namespace {

// A stretch of the text: a match of the pattern or what lies between two.
struct Piece {
  std::size_t begin, end;
  bool match;
};

// The pattern's find_matches: the text cut into matches and what lies between them (`invert`: the other way).
std::vector<Piece> pieces_of(const std::string& text, const Regex& re, bool invert) {
  std::vector<Piece> pieces;
  if (text.empty()) return {{0, 0, invert}};
  std::size_t prev = 0;
  for (const auto& [s, e] : re.find_all(text)) {
    if (prev != s) pieces.push_back({prev, s, invert});
    pieces.push_back({s, e, !invert});
    prev = e;
  }
  if (prev != text.size()) pieces.push_back({prev, text.size(), invert});
  return pieces;
}

// `tokenizers`' merge of matches with their neighbours: runs of alike pieces (Contiguous), or each match onto the
// piece before (MergedWithPrevious) or after it (MergedWithNext, done on the reversed pieces). The merged pieces
// are kept (match false).
std::vector<Piece> merge_pieces(const std::vector<Piece>& pieces, SplitBehavior behavior) {
  std::vector<Piece> kept;
  bool previous = false;
  const bool backwards = behavior == SplitBehavior::MergedWithNext;
  const std::size_t n = pieces.size();
  for (std::size_t k = 0; k < n; ++k) {
    const Piece& p = pieces[backwards ? n - 1 - k : k];
    const bool merge =
        !kept.empty() && (behavior == SplitBehavior::Contiguous ? p.match == previous : p.match && !previous);
    if (!merge)
      kept.push_back({p.begin, p.end, false});
    else if (backwards)
      kept.back().begin = p.begin;
    else
      kept.back().end = p.end;
    previous = p.match;
  }
  if (backwards) std::reverse(kept.begin(), kept.end());
  return kept;
}

}  // namespace

std::vector<std::string> split_text(const std::string& text, const Regex& re, SplitBehavior behavior, bool invert) {
  std::vector<Piece> pieces = pieces_of(text, re, invert);
  if (behavior == SplitBehavior::Isolated)  // every piece kept
    for (Piece& p : pieces) p.match = false;
  else if (behavior != SplitBehavior::Removed)  // Removed: the matches go
    pieces = merge_pieces(pieces, behavior);
  std::vector<std::string> out;
  for (const Piece& p : pieces)
    if (!p.match && p.end > p.begin) out.push_back(text.substr(p.begin, p.end - p.begin));
  return out;
}

}  // namespace hr::data::tok
