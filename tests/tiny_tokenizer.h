// Tiny tokenizer.json files shared by test_tokenizer and the fuzz seeds: a Llama-shaped one (the legacy form:
// Prepend + Replace normalizers, BPE with byte fallback, <s> prepended, Llama's decoders; "▁ab" is reachable by
// two merge orders, so the merge ranks matter) and a byte-level one shaped as Qwen2's.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "data/byte_level.h"

namespace hr::testing_data {

inline nlohmann::json tiny_tokenizer_json() {
  using json = nlohmann::json;
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2},    {"\u2581", 3},   {"a", 4},  {"b", 5},
                {"c", 6},     {"ab", 7},  {"\u2581a", 8}, {"\u2581ab", 9}, {"bc", 10}};
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    vocab[hex] = 11 + b;
  }
  return {
      {"added_tokens", json::array({{{"id", 0}, {"content", "<unk>"}, {"special", true}},
                                    {{"id", 1}, {"content", "<s>"}, {"special", true}},
                                    {{"id", 2}, {"content", "</s>"}, {"special", true}},
                                    {{"id", 267}, {"content", "<image>"}, {"special", true}}})},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers", json::array({{{"type", "Prepend"}, {"prepend", "\u2581"}},
                                     {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}})}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "<s>"}}}}, {{"Sequence", {{"id", "A"}}}}})},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                                  {{"type", "ByteFallback"}},
                                  {{"type", "Fuse"}},
                                  {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
      {"model",
       {{"type", "BPE"},
        {"unk_token", "<unk>"},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"vocab", vocab},
        {"merges", json::array({"a b", "\u2581 a", "b c", "\u2581a b", "\u2581 ab"})}}}};
}

// A byte-level tokenizer.json as GPT-2's and Qwen2's are written: byte b is the piece of its GPT-2 character with
// id b + kFirstByte (ids below are the added tokens), merges "Ġ w" "Ġw o" "h i" (as pairs), Qwen2's pre-tokenizer
// (NFC, Split with its regex, ByteLevel without a regex) and the ByteLevel decoder.
inline constexpr int64_t kFirstByte = 4;
inline constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

inline nlohmann::json tiny_byte_level_tokenizer_json() {
  using json = nlohmann::json;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[hr::data::tok::bytes_to_chars(std::string(1, char(b)))] = kFirstByte + b;
  vocab["\u0120w"] = 260, vocab["\u0120wo"] = 261, vocab["hi"] = 262;
  auto added = [](int64_t id, const char* content, bool special) {
    return json{{"id", id},        {"content", content},     {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", !special}, {"special", special}};
  };
  return {
      {"added_tokens", json::array({added(0, "<|endoftext|>", true), added(1, "<|im_start|>", true),
                                    added(2, "<|im_end|>", true), added(3, "caf\u00e9", false)})},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array(
             {{{"type", "Split"}, {"pattern", {{"Regex", kQwen2Pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
      {"post_processor", {{"type", "ByteLevel"}, {"trim_offsets", false}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", json::array({{"\u0120", "w"}, {"\u0120w", "o"}, {"h", "i"}})}}}};
}

}  // namespace hr::testing_data
