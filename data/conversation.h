// LLaVA conversation samples and prompt templates with LLaVA's label masking.
#pragma once

#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace hr::data {

// plain: pretraining captions ("<image>" + caption + "\n", loss on the caption);
// vicuna_v1: "SYSTEM USER: <image>\nQ ASSISTANT: A</s>USER: ..." with loss on the answers (and their </s>).
enum class Template : uint8_t { Plain, VicunaV1 };
Template parse_template(const std::string& s);

constexpr const char* kVicunaSystem =
    "A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, "
    "detailed, and polite answers to the user's questions.";

struct Turn {
  bool from_human;
  std::string value;
};

// One tokenized sample: ids with one kImagePlaceholder per image (expanded later), labels aligned to ids.
struct Tokenized {
  std::vector<int64_t> ids, labels;
  int64_t images = 0;
  std::vector<int64_t> prompt;  // ids before the last answer (for generation in eval)
  std::string answer;           // the last answer's text (the eval target)
};

// Tokenizes turns (the first human turn may contain "<image>"); `tokens_per_image` placeholders per image.
// Throws a message naming what is malformed (empty conversation, roles out of order, several <image>).
Tokenized apply_template(Template t, const std::vector<Turn>& turns, const ByteTokenizer& tok, int64_t tokens_per_image,
                         const std::string& system_prompt, int64_t ignore_index);

}  // namespace hr::data
