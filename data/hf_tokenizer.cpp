// Hugging Face `tokenizer.json` for the Llama family and the byte-level BPE ones (GPT-2, Qwen2): added tokens,
// the normalizers, pre-tokenizers, post-processors and decoders those files use, and the BPE model with byte
// fallback, following the `tokenizers` library (0.20) step for step. A part it does not implement is an error
// that names it, never other ids.
#include <cctype>
#include <filesystem>
#include <queue>
#include <unordered_map>

#include "core/check.h"
#include "data/byte_level.h"
#include "data/tokenizer.h"
#include "data/tokenizer_parts.h"

namespace hr::data {

namespace {

using json = nlohmann::json;
using tok::AddedToken;

struct PairHash {
  std::size_t operator()(const std::pair<int64_t, int64_t>& p) const {
    return std::hash<int64_t>()(p.first * 1000003 + p.second);
  }
};

struct Normalizer {
  enum Kind { Prepend, Replace, Nfc } kind;
  std::string a, b;  // Prepend: a; Replace: a -> b
};

// One step of the pre-tokenizer (a Sequence is several): each word it is given becomes zero or more words.
struct PreTokenizer {
  enum Kind { Metaspace, ByteLevel, Split } kind = Metaspace;
  std::string replacement = tok::kMetaspace, prepend_scheme = "always";  // Metaspace
  bool split = true;                                                     // Metaspace
  bool add_prefix_space = true;                                          // ByteLevel
  std::shared_ptr<const tok::Regex> regex;  // Split's pattern; ByteLevel's GPT-2 one when use_regex
  tok::SplitBehavior behavior = tok::SplitBehavior::Isolated;
  bool invert = false;
};

struct Decoder {
  enum Kind { Replace, ByteFallback, Fuse, Strip, Metaspace, ByteLevel } kind;
  std::string a, b;
  int64_t start = 0, stop = 0;
  bool prepend = true;
};

std::size_t utf8_len(unsigned char c) {
  return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

bool valid_utf8(const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (std::size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return false;
    i += n;
  }
  return true;
}

constexpr int64_t kMaxId = int64_t(1) << 24;  // pieces_ is indexed by id: a larger one is a broken file

int64_t check_id(const std::string& file, int64_t id, const std::string& what) {
  HR_CHECK(id >= 0 && id < kMaxId, "[tokenizer] ", file, ": ", what, " has id ", id, ", outside [0, ", kMaxId, ")");
  return id;
}

Error unsupported(const std::string& file, const std::string& part, const json& v) {
  return Error(str("[tokenizer] ", file, ": ", part, " '", v.is_object() ? v.value("type", v.dump()) : v.dump(),
                   "' is not supported (headroom reads BPE models, the Llama family's with byte fallback and the "
                   "byte-level ones: normalizers Sequence/Prepend/Replace/NFC, pre-tokenizers "
                   "Sequence/Metaspace/ByteLevel/Split, post-processors TemplateProcessing/ByteLevel/Sequence, "
                   "decoders Sequence/Replace/ByteFallback/Fuse/Strip/Metaspace/ByteLevel)"));
}

bool present(const json& j, const char* key) {
  return j.contains(key) && !j[key].is_null();
}

// --- The normalizer and decoder pipelines: a table of readers by "type" each (Sequence nests others); a type
// the table does not hold is an error naming it.
template <class Part>
struct PartReader {
  const char* type;
  void (*read)(const json& j, const std::string& file, std::vector<Part>& out);
};

template <class Part, std::size_t N>
void read_part(const PartReader<Part> (&table)[N], const char* what, const json& j, const std::string& file,
               std::vector<Part>& out) {
  if (j.is_null()) return;
  const std::string type = j.value("type", "");
  for (const PartReader<Part>& r : table)
    if (type == r.type) return r.read(j, file, out);
  throw unsupported(file, what, j);
}

void read_normalizer(const json& n, const std::string& file, std::vector<Normalizer>& out);

void normalizer_sequence(const json& n, const std::string& file, std::vector<Normalizer>& out) {
  for (const json& x : n.at("normalizers")) read_normalizer(x, file, out);
}
void normalizer_prepend(const json& n, const std::string&, std::vector<Normalizer>& out) {
  out.push_back({Normalizer::Prepend, n.at("prepend"), ""});
}
void normalizer_replace(const json& n, const std::string& file, std::vector<Normalizer>& out) {
  if (!n.at("pattern").contains("String")) throw unsupported(file, "normalizer", n);  // a Regex pattern
  out.push_back({Normalizer::Replace, n["pattern"]["String"], n.at("content")});
}

void normalizer_nfc(const json&, const std::string&, std::vector<Normalizer>& out) {
  out.push_back({Normalizer::Nfc, "", ""});
}

constexpr PartReader<Normalizer> kNormalizers[] = {{"Sequence", normalizer_sequence},
                                                   {"Prepend", normalizer_prepend},
                                                   {"Replace", normalizer_replace},
                                                   {"NFC", normalizer_nfc}};

void read_normalizer(const json& n, const std::string& file, std::vector<Normalizer>& out) {
  read_part(kNormalizers, "normalizer", n, file, out);
}

void read_decoder(const json& d, const std::string& file, std::vector<Decoder>& out);

void decoder_sequence(const json& d, const std::string& file, std::vector<Decoder>& out) {
  for (const json& x : d.at("decoders")) read_decoder(x, file, out);
}
void decoder_replace(const json& d, const std::string& file, std::vector<Decoder>& out) {
  if (!d.at("pattern").contains("String")) throw unsupported(file, "decoder", d);  // a Regex pattern
  out.push_back({Decoder::Replace, d["pattern"]["String"], d.at("content")});
}
void decoder_byte_fallback(const json&, const std::string&, std::vector<Decoder>& out) {
  out.push_back({Decoder::ByteFallback, "", ""});
}
void decoder_fuse(const json&, const std::string&, std::vector<Decoder>& out) {
  out.push_back({Decoder::Fuse, "", ""});
}
void decoder_strip(const json& d, const std::string& file, std::vector<Decoder>& out) {
  out.push_back({Decoder::Strip, d.at("content"), "", tok::json_int(d.at("start"), str(file, ": Strip start")),
                 tok::json_int(d.at("stop"), str(file, ": Strip stop"))});
}
void decoder_metaspace(const json& d, const std::string&, std::vector<Decoder>& out) {
  Decoder x{Decoder::Metaspace, d.value("replacement", std::string(tok::kMetaspace)), ""};
  x.prepend = d.value("prepend_scheme", std::string("always")) != "never";
  out.push_back(x);
}

void decoder_byte_level(const json&, const std::string&, std::vector<Decoder>& out) {
  out.push_back({Decoder::ByteLevel, "", ""});
}

constexpr PartReader<Decoder> kDecoders[] = {
    {"Sequence", decoder_sequence},   {"Replace", decoder_replace}, {"ByteFallback", decoder_byte_fallback},
    {"Fuse", decoder_fuse},           {"Strip", decoder_strip},     {"Metaspace", decoder_metaspace},
    {"ByteLevel", decoder_byte_level}};

void read_decoder(const json& d, const std::string& file, std::vector<Decoder>& out) {
  read_part(kDecoders, "decoder", d, file, out);
}

// --- The decoders' steps over the tokens' texts (tokenizers' decode_chain).
std::vector<std::string> decode_replace(const Decoder& d, const std::vector<std::string>& in) {
  std::vector<std::string> out;
  for (const std::string& t : in) out.push_back(tok::replace_all(t, d.a, d.b));
  return out;
}

std::vector<std::string> decode_fuse(const std::vector<std::string>& in) {
  std::string all;
  for (const std::string& t : in) all += t;
  return {all};
}

std::vector<std::string> decode_strip(const Decoder& d, const std::vector<std::string>& in) {
  std::vector<std::string> out;
  const std::size_t n = d.a.size();
  for (const std::string& t : in) {
    std::size_t b = 0, e = t.size();
    for (int64_t k = 0; k < d.start && b < e && t.compare(b, n, d.a) == 0; ++k) b += n;
    for (int64_t k = 0; k < d.stop && e >= b + n && t.compare(e - n, n, d.a) == 0; ++k) e -= n;
    out.push_back(t.substr(b, e - b));
  }
  return out;
}

std::vector<std::string> decode_metaspace(const Decoder& d, const std::vector<std::string>& in) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < in.size(); ++i) {
    std::string t = tok::replace_all(in[i], d.a, " ");
    if (i == 0 && d.prepend && !t.empty() && t[0] == ' ') t.erase(0, 1);
    out.push_back(t);
  }
  return out;
}

bool is_byte_piece(const std::string& t) {  // "<0xAB>"
  return t.size() == 6 && t.rfind("<0x", 0) == 0 && t[5] == '>' && std::isxdigit(static_cast<unsigned char>(t[3])) &&
         std::isxdigit(static_cast<unsigned char>(t[4]));
}

// A run of `count` byte pieces: their text when it is valid UTF-8, else one U+FFFD per piece.
void flush_bytes(std::string& bytes, std::size_t& count, std::vector<std::string>& out) {
  if (count == 0) return;
  if (valid_utf8(bytes)) {
    out.push_back(bytes);
  } else {
    for (std::size_t k = 0; k < count; ++k) out.push_back("\xef\xbf\xbd");
  }
  bytes.clear(), count = 0;
}

std::vector<std::string> decode_byte_fallback(const std::vector<std::string>& in) {
  std::vector<std::string> out;
  std::string bytes;
  std::size_t count = 0;
  for (const std::string& t : in) {
    if (is_byte_piece(t)) {
      bytes += char(std::stoi(t.substr(3, 2), nullptr, 16));
      ++count;
    } else {
      flush_bytes(bytes, count, out);
      out.push_back(t);
    }
  }
  flush_bytes(bytes, count, out);
  return out;
}

std::vector<std::string> run_decoder(const Decoder& d, const std::vector<std::string>& in) {
  switch (d.kind) {
    case Decoder::Replace:
      return decode_replace(d, in);
    case Decoder::Fuse:
      return decode_fuse(in);
    case Decoder::Strip:
      return decode_strip(d, in);
    case Decoder::Metaspace:
      return decode_metaspace(d, in);
    case Decoder::ByteFallback:
      return decode_byte_fallback(in);
    case Decoder::ByteLevel:
      return {tok::chars_to_bytes(in)};
  }
  return {};
}

// --- The pre-tokenizers (`where` is the part's place in the file, "pre_tokenizer.pretokenizers[1]", for errors).
std::shared_ptr<const tok::Regex> gpt2_regex() {
  static const auto re = std::make_shared<const tok::Regex>(tok::kGpt2Pattern, false, "[tokenizer] GPT-2's pattern");
  return re;
}

tok::SplitBehavior split_behavior(const json& p, const std::string& file, const std::string& where) {
  static const std::pair<const char*, tok::SplitBehavior> kNames[] = {
      {"Removed", tok::SplitBehavior::Removed},
      {"Isolated", tok::SplitBehavior::Isolated},
      {"MergedWithPrevious", tok::SplitBehavior::MergedWithPrevious},
      {"MergedWithNext", tok::SplitBehavior::MergedWithNext},
      {"Contiguous", tok::SplitBehavior::Contiguous}};
  const std::string b = p.at("behavior");
  for (const auto& [name, value] : kNames)
    if (b == name) return value;
  throw unsupported(file, where + ".behavior", json(b));
}

PreTokenizer metaspace(const json& p, const std::string& file, const std::string& where) {
  PreTokenizer x;
  x.kind = PreTokenizer::Metaspace;
  x.replacement = p.value("replacement", std::string(tok::kMetaspace));
  HR_CHECK(!x.replacement.empty(), "[tokenizer] ", file, ": ", where, ".replacement is empty");
  x.prepend_scheme = p.value("prepend_scheme", p.value("add_prefix_space", true) ? "always" : "never");
  if (x.prepend_scheme != "always" && x.prepend_scheme != "first" && x.prepend_scheme != "never")
    throw unsupported(file, where + ".prepend_scheme", json(x.prepend_scheme));
  x.split = p.value("split", true);
  return x;
}

PreTokenizer split(const json& p, const std::string& file, const std::string& where) {
  PreTokenizer x;
  x.kind = PreTokenizer::Split;
  const json& pattern = p.at("pattern");
  const bool literal = pattern.contains("String");
  HR_CHECK(literal || pattern.contains("Regex"), "[tokenizer] ", file, ": ", where,
           ".pattern is neither a String nor a Regex: ", pattern.dump());
  const char* kind = literal ? "String" : "Regex";
  x.regex = std::make_shared<const tok::Regex>(pattern.at(kind).get<std::string>(), literal,
                                               str("[tokenizer] ", file, ": ", where, ".pattern.", kind));
  x.behavior = split_behavior(p, file, where);
  x.invert = p.value("invert", false);
  return x;
}

void read_pre_tokenizer(const json& p, const std::string& file, const std::string& where,
                        std::vector<PreTokenizer>& out) {
  const std::string type = p.value("type", "");
  if (type == "Sequence") {
    const json& list = p.at("pretokenizers");
    for (std::size_t i = 0; i < list.size(); ++i)
      read_pre_tokenizer(list[i], file, str(where, ".pretokenizers[", i, "]"), out);
  } else if (type == "Metaspace") {
    out.push_back(metaspace(p, file, where));
  } else if (type == "ByteLevel") {
    PreTokenizer x;
    x.kind = PreTokenizer::ByteLevel;
    x.add_prefix_space = p.value("add_prefix_space", true);
    if (p.value("use_regex", true)) x.regex = gpt2_regex();
    out.push_back(x);
  } else if (type == "Split") {
    out.push_back(split(p, file, where));
  } else {
    throw unsupported(file, where, p);
  }
}

// Metaspace: spaces become the replacement, which is put in front as the scheme says, then the word splits
// before every replacement (MergedWithNext).
std::vector<std::string> run_metaspace(const PreTokenizer& p, std::string t, bool at_start) {
  t = tok::replace_all(t, " ", p.replacement);
  const bool starts = t.rfind(p.replacement, 0) == 0;
  if (!starts && (p.prepend_scheme == "always" || (p.prepend_scheme == "first" && at_start))) t = p.replacement + t;
  if (!p.split) return {t};
  std::vector<std::string> words;
  std::size_t begin = 0;
  for (std::size_t at = t.find(p.replacement, 1); at != std::string::npos; at = t.find(p.replacement, at + 1)) {
    if (at > begin) words.push_back(t.substr(begin, at - begin));
    begin = at;
  }
  if (begin < t.size()) words.push_back(t.substr(begin));
  return words;
}

// ByteLevel: a space in front (add_prefix_space) unless there is one, GPT-2's split (use_regex), then every byte
// as its character.
std::vector<std::string> run_byte_level(const PreTokenizer& p, const std::string& word) {
  const std::string t = p.add_prefix_space && word[0] != ' ' ? " " + word : word;
  std::vector<std::string> words =
      p.regex ? tok::split_text(t, *p.regex, tok::SplitBehavior::Isolated, false) : std::vector<std::string>{t};
  for (std::string& w : words) w = tok::bytes_to_chars(w);
  return words;
}

std::vector<std::string> run_pre_tokenizer(const PreTokenizer& p, const std::string& word, bool at_start) {
  switch (p.kind) {
    case PreTokenizer::Metaspace:
      return run_metaspace(p, word, at_start);
    case PreTokenizer::ByteLevel:
      return run_byte_level(p, word);
    case PreTokenizer::Split:
      return tok::split_text(word, *p.regex, p.behavior, p.invert);
  }
  return {};
}

// --- BPE's word: its symbols as a linked list over a vector (tokenizers' Word), merged lowest rank first.
struct Symbol {
  int64_t c;
  std::ptrdiff_t prev, next;
  std::size_t len;  // bytes of the word it covers; 0 once merged into its left neighbour
};

void push_symbol(std::vector<Symbol>& sym, int64_t id, std::size_t len) {
  const auto n = std::ptrdiff_t(sym.size());
  sym.push_back({id, n - 1, n + 1, len});
}

// Unknown characters not yet a symbol: with fuse_unk a run of them becomes one unk symbol.
struct PendingUnk {
  int64_t id = -1;
  std::size_t len = 0;
  void flush(std::vector<Symbol>& sym) {
    if (id >= 0) push_symbol(sym, id, len), id = -1;
  }
};

struct Merge {
  std::size_t pos;
  int64_t rank, id;
  bool operator<(const Merge& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

class HfTokenizer : public Tokenizer {
 public:
  // `text` is the file's content; `file` names it in errors; tokenizer_config.json is read from `config_dir`
  // when it is not empty.
  HfTokenizer(const std::string& text, const std::string& file, const std::string& config_dir, int64_t image_token)
      : file_(file) {
    json j;
    try {
      j = json::parse(text);
    } catch (const json::exception& e) {
      throw Error(str("[tokenizer] ", file, " is not valid JSON: ", e.what()));
    }
    try {
      parse(j, config_dir, image_token);
    } catch (const json::exception& e) {  // a key of the wrong type or missing: the file is malformed
      throw Error(str("[tokenizer] ", file, " is malformed: ", e.what()));
    }
  }

 private:
  void parse(const json& j, const std::string& config_dir, int64_t image_token) {
    parse_model(j.at("model"));
    if (j.contains("added_tokens"))
      for (const json& t : j["added_tokens"]) parse_added_token(t);
    read_normalizer(j.value("normalizer", json()), file_, normalizers_);
    if (present(j, "pre_tokenizer")) read_pre_tokenizer(j["pre_tokenizer"], file_, "pre_tokenizer", pre_tokenizers_);
    if (present(j, "post_processor")) parse_post_processor(j["post_processor"]);
    read_decoder(j.value("decoder", json()), file_, decoders_);
    for (const Normalizer& n : normalizers_) needs_utf8_ |= n.kind == Normalizer::Nfc;
    for (const PreTokenizer& p : pre_tokenizers_) needs_utf8_ |= p.regex != nullptr;
    for (const AddedToken& a : added_)  // tokenizers matches a normalized token in the normalized text
      (a.normalized ? normalized_added_ : raw_added_).push_back(a);
    for (AddedToken& a : normalized_added_) a.content = normalize(a.content);
    read_token_roles(config_dir, image_token);
    for (const auto* v : {&prefix_, &suffix_})
      for (int64_t id : *v)
        HR_CHECK(id < int64_t(pieces_.size()), "[tokenizer] ", file_, ": the post-processor adds id ", id,
                 ", which is not in the vocabulary");
  }

  void parse_model(const json& m) {
    if (m.value("type", "") != "BPE") throw unsupported(file_, "model", m);
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (m.contains(k) && !m[k].is_null() && m[k] != "") throw unsupported(file_, str("model.", k), m[k]);
    if (present(m, "dropout")) throw unsupported(file_, "model.dropout", m["dropout"]);
    byte_fallback_ = m.value("byte_fallback", false);
    fuse_unk_ = m.value("fuse_unk", false);
    ignore_merges_ = m.value("ignore_merges", false);
    read_vocab(m.at("vocab"));
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
      const auto it = vocab_.find(m["unk_token"].get<std::string>());
      HR_CHECK(it != vocab_.end(), "[tokenizer] ", file_, ": model.unk_token is not in the vocabulary");
      unk_ = it->second;
    }
    read_merges(m.at("merges"));
  }

  void read_vocab(const json& vocab) {
    for (const auto& [piece, id_json] : vocab.items()) {
      const int64_t id = check_id(file_, tok::json_int(id_json, str(file_, ": vocabulary piece '", piece, "'")),
                                  str("vocabulary piece '", piece, "'"));
      vocab_[piece] = id;
      set_piece(id, piece);
    }
  }

  // Each merge's rank is its place in the list.
  void read_merges(const json& merges) {
    int64_t rank = 0;
    for (const json& mg : merges) {
      const auto [l, r] = merge_pieces(mg);
      merges_.emplace(std::make_pair(merge_id(l), merge_id(r)), std::make_pair(rank++, merge_id(l + r)));
    }
  }

  // A merge is "left right" or ["left", "right"].
  std::pair<std::string, std::string> merge_pieces(const json& mg) const {
    if (!mg.is_string()) return {mg.at(0).get<std::string>(), mg.at(1).get<std::string>()};
    const std::string s = mg;
    const std::size_t sp = s.find(' ');
    HR_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos, "[tokenizer] ", file_, ": merge '", s,
             "' is not two pieces");
    return {s.substr(0, sp), s.substr(sp + 1)};
  }

  int64_t merge_id(const std::string& piece) const {
    const auto it = vocab_.find(piece);
    HR_CHECK(it != vocab_.end(), "[tokenizer] ", file_, ": merge piece '", piece, "' is not in the vocabulary");
    return it->second;
  }

  void set_piece(int64_t id, const std::string& piece) {
    pieces_.resize(std::max<std::size_t>(pieces_.size(), std::size_t(id) + 1));
    pieces_[std::size_t(id)] = piece;
  }

  void parse_added_token(const json& t) {
    AddedToken a{t.at("content"),           tok::json_int(t.at("id"), str(file_, ": added token id")),
                 t.value("lstrip", false),  t.value("rstrip", false),
                 t.value("special", false), t.value("normalized", false)};
    check_id(file_, a.id, str("added token '", a.content, "'"));
    if (t.value("single_word", false))
      throw unsupported(file_, str("added token '", a.content, "' with single_word"), json(true));
    added_.push_back(a);
    set_piece(a.id, a.content);
  }

  // The post-processor: the tokens put around a single text. ByteLevel's only trims offsets, which headroom
  // does not keep.
  void parse_post_processor(const json& p) {
    const std::string type = p.value("type", "");
    if (type == "Sequence") {
      for (const json& x : p.at("processors")) parse_post_processor(x);
      return;
    }
    if (type == "ByteLevel") return;
    if (type != "TemplateProcessing") throw unsupported(file_, "post_processor", p);
    bool seen_text = false;
    for (const json& piece : p.at("single")) {
      if (piece.contains("Sequence")) {
        seen_text = true;
        continue;
      }
      const std::string name = piece.at("SpecialToken").at("id");
      const json& ids = p.at("special_tokens").at(name).at("ids");
      for (const json& id : ids)
        (seen_text ? suffix_ : prefix_)
            .push_back(
                check_id(file_, tok::json_int(id, str(file_, ": a post-processor id")), "a post-processor token"));
    }
  }

  // Token roles, from tokenizer_config.json beside the file where there is one.
  void read_token_roles(const std::string& config_dir, int64_t image_token) {
    const tok::TokenizerConfig cfg =
        config_dir.empty() ? tok::TokenizerConfig{} : tok::read_tokenizer_config(config_dir);
    legacy_ = cfg.legacy.is_boolean() ? cfg.legacy.get<bool>() : true;
    bos_ = role_id(cfg.bos_token, "<s>");
    eos_ = role_id(cfg.eos_token, "</s>");
    pad_ = unk_ >= 0 ? unk_ : role_id(cfg.pad_token, "<unk>");
    image_token_ = image_token;
  }

  // The id of a role's token (`fallback` where the config names none): an added token, else a piece; -1 if neither.
  int64_t role_id(const std::string& text, const char* fallback) const {
    const std::string t = text.empty() ? fallback : text;
    for (const AddedToken& a : added_)
      if (a.content == t) return a.id;
    const auto it = vocab_.find(t);
    return it == vocab_.end() ? -1 : it->second;
  }

 public:
  std::vector<int64_t> encode(const std::string& text, SpecialTokens special) const override {
    if (needs_utf8_) {
      const std::size_t bad = tok::utf8_error(text);
      HR_CHECK(bad == std::string::npos, "[tokenizer] ", file_, ": the text is not valid UTF-8 (byte ", bad, ")");
    }
    std::vector<int64_t> ids;
    if (special == SpecialTokens::Add) ids = prefix_;
    // As tokenizers' extract_and_normalize: the tokens matched as written split the text, each piece between
    // them is normalized, then the normalized tokens split it again.
    for (const tok::Segment& s : tok::split_added(text, raw_added_)) {
      if (s.added >= 0) {
        ids.push_back(s.added);
        continue;
      }
      for (const tok::Segment& n : tok::split_added(normalize(s.text), normalized_added_)) {
        if (n.added >= 0) {
          ids.push_back(n.added);
          continue;
        }
        for (const std::string& word : pre_tokenize(n.text, s.offset + n.offset == 0)) bpe(word, ids);
      }
    }
    if (special == SpecialTokens::Add) ids.insert(ids.end(), suffix_.begin(), suffix_.end());
    return ids;
  }

  std::string decode(const std::vector<int64_t>& ids) const override {
    std::vector<std::string> tokens;
    for (int64_t id : ids) {
      if (id < 0 || id >= int64_t(pieces_.size()) || is_special(id)) continue;
      tokens.push_back(pieces_[std::size_t(id)]);
    }
    for (const Decoder& d : decoders_) tokens = run_decoder(d, tokens);
    std::string out;
    for (const std::string& t : tokens) out += t;
    return out;
  }

  int64_t vocab_size() const override { return int64_t(pieces_.size()); }
  std::string describe() const override {
    bool byte_level = false;
    for (const PreTokenizer& p : pre_tokenizers_) byte_level |= p.kind == PreTokenizer::ByteLevel;
    if (byte_level) return str("tokenizer.json ", file_, " (byte-level BPE, ", pieces_.size(), " ids)");
    return str("tokenizer.json ", file_, " (BPE, ", pieces_.size(), " ids, legacy ", legacy_ ? "true" : "false", ")");
  }

 private:
  std::string normalize(std::string t) const {
    for (const Normalizer& n : normalizers_) switch (n.kind) {
        case Normalizer::Prepend:
          if (!t.empty()) t = n.a + t;
          break;
        case Normalizer::Replace:
          t = tok::replace_all(t, n.a, n.b);
          break;
        case Normalizer::Nfc:
          t = tok::nfc(t);
          break;
      }
    return t;
  }

  // The words of a piece of text, each step of the pre-tokenizer applied to every word of the one before; empty
  // words are dropped, as tokenizers drops empty splits.
  std::vector<std::string> pre_tokenize(const std::string& t, bool at_start) const {
    std::vector<std::string> words{t};
    for (const PreTokenizer& p : pre_tokenizers_) {
      std::vector<std::string> next;
      for (std::size_t i = 0; i < words.size(); ++i) {
        if (words[i].empty()) continue;
        for (std::string& w : run_pre_tokenizer(p, words[i], at_start && i == 0))
          if (!w.empty()) next.push_back(std::move(w));
      }
      words = std::move(next);
    }
    return words;
  }

  // tokenizers' BPE::merge_word + Word::merge_all.
  void bpe(const std::string& w, std::vector<int64_t>& out) const {
    if (w.empty()) return;
    if (ignore_merges_) {
      const auto it = vocab_.find(w);
      if (it != vocab_.end()) {
        out.push_back(it->second);
        return;
      }
    }
    std::vector<Symbol> sym = symbols(w);
    merge_all(sym);
    for (const Symbol& s : sym)
      if (s.len != 0) out.push_back(s.c);
  }

  // The word's characters as symbols: a character of the vocabulary, else its bytes' <0xXX> pieces (byte
  // fallback), else unk. As in tokenizers, a byte-fallback character does not end a run of pending unknowns.
  std::vector<Symbol> symbols(const std::string& w) const {
    std::vector<Symbol> sym;
    PendingUnk pending;
    for (std::size_t i = 0; i < w.size();) {
      const std::size_t n = std::min(utf8_len(static_cast<unsigned char>(w[i])), w.size() - i);
      const std::string ch = w.substr(i, n);
      i += n;
      const auto it = vocab_.find(ch);
      if (it != vocab_.end()) {
        pending.flush(sym);
        push_symbol(sym, it->second, n);
        continue;
      }
      if (byte_fallback_ && push_byte_pieces(ch, sym)) continue;
      HR_CHECK(unk_ >= 0, "[tokenizer] ", file_, ": '", ch, "' is not in the vocabulary and there is no unk_token");
      if (pending.id >= 0 && fuse_unk_) {
        pending.len += n;
      } else {
        pending.flush(sym);
        pending = {unk_, n};
      }
    }
    pending.flush(sym);
    if (!sym.empty()) sym.back().next = -1;
    return sym;
  }

  // Pushes the <0xXX> piece of each of the character's bytes; false, pushing none, when one is not a piece.
  bool push_byte_pieces(const std::string& ch, std::vector<Symbol>& sym) const {
    std::vector<int64_t> bytes;
    for (unsigned char b : ch) {
      static const char* hex = "0123456789ABCDEF";
      const auto bt = vocab_.find(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">");
      if (bt == vocab_.end()) return false;
      bytes.push_back(bt->second);
    }
    for (int64_t b : bytes) push_symbol(sym, b, 1);
    return true;
  }

  void merge_all(std::vector<Symbol>& sym) const {
    std::priority_queue<Merge> queue;
    for (std::size_t i = 0; i + 1 < sym.size(); ++i) queue_merge(queue, i, sym[i].c, sym[i + 1].c);
    while (!queue.empty()) {
      const Merge top = queue.top();
      queue.pop();
      if (!merge_at(sym, top)) continue;
      const Symbol& cur = sym[top.pos];
      if (cur.prev >= 0) queue_merge(queue, std::size_t(cur.prev), sym[std::size_t(cur.prev)].c, cur.c);
      if (cur.next >= 0 && std::size_t(cur.next) < sym.size())
        queue_merge(queue, top.pos, cur.c, sym[std::size_t(cur.next)].c);
    }
  }

  void queue_merge(std::priority_queue<Merge>& queue, std::size_t pos, int64_t left, int64_t right) const {
    const auto it = merges_.find({left, right});
    if (it != merges_.end()) queue.push({pos, it->second.first, it->second.second});
  }

  // Merges the symbol at top.pos with its right neighbour; false when the queued merge is stale (either symbol
  // has since been merged into another).
  bool merge_at(std::vector<Symbol>& sym, const Merge& top) const {
    Symbol& cur = sym[top.pos];
    if (cur.len == 0 || cur.next == -1) return false;
    const auto next = std::size_t(cur.next);
    const Symbol right = sym[next];
    const auto it = merges_.find({cur.c, right.c});
    if (it == merges_.end() || it->second.second != top.id) return false;
    cur.c = top.id, cur.len += right.len, cur.next = right.next;
    sym[next].len = 0;
    if (right.next > -1 && std::size_t(right.next) < sym.size())
      sym[std::size_t(right.next)].prev = std::ptrdiff_t(top.pos);
    return true;
  }

  bool is_special(int64_t id) const {
    for (const AddedToken& a : added_)
      if (a.id == id && a.special) return true;
    return false;
  }

  std::string file_;
  std::unordered_map<std::string, int64_t> vocab_;
  std::vector<std::string> pieces_;
  std::unordered_map<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>, PairHash> merges_;
  std::vector<AddedToken> added_;
  std::vector<AddedToken> raw_added_, normalized_added_;  // normalized_added_'s contents are normalized
  std::vector<Normalizer> normalizers_;
  std::vector<PreTokenizer> pre_tokenizers_;
  std::vector<Decoder> decoders_;
  std::vector<int64_t> prefix_, suffix_;
  int64_t unk_ = -1;
  // needs_utf8_: NFC or a regex reads the text as Unicode, so it must be valid UTF-8.
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false, needs_utf8_ = false;
};

}  // namespace

std::shared_ptr<const Tokenizer> load_hf_tokenizer_json(const std::string& file, int64_t image_token) {
  return std::make_shared<HfTokenizer>(tok::read_file(file), file, std::filesystem::path(file).parent_path().string(),
                                       image_token);
}

std::shared_ptr<const Tokenizer> tokenizer_json_from_text(const std::string& text, const std::string& name,
                                                          int64_t image_token) {
  return std::make_shared<HfTokenizer>(text, name, "", image_token);
}

}  // namespace hr::data
