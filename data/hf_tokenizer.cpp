// Hugging Face `tokenizer.json` for the Llama family: added tokens, the normalizers, pre-tokenizers,
// post-processor and decoders those files use, and the BPE model with byte fallback, following the `tokenizers`
// library (0.20) step for step. A part it does not implement is an error that names it, never other ids.
#include <cctype>
#include <filesystem>
#include <queue>
#include <unordered_map>

#include "core/check.h"
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
  enum Kind { Prepend, Replace } kind;
  std::string a, b;  // Prepend: a; Replace: a -> b
};

struct Decoder {
  enum Kind { Replace, ByteFallback, Fuse, Strip, Metaspace } kind;
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
  static constexpr int64_t kMaxId = int64_t(1) << 24;

  void parse(const json& j, const std::string& config_dir, int64_t image_token) {
    const std::string& file = file_;
    auto check_id = [&](int64_t id, const std::string& what) {
      HR_CHECK(id >= 0 && id < kMaxId, "[tokenizer] ", file, ": ", what, " has id ", id, ", outside [0, ", kMaxId, ")");
      return id;
    };
    auto unsupported = [&](const std::string& part, const json& v) {
      return Error(str("[tokenizer] ", file, ": ", part, " '", v.is_object() ? v.value("type", v.dump()) : v.dump(),
                       "' is not supported (headroom reads the Llama family's BPE with byte fallback: normalizers "
                       "Sequence/Prepend/Replace, pre-tokenizer Metaspace, post-processor TemplateProcessing, "
                       "decoders Sequence/Replace/ByteFallback/Fuse/Strip/Metaspace)"));
    };
    // The model.
    const json& m = j.at("model");
    if (m.value("type", "") != "BPE") throw unsupported("model", m);
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (m.contains(k) && !m[k].is_null() && m[k] != "") throw unsupported(str("model.", k), m[k]);
    if (m.contains("dropout") && !m["dropout"].is_null()) throw unsupported("model.dropout", m["dropout"]);
    byte_fallback_ = m.value("byte_fallback", false);
    fuse_unk_ = m.value("fuse_unk", false);
    ignore_merges_ = m.value("ignore_merges", false);
    for (const auto& [piece, id_json] : m.at("vocab").items()) {
      const int64_t id = check_id(tok::json_int(id_json, str(file, ": vocabulary piece '", piece, "'")),
                                  str("vocabulary piece '", piece, "'"));
      vocab_[piece] = id;
      pieces_.resize(std::max<std::size_t>(pieces_.size(), std::size_t(id) + 1));
      pieces_[std::size_t(id)] = piece;
    }
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
      const auto it = vocab_.find(m["unk_token"].get<std::string>());
      HR_CHECK(it != vocab_.end(), "[tokenizer] ", file, ": model.unk_token is not in the vocabulary");
      unk_ = it->second;
    }
    int64_t rank = 0;
    for (const json& mg : m.at("merges")) {
      std::string l, r;
      if (mg.is_string()) {
        const std::string s = mg;
        const std::size_t sp = s.find(' ');
        HR_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos, "[tokenizer] ", file, ": merge '",
                 s, "' is not two pieces");
        l = s.substr(0, sp), r = s.substr(sp + 1);
      } else {
        l = mg.at(0), r = mg.at(1);
      }
      auto id = [&](const std::string& p) {
        const auto it = vocab_.find(p);
        HR_CHECK(it != vocab_.end(), "[tokenizer] ", file, ": merge piece '", p, "' is not in the vocabulary");
        return it->second;
      };
      merges_.emplace(std::make_pair(id(l), id(r)), std::make_pair(rank++, id(l + r)));
    }
    // Added tokens.
    if (j.contains("added_tokens"))
      for (const json& t : j["added_tokens"]) {
        AddedToken a{t.at("content"),           tok::json_int(t.at("id"), str(file, ": added token id")),
                     t.value("lstrip", false),  t.value("rstrip", false),
                     t.value("special", false), t.value("normalized", false)};
        check_id(a.id, str("added token '", a.content, "'"));
        if (a.normalized) throw unsupported(str("added token '", a.content, "' with normalized"), json(true));
        if (t.value("single_word", false))
          throw unsupported(str("added token '", a.content, "' with single_word"), json(true));
        added_.push_back(a);
        pieces_.resize(std::max<std::size_t>(pieces_.size(), std::size_t(a.id) + 1));
        pieces_[std::size_t(a.id)] = a.content;
      }
    // Normalizer.
    std::function<void(const json&)> add_normalizer = [&](const json& n) {
      if (n.is_null()) return;
      const std::string type = n.value("type", "");
      if (type == "Sequence") {
        for (const json& x : n.at("normalizers")) add_normalizer(x);
      } else if (type == "Prepend") {
        normalizers_.push_back({Normalizer::Prepend, n.at("prepend"), ""});
      } else if (type == "Replace" && n.at("pattern").contains("String")) {
        normalizers_.push_back({Normalizer::Replace, n["pattern"]["String"], n.at("content")});
      } else {
        throw unsupported("normalizer", n);
      }
    };
    add_normalizer(j.value("normalizer", json()));
    // Pre-tokenizer.
    if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null()) {
      const json& p = j["pre_tokenizer"];
      if (p.value("type", "") != "Metaspace") throw unsupported("pre_tokenizer", p);
      metaspace_ = true;
      replacement_ = p.value("replacement", std::string(tok::kMetaspace));
      HR_CHECK(!replacement_.empty(), "[tokenizer] ", file, ": pre_tokenizer Metaspace has an empty replacement");
      const std::string scheme = p.value("prepend_scheme", p.value("add_prefix_space", true) ? "always" : "never");
      if (scheme != "always" && scheme != "first" && scheme != "never")
        throw unsupported("Metaspace prepend_scheme", p);
      prepend_scheme_ = scheme;
      split_ = p.value("split", true);
    }
    // Post-processor: the tokens put around a single text.
    if (j.contains("post_processor") && !j["post_processor"].is_null()) {
      const json& p = j["post_processor"];
      if (p.value("type", "") != "TemplateProcessing") throw unsupported("post_processor", p);
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
              .push_back(check_id(tok::json_int(id, str(file, ": a post-processor id")), "a post-processor token"));
      }
    }
    // Decoder.
    std::function<void(const json&)> add_decoder = [&](const json& d) {
      if (d.is_null()) return;
      const std::string type = d.value("type", "");
      if (type == "Sequence") {
        for (const json& x : d.at("decoders")) add_decoder(x);
      } else if (type == "Replace" && d.at("pattern").contains("String")) {
        decoders_.push_back({Decoder::Replace, d["pattern"]["String"], d.at("content")});
      } else if (type == "ByteFallback") {
        decoders_.push_back({Decoder::ByteFallback, "", ""});
      } else if (type == "Fuse") {
        decoders_.push_back({Decoder::Fuse, "", ""});
      } else if (type == "Strip") {
        decoders_.push_back({Decoder::Strip, d.at("content"), "",
                             tok::json_int(d.at("start"), str(file, ": Strip start")),
                             tok::json_int(d.at("stop"), str(file, ": Strip stop"))});
      } else if (type == "Metaspace") {
        Decoder x{Decoder::Metaspace, d.value("replacement", std::string(tok::kMetaspace)), ""};
        x.prepend = d.value("prepend_scheme", std::string("always")) != "never";
        decoders_.push_back(x);
      } else {
        throw unsupported("decoder", d);
      }
    };
    add_decoder(j.value("decoder", json()));
    // Token roles, from tokenizer_config.json beside the file where there is one.
    const tok::TokenizerConfig cfg =
        config_dir.empty() ? tok::TokenizerConfig{} : tok::read_tokenizer_config(config_dir);
    legacy_ = cfg.legacy.is_boolean() ? cfg.legacy.get<bool>() : true;
    auto id_of = [&](const std::string& text, const char* fallback) -> int64_t {
      const std::string t = text.empty() ? fallback : text;
      for (const AddedToken& a : added_)
        if (a.content == t) return a.id;
      const auto it = vocab_.find(t);
      return it == vocab_.end() ? -1 : it->second;
    };
    bos_ = id_of(cfg.bos_token, "<s>");
    eos_ = id_of(cfg.eos_token, "</s>");
    pad_ = unk_ >= 0 ? unk_ : id_of(cfg.pad_token, "<unk>");
    image_token_ = image_token;
    for (const auto* v : {&prefix_, &suffix_})
      for (int64_t id : *v)
        HR_CHECK(id < int64_t(pieces_.size()), "[tokenizer] ", file, ": the post-processor adds id ", id,
                 ", which is not in the vocabulary");
  }

 public:
  std::vector<int64_t> encode(const std::string& text, bool add_special) const override {
    std::vector<int64_t> ids;
    if (add_special) ids = prefix_;
    for (const tok::Segment& s : tok::split_added(text, added_)) {
      if (s.added >= 0) {
        ids.push_back(s.added);
        continue;
      }
      std::string t = s.text;
      for (const Normalizer& n : normalizers_)
        if (n.kind == Normalizer::Prepend) {
          if (!t.empty()) t = n.a + t;
        } else {
          t = tok::replace_all(t, n.a, n.b);
        }
      for (const std::string& word : pre_tokenize(t, s.offset == 0)) bpe(word, ids);
    }
    if (add_special) ids.insert(ids.end(), suffix_.begin(), suffix_.end());
    return ids;
  }

  std::string decode(const std::vector<int64_t>& ids) const override {
    std::vector<std::string> tokens;
    for (int64_t id : ids) {
      if (id < 0 || id >= int64_t(pieces_.size()) || is_special(id)) continue;
      tokens.push_back(pieces_[std::size_t(id)]);
    }
    for (const Decoder& d : decoders_) tokens = apply(d, tokens);
    std::string out;
    for (const std::string& t : tokens) out += t;
    return out;
  }

  int64_t vocab_size() const override { return int64_t(pieces_.size()); }
  std::string describe() const override {
    return str("tokenizer.json ", file_, " (BPE, ", pieces_.size(), " ids, legacy ", legacy_ ? "true" : "false", ")");
  }

 private:
  std::vector<std::string> pre_tokenize(std::string t, bool at_start) const {
    if (!metaspace_) return {t};
    t = tok::replace_all(t, " ", replacement_);
    const bool starts = t.rfind(replacement_, 0) == 0;
    if (!starts && (prepend_scheme_ == "always" || (prepend_scheme_ == "first" && at_start))) t = replacement_ + t;
    if (!split_) return {t};
    std::vector<std::string> words;  // split before every replacement character (MergedWithNext)
    std::size_t begin = 0;
    for (std::size_t at = t.find(replacement_, 1); at != std::string::npos; at = t.find(replacement_, at + 1)) {
      if (at > begin) words.push_back(t.substr(begin, at - begin));
      begin = at;
    }
    if (begin < t.size()) words.push_back(t.substr(begin));
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
    struct Symbol {
      int64_t c;
      std::ptrdiff_t prev, next;
      std::size_t len;
    };
    std::vector<Symbol> sym;
    auto add = [&](int64_t id, std::size_t len) {
      const auto n = std::ptrdiff_t(sym.size());
      sym.push_back({id, n - 1, n + 1, len});
    };
    int64_t pending_unk = -1;
    std::size_t pending_len = 0;
    for (std::size_t i = 0; i < w.size();) {
      const std::size_t n = std::min(utf8_len(static_cast<unsigned char>(w[i])), w.size() - i);
      const std::string ch = w.substr(i, n);
      i += n;
      const auto it = vocab_.find(ch);
      if (it != vocab_.end()) {
        if (pending_unk >= 0) add(pending_unk, pending_len), pending_unk = -1;
        add(it->second, n);
        continue;
      }
      if (byte_fallback_) {
        std::vector<int64_t> bytes;
        for (unsigned char b : ch) {
          static const char* hex = "0123456789ABCDEF";
          const auto bt = vocab_.find(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">");
          if (bt == vocab_.end()) break;
          bytes.push_back(bt->second);
        }
        if (bytes.size() == ch.size()) {
          for (int64_t b : bytes) add(b, 1);
          continue;
        }
      }
      HR_CHECK(unk_ >= 0, "[tokenizer] ", file_, ": '", ch, "' is not in the vocabulary and there is no unk_token");
      if (pending_unk >= 0 && fuse_unk_) {
        pending_len += n;
      } else {
        if (pending_unk >= 0) add(pending_unk, pending_len);
        pending_unk = unk_, pending_len = n;
      }
    }
    if (pending_unk >= 0) add(pending_unk, pending_len);
    if (!sym.empty()) sym.back().next = -1;
    struct Merge {
      std::size_t pos;
      int64_t rank, id;
      bool operator<(const Merge& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Merge> queue;
    auto lookup = [&](int64_t a, int64_t b) {
      const auto it = merges_.find({a, b});
      return it == merges_.end() ? nullptr : &it->second;
    };
    for (std::size_t i = 0; i + 1 < sym.size(); ++i)
      if (const auto* m = lookup(sym[i].c, sym[i + 1].c)) queue.push({i, m->first, m->second});
    while (!queue.empty()) {
      const Merge top = queue.top();
      queue.pop();
      Symbol& cur = sym[top.pos];
      if (cur.len == 0 || cur.next == -1) continue;
      const auto next = std::size_t(cur.next);
      const Symbol right = sym[next];
      const auto* m = lookup(cur.c, right.c);
      if (!m || m->second != top.id) continue;
      cur.c = top.id, cur.len += right.len, cur.next = right.next;
      sym[next].len = 0;
      if (right.next > -1 && std::size_t(right.next) < sym.size())
        sym[std::size_t(right.next)].prev = std::ptrdiff_t(top.pos);
      if (cur.prev >= 0)
        if (const auto* pm = lookup(sym[std::size_t(cur.prev)].c, cur.c))
          queue.push({std::size_t(cur.prev), pm->first, pm->second});
      if (cur.next >= 0 && std::size_t(cur.next) < sym.size())
        if (const auto* nm = lookup(cur.c, sym[std::size_t(cur.next)].c)) queue.push({top.pos, nm->first, nm->second});
    }
    for (const Symbol& s : sym)
      if (s.len != 0) out.push_back(s.c);
  }

  std::vector<std::string> apply(const Decoder& d, const std::vector<std::string>& in) const {
    std::vector<std::string> out;
    switch (d.kind) {
      case Decoder::Replace:
        for (const std::string& t : in) out.push_back(tok::replace_all(t, d.a, d.b));
        return out;
      case Decoder::Fuse: {
        std::string all;
        for (const std::string& t : in) all += t;
        return {all};
      }
      case Decoder::Strip:
        for (const std::string& t : in) {
          std::size_t b = 0, e = t.size();
          for (int64_t k = 0; k < d.start && b < e && t.compare(b, d.a.size(), d.a) == 0; ++k) b += d.a.size();
          for (int64_t k = 0; k < d.stop && e >= b + d.a.size() && t.compare(e - d.a.size(), d.a.size(), d.a) == 0; ++k)
            e -= d.a.size();
          out.push_back(t.substr(b, e - b));
        }
        return out;
      case Decoder::Metaspace:
        for (std::size_t i = 0; i < in.size(); ++i) {
          std::string t = tok::replace_all(in[i], d.a, " ");
          if (i == 0 && d.prepend && !t.empty() && t[0] == ' ') t.erase(0, 1);
          out.push_back(t);
        }
        return out;
      case Decoder::ByteFallback: {
        std::string bytes;
        std::size_t count = 0;
        auto flush = [&] {
          if (count == 0) return;
          if (valid_utf8(bytes)) {
            out.push_back(bytes);
          } else {
            for (std::size_t k = 0; k < count; ++k) out.push_back("\xef\xbf\xbd");
          }
          bytes.clear(), count = 0;
        };
        for (const std::string& t : in) {
          if (t.size() == 6 && t.rfind("<0x", 0) == 0 && t[5] == '>' &&
              std::isxdigit(static_cast<unsigned char>(t[3])) && std::isxdigit(static_cast<unsigned char>(t[4]))) {
            bytes += char(std::stoi(t.substr(3, 2), nullptr, 16));
            ++count;
          } else {
            flush();
            out.push_back(t);
          }
        }
        flush();
        return out;
      }
    }
    return out;
  }

  bool is_special(int64_t id) const {
    for (const AddedToken& a : added_)
      if (a.id == id && a.special) return true;
    return false;
  }

  std::string file_, replacement_ = tok::kMetaspace, prepend_scheme_ = "always";
  std::unordered_map<std::string, int64_t> vocab_;
  std::vector<std::string> pieces_;
  std::unordered_map<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>, PairHash> merges_;
  std::vector<AddedToken> added_;
  std::vector<Normalizer> normalizers_;
  std::vector<Decoder> decoders_;
  std::vector<int64_t> prefix_, suffix_;
  int64_t unk_ = -1;
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false, metaspace_ = false, split_ = true;
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
