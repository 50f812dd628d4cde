// SentencePiece `tokenizer.model` through Debian's libsentencepiece, wrapped the way Hugging Face's slow
// LlamaTokenizer wraps it (LLaVA trains with use_fast=False): added tokens split the text first, each piece of
// text is encoded on its own, <s> is prepended (add_bos_token), and with `legacy: false` the model's dummy prefix
// is switched off and a "▁" put in front of the whole text instead (so no "▁" appears after a special token).
#include <sentencepiece_processor.h>

#include <filesystem>

#include "core/check.h"
#include "data/tokenizer.h"
#include "data/tokenizer_parts.h"

namespace hr::data {

namespace {

using tok::AddedToken;

// --- a minimal protobuf edit: ModelProto.normalizer_spec (field 3).add_dummy_prefix (field 3) = false, as
// transformers' get_spm_processor does for legacy=False. Protobuf keeps the last value of a repeated scalar, so
// appending the field to the message is enough.
uint64_t read_varint(const std::string& s, std::size_t& at, const std::string& file) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    HR_CHECK(at < s.size(), "[tokenizer] ", file, " is not a SentencePiece model (truncated protobuf)");
    const auto b = uint8_t(s[at++]);
    v |= uint64_t(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
  throw Error(str("[tokenizer] ", file, " is not a SentencePiece model (bad varint)"));
}

void write_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += char(uint8_t(v) | 0x80);
    v >>= 7;
  }
  out += char(v);
}

std::string without_dummy_prefix(const std::string& model, const std::string& file) {
  std::string out;
  std::size_t at = 0;
  bool edited = false;
  while (at < model.size()) {
    const std::size_t start = at;
    const uint64_t key = read_varint(model, at, file);
    const uint64_t field = key >> 3, wire = key & 7;
    if (wire == 0) {
      read_varint(model, at, file);
    } else if (wire == 1 || wire == 5) {
      at += wire == 1 ? 8 : 4;
    } else if (wire == 2) {
      const uint64_t len = read_varint(model, at, file);
      HR_CHECK(at + len <= model.size(), "[tokenizer] ", file, " is not a SentencePiece model (truncated field)");
      if (field == 3) {
        std::string spec = model.substr(at, len);
        spec += char(0x18), spec += char(0);  // field 3, varint: add_dummy_prefix = false
        write_varint(out, key);
        write_varint(out, spec.size());
        out += spec;
        at += len;
        edited = true;
        continue;
      }
      at += len;
    } else {
      throw Error(str("[tokenizer] ", file, " is not a SentencePiece model (wire type ", wire, ")"));
    }
    HR_CHECK(at <= model.size(), "[tokenizer] ", file, " is not a SentencePiece model (truncated)");
    out.append(model, start, at - start);
  }
  if (!edited) {  // no normalizer_spec at all: add one that only says add_dummy_prefix = false
    write_varint(out, (3 << 3) | 2);
    write_varint(out, 2);
    out += char(0x18), out += char(0);
  }
  return out;
}

void load_proto(sentencepiece::SentencePieceProcessor& sp, const std::string& proto, const std::string& file) {
  const auto status = sp.LoadFromSerializedProto(proto);
  HR_CHECK(status.ok(), "[tokenizer] ", file, " is not a SentencePiece model: ", status.ToString());
}

bool flag_or(const nlohmann::json& v, bool fallback) {  // a tokenizer_config.json flag, `fallback` where absent
  return v.is_boolean() ? v.get<bool>() : fallback;
}

class SentencePieceTokenizer : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& file, int64_t image_token) : file_(file) {
    const std::string bytes = tok::read_file(file);
    load_proto(decoder_, bytes, file);
    const std::string dir = std::filesystem::path(file).parent_path().string();
    const tok::TokenizerConfig cfg = tok::read_tokenizer_config(dir);
    // transformers' LlamaTokenizer: legacy defaults to True (with a warning), add_bos_token to True.
    legacy_ = flag_or(cfg.legacy, true);
    add_bos_ = flag_or(cfg.add_bos_token, true);
    add_eos_ = flag_or(cfg.add_eos_token, false);
    add_prefix_space_ = flag_or(cfg.add_prefix_space, true);
    load_proto(sp_, legacy_ ? bytes : without_dummy_prefix(bytes, file), file);
    vocab_ = decoder_.GetPieceSize();
    unk_ = decoder_.unk_id();
    unk_text_ = cfg.unk_token.empty() ? decoder_.IdToPiece(unk_) : cfg.unk_token;
    bos_ = piece_id(cfg, dir, cfg.bos_token, decoder_.bos_id());
    eos_ = piece_id(cfg, dir, cfg.eos_token, decoder_.eos_id());
    pad_ = unk_;  // LLaVA: tokenizer.pad_token = tokenizer.unk_token
    image_token_ = image_token;
    register_added(cfg.added);
    unk_len_ = int64_t(sp_.EncodeAsIds(unk_text_).size());
  }

  std::vector<int64_t> encode(const std::string& input, SpecialTokens special) const override {
    const std::string text = with_prefix_space(input);
    std::vector<int64_t> ids;
    if (special == SpecialTokens::Add && add_bos_ && bos_ >= 0) ids.push_back(bos_);
    const std::size_t first = ids.size();
    for (const tok::Segment& s : tok::split_added(text, added_)) {
      if (s.added >= 0) {
        ids.push_back(s.added);
        continue;
      }
      for (int id : encode_text(s.text)) ids.push_back(id);
    }
    drop_lone_prefix(ids, first);
    if (special == SpecialTokens::Add && add_eos_ && eos_ >= 0) ids.push_back(eos_);
    return ids;
  }

  std::string decode(const std::vector<int64_t>& ids) const override {
    std::vector<int> keep;
    for (int64_t id : ids)
      if (!is_special(id) && id >= 0 && id < decoder_.GetPieceSize()) keep.push_back(int(id));
    return decoder_.DecodeIds(keep);
  }

  int64_t vocab_size() const override { return vocab_; }
  std::string describe() const override {
    return str("sentencepiece ", file_, " (", vocab_, " ids, legacy ", legacy_ ? "true" : "false", ")");
  }

 private:
  // The id of a token tokenizer_config.json (in `dir`) names: an added token, else a piece of the model;
  // `fallback` where it names none.
  int64_t piece_id(const tok::TokenizerConfig& cfg, const std::string& dir, const std::string& piece,
                   int64_t fallback) const {
    if (piece.empty()) return fallback;
    for (const AddedToken& a : cfg.added)
      if (a.content == piece) return a.id;
    const int id = decoder_.PieceToId(piece);
    HR_CHECK(id != decoder_.unk_id() || piece == decoder_.IdToPiece(decoder_.unk_id()), "[tokenizer] ", dir,
             "/tokenizer_config.json names the token '", piece, "', which ", file_, " does not have");
    return id;
  }

  // The specials transformers always registers, then the config's added tokens.
  void register_added(const std::vector<AddedToken>& config_added) {
    added_ = config_added;
    for (int64_t id : {unk_, bos_, eos_}) {
      if (id < 0) continue;
      bool known = false;
      for (const AddedToken& a : added_) known |= a.id == id;
      if (!known) added_.push_back({decoder_.IdToPiece(int(id)), id, false, false, true, false});
    }
    for (const AddedToken& a : added_) vocab_ = std::max<int64_t>(vocab_, a.id + 1);
  }

  // Without legacy, the text's own "▁" are spaces and one "▁" goes in front of it (add_prefix_space).
  std::string with_prefix_space(const std::string& input) const {
    std::string text = input;
    if (!legacy_ && !text.empty()) {
      text = tok::replace_all(text, tok::kMetaspace, " ");
      if (add_prefix_space_) text = tok::kMetaspace + text;
    }
    return text;
  }

  // LlamaTokenizer.tokenize: a lone "▁" in front of a special token is dropped.
  void drop_lone_prefix(std::vector<int64_t>& ids, std::size_t first) const {
    if (!legacy_ && ids.size() > first + 1 && decoder_.IdToPiece(int(ids[first])) == tok::kMetaspace &&
        is_special(ids[first + 1]))
      ids.erase(ids.begin() + std::ptrdiff_t(first));
  }

  // LlamaTokenizer._tokenize: without legacy, text that starts with a space is encoded behind the unk token's
  // text, whose pieces are then dropped (so that "▁" is not merged as a dummy prefix would be).
  std::vector<int> encode_text(const std::string& text) const {
    const bool spaced = text.rfind(tok::kMetaspace, 0) == 0 || text.rfind(' ', 0) == 0;
    if (legacy_ || !spaced) return sp_.EncodeAsIds(text);
    std::vector<int> ids = sp_.EncodeAsIds(unk_text_ + text);
    if (int64_t(ids.size()) >= unk_len_) ids.erase(ids.begin(), ids.begin() + unk_len_);
    return ids;
  }
  bool is_special(int64_t id) const {
    for (const AddedToken& a : added_)
      if (a.id == id && a.special) return true;
    return false;
  }

  std::string file_, unk_text_;
  sentencepiece::SentencePieceProcessor sp_, decoder_;
  std::vector<AddedToken> added_;
  int64_t vocab_ = 0, unk_ = 0, unk_len_ = 0;
  bool add_bos_ = true, add_eos_ = false, add_prefix_space_ = true;
};

}  // namespace

std::shared_ptr<const Tokenizer> load_sentencepiece(const std::string& file, int64_t image_token) {
  return std::make_shared<SentencePieceTokenizer>(file, image_token);
}

}  // namespace hr::data
