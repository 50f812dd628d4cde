// Tokenizers without the Python oracles: a hand-written tokenizer.json (BPE merges by rank, byte fallback,
// added tokens, normalizer, decoder), a hand-written byte-level one (GPT-2's byte map, the regex splits, NFC,
// lossy decoding), the byte tokenizer through the interface, the errors that name what a file holds that
// headroom does not read, and the exact strings and label masks of the templates.
// tests/integration/test_tokenizer_oracle.cpp checks real ones.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "data/byte_level.h"
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

// The message of the error loading `j` throws ("" when it loads).
std::string load_error(const json& j, const std::string& name) {
  try {
    load_json(j, name);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Tokenizer, UnsupportedPartsAreNamedErrors) {
  json j = tiny();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  std::string e = load_error(j, "whitespace");
  EXPECT_NE(e.find("tokenizer.json: pre_tokenizer 'Whitespace' is not supported"), std::string::npos) << e;
  // Inside a Sequence, the error names the step's place.
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", json::array({{{"type", "ByteLevel"}}, {{"type", "Digits"}}})}};
  e = load_error(j, "digits");
  EXPECT_NE(e.find("pre_tokenizer.pretokenizers[1] 'Digits' is not supported"), std::string::npos) << e;
  // A regex PCRE2 refuses: the file, the key and PCRE2's reason.
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"}, {"pattern", {{"Regex", "(a|b"}}}, {"behavior", "Isolated"}}})}};
  e = load_error(j, "regex");
  EXPECT_NE(e.find("tokenizer.json: pre_tokenizer.pretokenizers[0].pattern.Regex: missing closing parenthesis"),
            std::string::npos)
      << e;
  j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", "Odd"}};
  e = load_error(j, "behavior");
  EXPECT_NE(e.find("pre_tokenizer.pretokenizers[0].behavior '\"Odd\"' is not supported"), std::string::npos) << e;
  j = tiny();
  j["model"]["type"] = "Unigram";
  EXPECT_THROW(load_json(j, "unigram"), Error);
  j = tiny();
  j["normalizer"] = {{"type", "NFKC"}};
  EXPECT_NE(load_error(j, "nfkc").find("normalizer 'NFKC' is not supported"), std::string::npos);
  j = tiny();
  j["added_tokens"][3]["single_word"] = true;
  EXPECT_NE(load_error(j, "single_word").find("with single_word"), std::string::npos);
  j = tiny();
  j["post_processor"] = {{"type", "RobertaProcessing"}};
  EXPECT_NE(load_error(j, "roberta").find("post_processor 'RobertaProcessing' is not supported"), std::string::npos);
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

namespace {

using hr::testing_data::kFirstByte;
using hr::testing_data::kQwen2Pattern;

json byte_level_json() {
  return hr::testing_data::tiny_byte_level_tokenizer_json();
}

std::vector<int64_t> bytes_of(const std::string& s) {
  std::vector<int64_t> ids;
  for (unsigned char c : s) ids.push_back(kFirstByte + c);
  return ids;
}

std::vector<std::string> split_with(const char* pattern, const std::string& text, tok::SplitBehavior b,
                                    bool literal = false, bool invert = false) {
  return tok::split_text(text, tok::Regex(pattern, literal, "test"), b, invert);
}

}  // namespace

// GPT-2's map: printable bytes stand for themselves, the others from U+0100 on ("Ġ" is the space, "Ċ" the
// newline); decoding maps back, and bytes that are not UTF-8 become U+FFFD as Rust's from_utf8_lossy makes them.
TEST(ByteLevel, Gpt2ByteMapAndLossyDecoding) {
  EXPECT_EQ(tok::bytes_to_chars(" \n!a\xc3\xa9"), "\u0120\u010a!a\u00c3\u00a9");
  EXPECT_EQ(tok::chars_to_bytes({"\u0120\u010a!a", "\u00c3\u00a9"}), " \n!a\u00e9");
  EXPECT_EQ(tok::chars_to_bytes({"a b"}), "a b");  // a space is no GPT-2 character: the token's own bytes
  EXPECT_EQ(tok::utf8_lossy("a\xff\xe2\x82z\xf0\x9f\x98"), "a\ufffd\ufffdz\ufffd");
  EXPECT_EQ(tok::utf8_lossy("\xed\xa0\x80"), "\ufffd\ufffd\ufffd");  // a surrogate: three subparts
  EXPECT_EQ(tok::utf8_error("ok\xc3"), 2u);
  EXPECT_EQ(tok::utf8_error("\u00e9\U0001f600"), std::string::npos);
  EXPECT_EQ(tok::nfc("cafe\u0301 \u212b \u1100\u1161\u11a8"), "caf\u00e9 \u00c5 \uac01");
}

// The splits of `tokenizers` 0.20.3 (pre_tokenize_str) for Qwen2's and GPT-2's patterns and the behaviours.
TEST(ByteLevel, RegexSplitsAsTokenizers) {
  using B = tok::SplitBehavior;
  EXPECT_EQ(split_with(kQwen2Pattern, "I'M  don'T 123 x\n\n  y", B::Isolated),
            (std::vector<std::string>{"I", "'M", " ", " don", "'T", " ", "1", "2", "3", " x", "\n\n", " ", " y"}));
  // U+180E is no space to Oniguruma (PCRE2's \s holds it); U+3000 is one.
  EXPECT_EQ(split_with(kQwen2Pattern, "a\u180e b \u3000 c", B::Isolated),
            (std::vector<std::string>{"a", "\u180e", " b", " \u3000", " c"}));
  EXPECT_EQ(split_with(kQwen2Pattern, "中文，OK!?\t\tz", B::Isolated),
            (std::vector<std::string>{"中文", "，OK", "!?", "\t", "\tz"}));
  EXPECT_EQ(split_with(tok::kGpt2Pattern, "Hello  world's 42", B::Isolated),
            (std::vector<std::string>{"Hello", " ", " world", "'s", " 42"}));
  const std::string t = "a--b-c-";
  EXPECT_EQ(split_with("-", t, B::Removed, true), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(split_with("-", t, B::MergedWithPrevious, true), (std::vector<std::string>{"a-", "-", "b-", "c-"}));
  EXPECT_EQ(split_with("-", t, B::MergedWithNext, true), (std::vector<std::string>{"a", "-", "-b", "-c", "-"}));
  EXPECT_EQ(split_with("-", t, B::Contiguous, true), (std::vector<std::string>{"a", "--", "b", "-", "c", "-"}));
  EXPECT_EQ(split_with("-", t, B::Removed, true, true), (std::vector<std::string>{"-", "-", "-", "-"}));
}

TEST(ByteLevel, Qwen2ShapedTokenizerJson) {
  const auto t = load_json(byte_level_json(), "byte_level");
  // " wo" merges Ġ+w then Ġw+o; "hi" one merge; the special tokens split the text before anything else.
  EXPECT_EQ(t->encode("hi wo<|im_end|>\n", SpecialTokens::Add), (std::vector<int64_t>{262, 261, 2, kFirstByte + '\n'}));
  // NFC first: the decomposed "é" is the composed one's two bytes; the normalized added token "café" matches
  // after NFC, the text as written does not hold it.
  EXPECT_EQ(t->encode("e\u0301", SpecialTokens::Omit), bytes_of("\u00e9"));
  EXPECT_EQ(t->encode("cafe\u0301!", SpecialTokens::Omit), (std::vector<int64_t>{3, kFirstByte + '!'}));
  // Decoding skips the special tokens and undoes the byte map.
  EXPECT_EQ(t->decode(t->encode("<|im_start|>user\n日本 wo<|im_end|>", SpecialTokens::Omit)), "user\n日本 wo");
  EXPECT_EQ(t->decode({kFirstByte + 0xE6, kFirstByte + 'x'}), "\ufffdx");
  // Text that is not UTF-8 is refused by name, as the regex and NFC read code points.
  try {
    t->encode("ok\xff", SpecialTokens::Omit);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not valid UTF-8 (byte 2)"), std::string::npos) << e.what();
  }
  // Merges written as "left right" strings read the same.
  json j = byte_level_json();
  j["model"]["merges"] = json::array({"\u0120 w", "\u0120w o", "h i"});
  EXPECT_EQ(load_json(j, "string_merges")->encode(" wo hi", SpecialTokens::Omit),
            (std::vector<int64_t>{261, 4 + ' ', 262}));
  // GPT-2's shape: ByteLevel alone (its own regex) with add_prefix_space.
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  EXPECT_EQ(load_json(j, "gpt2")->encode("wo", SpecialTokens::Omit), (std::vector<int64_t>{261}));
}

namespace {

// The ids as text: the added tokens by name, every other id its byte.
std::string render(const std::vector<int64_t>& ids, int64_t image) {
  static const char* kNames[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "café"};
  std::string s;
  for (int64_t id : ids)
    s += id == image ? std::string("<IMG>") : id < kFirstByte ? kNames[id] : std::string(1, char(id - kFirstByte));
  return s;
}

// The learned part of the labels as text, "_" for each masked one.
std::string learned(const std::vector<int64_t>& labels, int64_t image) {
  std::string s;
  for (int64_t id : labels) s += id == -100 ? std::string("_") : render({id}, image);
  return s;
}

}  // namespace

// LLaVA-NeXT's qwen_1_5: ChatML with its system message; the assistant's messages learned with their header, and
// every <|im_start|>, <|im_end|> and newline learned wherever it stands (preprocess_qwen unmasks ids 198 and the
// two specials). The generation prompt ends with the assistant's header.
TEST(Template, QwenChatmlStringsAndMasks) {
  json j = byte_level_json();
  j["model"]["merges"] = json::array();  // one id per byte, so the ids read as the text
  const auto t = load_json(j, "chatml");
  const int64_t image = 267;
  const Tokenized s = apply_template(
      Template::Qwen, {{true, "What is it?\n<image>"}, {false, "A cat."}, {true, "Sure?"}, {false, "Yes"}}, *t, 2,
      "default", -100);
  EXPECT_EQ(render(s.ids, image),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\n<IMG><IMG>\nWhat is it?<|im_end|>\n<|im_start|>assistant\nA cat.<|im_end|>\n"
            "<|im_start|>user\nSure?<|im_end|>\n<|im_start|>assistant\nYes<|im_end|>\n");
  EXPECT_EQ(learned(s.labels, image),
            "<|im_start|>______\n____________________________<|im_end|>\n"
            "<|im_start|>____\n__\n___________<|im_end|>\n<|im_start|>assistant\nA cat.<|im_end|>\n"
            "<|im_start|>____\n_____<|im_end|>\n<|im_start|>assistant\nYes<|im_end|>\n");
  EXPECT_EQ(render(s.prompt, image),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\n<IMG><IMG>\nWhat is it?<|im_end|>\n<|im_start|>assistant\nA cat.<|im_end|>\n"
            "<|im_start|>user\nSure?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(s.answer, "Yes");
  EXPECT_EQ(s.images, 1);
  // LLaVA-NeXT leaves a message that starts with <image> as written; the system prompt is the run's.
  const Tokenized front =
      apply_template(Template::Qwen, {{true, "<image>Hi"}, {false, "Yo"}}, *t, 1, "Be brief.", -100);
  EXPECT_EQ(render(front.ids, image),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n<IMG>Hi<|im_end|>\n"
            "<|im_start|>assistant\nYo<|im_end|>\n");
  // A tokenizer without the ChatML tokens is refused by name.
  EXPECT_THROW(
      apply_template(Template::Qwen, {{true, "q"}, {false, "a"}}, *load_json(tiny(), "no_chatml"), 1, "default", -100),
      Error);
}

// LLaVA-NeXT's mistral_instruct: LLAMA_2 separators without <s> between rounds and no system prompt; the
// tokenizer's <s> comes first. Masked by preprocess_llama_2: the answers and their </s> learned.
TEST(Template, MistralInstructStringsAndMasks) {
  const auto t = load_json(tiny(), "mistral");
  const Tokenized s = apply_template(Template::MistralInstruct, {{true, "ab"}, {false, "c"}, {true, "a"}, {false, "b"}},
                                     *t, 1, "default", -100);
  // "[INST] ab [/INST] c </s>[INST] a [/INST] b </s>" through the tiny Llama tokenizer (its legacy normalizer
  // puts a "▁" before the text after </s>), checked by the decode, which skips </s>.
  EXPECT_EQ(t->decode(s.ids), "[INST] ab [/INST] c  [INST] a [/INST] b ");
  EXPECT_EQ(s.ids.front(), t->bos());
  std::vector<int64_t> answers;
  for (int64_t l : s.labels)
    if (l != -100) answers.push_back(l);
  EXPECT_EQ(t->decode(answers), "c  b ");
  EXPECT_EQ(std::count(answers.begin(), answers.end(), t->eos()), 2);
  EXPECT_EQ(parse_template("mistral_instruct"), Template::MistralInstruct);
  EXPECT_EQ(parse_template("qwen_1_5"), Template::Qwen);
  try {
    parse_template("chatml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("qwen_1_5, mistral_instruct"), std::string::npos) << e.what();
  }
  // Both are defined by real tokens only.
  const auto bytes = load_tokenizer("byte", 300, 299);
  EXPECT_THROW(apply_template(Template::Qwen, {{true, "q"}, {false, "a"}}, *bytes, 4, "default", -100), Error);
  EXPECT_THROW(apply_template(Template::MistralInstruct, {{true, "q"}, {false, "a"}}, *bytes, 4, "default", -100),
               Error);
}
