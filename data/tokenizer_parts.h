// Pieces the real tokenizers share: added (special) tokens and how text splits around them, and the
// tokenizer_config.json settings Hugging Face keeps beside a tokenizer file.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace hr::data::tok {

struct AddedToken {
  std::string content;
  int64_t id = -1;
  bool lstrip = false, rstrip = false, special = true, normalized = false;
};

// A run of text between added tokens, or one added token.
struct Segment {
  int64_t added = -1;  // the added token's id, or -1 for text
  std::string text;
  std::size_t offset = 0;  // byte offset of the segment in the input
};

// Splits `text` at the added tokens, leftmost first and the longest at one place (as tokenizers' Aho-Corasick
// and transformers' Trie do). lstrip/rstrip take the whitespace beside a token into it. Empty text is dropped.
std::vector<Segment> split_added(const std::string& text, const std::vector<AddedToken>& added);

// tokenizer_config.json (and the older added_tokens.json) of the directory `dir`; nulls where absent.
struct TokenizerConfig {
  bool found = false;
  nlohmann::json legacy, add_bos_token, add_eos_token, add_prefix_space;
  std::string bos_token, eos_token, unk_token, pad_token;  // "" where not given
  std::vector<AddedToken> added;
};
TokenizerConfig read_tokenizer_config(const std::string& dir);

std::string read_file(const std::string& path);
// An integer of a JSON file, refused (naming `what`) when it is not one: a float such as 1e91 would not fit.
int64_t json_int(const nlohmann::json& v, const std::string& what);
std::string replace_all(std::string s, const std::string& from, const std::string& to);

constexpr const char* kMetaspace = "\xe2\x96\x81";  // "▁", SentencePiece's visible space

}  // namespace hr::data::tok
