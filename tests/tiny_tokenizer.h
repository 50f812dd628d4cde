// A Llama-shaped tokenizer.json over a tiny vocabulary (the legacy form: Prepend + Replace normalizers, BPE with
// byte fallback, <s> prepended, Llama's decoders), shared by test_tokenizer and the fuzz seeds. "▁ab" is
// reachable by two merge orders, so the merge ranks matter.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>

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

}  // namespace hr::testing_data
