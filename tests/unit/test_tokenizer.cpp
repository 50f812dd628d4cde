// Tokenizers without the Python oracles: a hand-written tokenizer.json (BPE merges by rank, byte fallback,
// added tokens, normalizer, decoder), the byte tokenizer through the interface, and the errors that name what a
// file holds that headroom does not read. tests/integration/test_tokenizer_oracle.cpp checks real ones.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "data/conversation.h"
#include "data/tokenizer.h"
#include "data/tokenizer_parts.h"
#include "tiny_tokenizer.h"

using namespace hr;
using namespace hr::data;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("hr_tokenizer_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text;
}

json tiny() {
  return hr::testing_data::tiny_tokenizer_json();
}

std::shared_ptr<const Tokenizer> load_json(const json& j, const std::string& name) {
  const fs::path d = scratch(name);
  write(d / "tokenizer.json", j.dump());
  return load_tokenizer(d.string(), 300, 267);
}

}  // namespace

TEST(Tokenizer, TokenizerJsonMergesByRankWithByteFallbackAndAddedTokens) {
  const auto t = load_json(tiny(), "tiny");
  // "▁abc": merges a+b (rank 0) first, then ▁+ab (rank 4) -> "▁ab" "c"; "bc" (rank 2) loses to "ab".
  EXPECT_EQ(t->encode("abc", SpecialTokens::Omit), (std::vector<int64_t>{9, 6}));
  EXPECT_EQ(t->encode("abc", SpecialTokens::Add), (std::vector<int64_t>{1, 9, 6}));
  // "é" is not in the vocabulary: its two UTF-8 bytes.
  EXPECT_EQ(t->encode("é", SpecialTokens::Omit), (std::vector<int64_t>{3, 11 + 0xC3, 11 + 0xA9}));
  // Added tokens split the text; Prepend puts "▁" in front of every piece of text between them.
  EXPECT_EQ(t->encode("a</s>b<image>", SpecialTokens::Omit), (std::vector<int64_t>{8, 2, 3, 5, 267}));
  EXPECT_EQ(t->decode(t->encode("abc é c", SpecialTokens::Add)), "abc é c");
  EXPECT_EQ(t->bos(), 1);
  EXPECT_EQ(t->eos(), 2);
  EXPECT_EQ(t->pad(), 0);  // LLaVA pads with <unk>
}

TEST(Tokenizer, UnsupportedPartsAreNamedErrors) {
  json j = tiny();
  j["pre_tokenizer"] = {{"type", "ByteLevel"}};
  try {
    load_json(j, "bytelevel");
    FAIL() << "a ByteLevel pre-tokenizer must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pre_tokenizer 'ByteLevel' is not supported"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
  }
  j = tiny();
  j["model"]["type"] = "Unigram";
  EXPECT_THROW(load_json(j, "unigram"), Error);
  j = tiny();
  j["normalizer"] = {{"type", "NFKC"}};
  EXPECT_THROW(load_json(j, "nfkc"), Error);
  j = tiny();
  j["added_tokens"][3]["normalized"] = true;
  EXPECT_THROW(load_json(j, "normalized"), Error);
}

TEST(Tokenizer, LoaderErrorsNameThePath) {
  const fs::path empty = scratch("empty");
  try {
    load_tokenizer(empty.string(), 300, 267);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds neither tokenizer.model nor tokenizer.json"), std::string::npos);
  }
  write(empty / "tokenizer.model", "not a protobuf");
  EXPECT_THROW(load_tokenizer(empty.string(), 300, 267), Error);
  // The model's vocabulary must hold every id the tokenizer can produce.
  try {
    const fs::path d = scratch("vocab");
    write(d / "tokenizer.json", tiny().dump());
    load_tokenizer(d.string(), 100, 50);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model's vocabulary (model.llm.vocab_size) is 100"), std::string::npos)
        << e.what();
  }
}

TEST(Tokenizer, SplitAddedIsLeftmostLongestAndStrips) {
  using tok::AddedToken;
  const std::vector<AddedToken> added = {{"<s>", 1}, {"<s>x", 7, true, true}};
  const auto seg = tok::split_added("a <s>x  b<s>", added);
  ASSERT_EQ(seg.size(), 4u);
  EXPECT_EQ(seg[0].text, "a");  // lstrip took the space
  EXPECT_EQ(seg[1].added, 7);
  EXPECT_EQ(seg[2].text, "b");  // rstrip took both spaces
  EXPECT_EQ(seg[3].added, 1);
}

TEST(Tokenizer, ByteTokenizerThroughTheInterface) {
  const auto t = load_tokenizer("byte", 300, 299);
  EXPECT_TRUE(t->is_bytes());
  EXPECT_EQ(t->encode("hi", SpecialTokens::Add), (std::vector<int64_t>{1, 'h' + 3, 'i' + 3}));
  EXPECT_EQ(t->decode({1, 'h' + 3, 2, 'x' + 3}), "h");
  // llava_llama_2 is defined by real tokens only.
  EXPECT_THROW(apply_template(Template::Llama2, {{true, "q"}, {false, "a"}}, *t, 4, "default", -100), Error);
}

// LLaVA's preprocess_multimodal strips the question with Python's str.strip(), which takes every character
// str.isspace() calls whitespace: a CJK question after "<image>\n" begins with U+3000, and an ASCII-only strip kept it,
// tokenizing otherwise than LLaVA. Each of Python's non-ASCII spaces and separators goes, at either end.
TEST(Template, TheImageQuestionIsStrippedAsPythonStripsIt) {
  const auto t = load_json(tiny(), "python_strip");
  auto ids = [&](const std::string& question) {
    return apply_template(Template::VicunaV1, {{true, "<image>\n" + question}, {false, "ab"}}, *t, 4, "", -100).ids;
  };
  const std::vector<int64_t> plain = ids("abc");
  for (const char* space : {"\u3000", "\u00a0", "\u2003", "\u2028", "\u0085", "\u202f", "\x1c", "\x1f", "\u1680",
                            "\u205f", "\u2029", "\t\u3000 "}) {
    EXPECT_EQ(ids(std::string(space) + "abc"), plain) << "leading U+" << std::hex << int(space[0] & 0xff);
    EXPECT_EQ(ids("abc" + std::string(space)), plain) << "trailing U+" << std::hex << int(space[0] & 0xff);
  }
  // Not whitespace to Python: a zero-width space (U+200B) stays.
  EXPECT_NE(ids("\u200b"
                "abc"),
            plain);
}
