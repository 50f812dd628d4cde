// The byte-level tokenizer, the pieces real tokenizers share, and the loader that picks one.
#include "data/tokenizer.h"

#include <filesystem>
#include <fstream>

#include "core/check.h"
#include "core/io/text_file.h"
#include "data/tokenizer_parts.h"

namespace hr::data {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::shared_ptr<const Tokenizer> load_sentencepiece(const std::string& file, int64_t image_token);
std::shared_ptr<const Tokenizer> load_hf_tokenizer_json(const std::string& file, int64_t image_token);

ByteTokenizer::ByteTokenizer(int64_t vocab, int64_t image_token) : vocab_(vocab) {
  HR_CHECK(vocab >= kMinVocab, "[tokenizer] the byte-level tokenizer needs model.llm.vocab_size >= ", kMinVocab,
           "; got ", vocab);
  HR_CHECK(image_token >= kMinVocab && image_token < vocab, "[tokenizer] model.image_token_index ", image_token,
           " must lie in [", kMinVocab, ", ", vocab, ") so it collides with no byte");
  bos_ = kBos, eos_ = kEos, pad_ = kPad, image_token_ = image_token, bytes_ = true;
}

std::vector<int64_t> ByteTokenizer::encode(const std::string& text, SpecialTokens special) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size() + 1);
  if (special == SpecialTokens::Add) ids.push_back(kBos);
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

std::string ByteTokenizer::describe() const {
  return str("byte-level (", vocab_, " ids)");
}

std::string find_tokenizer_file(const std::string& dir) {
  for (const char* name : {"tokenizer.model", "tokenizer.json"})
    if (fs::is_regular_file(fs::path(dir) / name)) return (fs::path(dir) / name).string();
  return "";
}

std::shared_ptr<const Tokenizer> load_tokenizer(const std::string& path, int64_t model_vocab, int64_t image_token) {
  if (path.empty() || path == "byte") return std::make_shared<ByteTokenizer>(model_vocab, image_token);
  std::string file = path;
  if (fs::is_directory(path)) {
    file = find_tokenizer_file(path);
    HR_CHECK(!file.empty(), "[tokenizer] ", path, " holds neither tokenizer.model nor tokenizer.json");
  }
  HR_CHECK(fs::is_regular_file(file), "[tokenizer] ", file, " does not exist");
  const std::string name = fs::path(file).filename().string();
  std::shared_ptr<const Tokenizer> t;
  if (name.size() >= 5 && name.substr(name.size() - 5) == ".json")
    t = load_hf_tokenizer_json(file, image_token);
  else
    t = load_sentencepiece(file, image_token);
  HR_CHECK(t->vocab_size() <= model_vocab, "[tokenizer] ", file, " has ", t->vocab_size(),
           " ids but the model's vocabulary (model.llm.vocab_size) is ", model_vocab);
  HR_CHECK(image_token >= 0 && image_token < model_vocab, "[tokenizer] model.image_token_index ", image_token,
           " is outside the model's vocabulary of ", model_vocab);
  return t;
}

namespace tok {

std::string read_file(const std::string& path) {
  return core::read_text_file(path, "tokenizer");
}

int64_t json_int(const json& v, const std::string& what) {
  HR_CHECK(v.is_number_integer(), "[tokenizer] ", what, " must be an integer; got ", v.dump());
  HR_CHECK(!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t(INT64_MAX), "[tokenizer] ", what, " ", v.dump(),
           " is out of range");
  return v.get<int64_t>();
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  std::string out;
  std::size_t at = 0;
  for (std::size_t hit = s.find(from); hit != std::string::npos; hit = s.find(from, at)) {
    out.append(s, at, hit - at).append(to);
    at = hit + from.size();
  }
  return out.append(s, at, std::string::npos);
}

namespace {
bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
}  // namespace

std::vector<Segment> split_added(const std::string& text, const std::vector<AddedToken>& added) {
  std::vector<Segment> out;
  std::size_t text_start = 0, at = 0;
  auto flush = [&](std::size_t end) {
    if (end > text_start) out.push_back({-1, text.substr(text_start, end - text_start), text_start});
  };
  while (at < text.size()) {
    const AddedToken* best = nullptr;
    for (const AddedToken& t : added)
      if (!t.content.empty() && text.compare(at, t.content.size(), t.content) == 0 &&
          (!best || t.content.size() > best->content.size()))
        best = &t;
    if (!best) {
      ++at;
      continue;
    }
    std::size_t left = at, right = at + best->content.size();
    if (best->lstrip)
      while (left > text_start && is_space(text[left - 1])) --left;
    if (best->rstrip)
      while (right < text.size() && is_space(text[right])) ++right;
    flush(left);
    out.push_back({best->id, best->content, left});
    at = text_start = right;
  }
  flush(text.size());
  return out;
}

namespace {

// A special token as tokenizer_config.json writes it: a string, or an AddedToken object with its content.
std::string token_text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"];
  return "";
}

// tokenizer_config.json: the flags, the special tokens, and added_tokens_decoder.
void read_config_file(const fs::path& cfg, TokenizerConfig& c) {
  json j;
  try {
    j = json::parse(read_file(cfg.string()));
  } catch (const json::exception& e) {
    throw Error(str("[tokenizer] ", cfg.string(), " is not valid JSON: ", e.what()));
  }
  c.found = true;
  auto flag = [&](const char* key) { return j.contains(key) ? j[key] : json(); };
  c.legacy = flag("legacy");
  c.add_bos_token = flag("add_bos_token");
  c.add_eos_token = flag("add_eos_token");
  c.add_prefix_space = flag("add_prefix_space");
  for (auto [key, into] : {std::pair{"bos_token", &c.bos_token}, std::pair{"eos_token", &c.eos_token},
                           std::pair{"unk_token", &c.unk_token}, std::pair{"pad_token", &c.pad_token}})
    if (j.contains(key)) *into = token_text(j[key]);
  if (!j.contains("added_tokens_decoder") || !j["added_tokens_decoder"].is_object()) return;
  for (const auto& [id, t] : j["added_tokens_decoder"].items()) {
    AddedToken a;
    a.id = json_int(json::parse(id, nullptr, false), str(cfg.string(), ": added_tokens_decoder key '", id, "'"));
    a.content = token_text(t);
    a.lstrip = t.value("lstrip", false);
    a.rstrip = t.value("rstrip", false);
    a.special = t.value("special", false);
    a.normalized = t.value("normalized", false);
    c.added.push_back(a);
  }
}

// added_tokens.json (older tokenizers): token -> id, for the tokens the config does not already name.
void read_added_tokens(const fs::path& older, TokenizerConfig& c) {
  json j = json::parse(read_file(older.string()), nullptr, false);
  HR_CHECK(j.is_object(), "[tokenizer] ", older.string(), " is not a JSON object of token: id");
  for (const auto& [content, id] : j.items()) {
    bool known = false;
    for (const AddedToken& a : c.added) known |= a.content == content;
    if (!known)
      c.added.push_back({content, json_int(id, str(older.string(), ": '", content, "'")), false, false, true, false});
  }
}

}  // namespace

TokenizerConfig read_tokenizer_config(const std::string& dir) {
  TokenizerConfig c;
  const fs::path cfg = fs::path(dir) / "tokenizer_config.json";
  if (fs::is_regular_file(cfg)) read_config_file(cfg, c);
  const fs::path older = fs::path(dir) / "added_tokens.json";
  if (fs::is_regular_file(older)) read_added_tokens(older, c);
  return c;
}

}  // namespace tok
}  // namespace hr::data
