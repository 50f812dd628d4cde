// Tokenizers: the interface the data pipeline, evaluation and generation use, the built-in byte-level one, and
// the loader of real ones (SentencePiece `tokenizer.model`, Hugging Face `tokenizer.json`; data/sp_tokenizer.cpp,
// data/hf_tokenizer.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hr::data {

// Hugging Face's add_special_tokens: whether encode adds the tokens a tokenizer puts around a text (Llama: <s>).
enum class SpecialTokens : uint8_t { Omit, Add };

// Ids as Hugging Face's `tokenizer(text).input_ids` gives them. The image placeholder is the model's
// image_token_index, which a real tokenizer may or may not know as a token ("<image>" in llava-hf).
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Special tokens written in the text ("</s>", "<s>", added tokens) become their ids (the byte tokenizer
  // knows none); with SpecialTokens::Add, the tokens the tokenizer adds around a text (Llama: <s> first).
  virtual std::vector<int64_t> encode(const std::string& text, SpecialTokens special = SpecialTokens::Omit) const = 0;
  // Text of the ids, special tokens skipped (skip_special_tokens=True).
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual std::string describe() const = 0;  // "sentencepiece /path/tokenizer.model (32000 pieces)"
  int64_t bos() const { return bos_; }
  int64_t eos() const { return eos_; }
  int64_t pad() const { return pad_; }  // LLaVA pads with <unk> (v1, llama_2, plain)
  int64_t image_token() const { return image_token_; }
  // Hugging Face's LlamaTokenizer `legacy` flag: LLaVA's v1 masking shortens every round after the first by
  // one token when it is false.
  bool legacy() const { return legacy_; }
  bool is_bytes() const { return bytes_; }

 protected:
  int64_t bos_ = -1, eos_ = -1, pad_ = -1, image_token_ = -1;
  bool legacy_ = true, bytes_ = false;
};

// The built-in byte-level tokenizer: every UTF-8 byte is a token (id = byte + 3), with <pad>=0, <s>=1, </s>=2,
// and the image placeholder at the model's image_token_index. Needs a vocabulary of at least 259.
class ByteTokenizer : public Tokenizer {
 public:
  static constexpr int64_t kPad = 0, kBos = 1, kEos = 2, kByteOffset = 3;
  static constexpr int64_t kMinVocab = 256 + kByteOffset;

  ByteTokenizer(int64_t vocab, int64_t image_token);
  std::vector<int64_t> encode(const std::string& text, SpecialTokens special = SpecialTokens::Omit) const override;
  // Bytes of the ids that are bytes; specials are skipped, decoding stops at </s>.
  std::string decode(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_; }
  std::string describe() const override;

 private:
  int64_t vocab_;
};

// Loads `path`: "byte" (the built-in one), a `tokenizer.model` (SentencePiece, as Hugging Face's slow
// LlamaTokenizer uses it, which is what LLaVA trains with), a `tokenizer.json`, or a directory holding one of them
// (tokenizer.model first). A directory's tokenizer_config.json gives `legacy`, `add_bos_token`, `add_eos_token`
// and the added tokens. Throws naming the file and the part it does not support. The image token must be a
// token of the tokenizer or lie past its vocabulary (below model_vocab).
std::shared_ptr<const Tokenizer> load_tokenizer(const std::string& path, int64_t model_vocab, int64_t image_token);

// A tokenizer.json's content (`name` stands for the file in errors), without a tokenizer_config.json.
std::shared_ptr<const Tokenizer> tokenizer_json_from_text(const std::string& text, const std::string& name,
                                                          int64_t image_token);

// The tokenizer file a directory holds ("" if none).
std::string find_tokenizer_file(const std::string& dir);

}  // namespace hr::data
