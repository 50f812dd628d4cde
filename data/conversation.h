// LLaVA conversation samples and prompt templates with LLaVA's label masking.
#pragma once

#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace hr::data {

// LLaVA's conversation templates (llava/conversation.py) and label masking (llava/train/train.py):
// plain: pretraining captions ("<image>" + caption + "\n", loss on the caption);
// vicuna_v1 (v1): "SYSTEM USER: <image>\nQ ASSISTANT: A</s>USER: ..." with loss on the answers and their </s>;
// llava_llama_2: "[INST] <<SYS>>\nSYSTEM\n<</SYS>>\n\n<image>\nQ [/INST] A </s><s>[INST] ..." likewise.
// LLaVA-NeXT's (LLaVA-VL/LLaVA-NeXT llava/conversation.py and llava/train/train.py):
// qwen_1_5 (ChatML, Qwen2's byte-level tokenizers): "<|im_start|>system\nSYSTEM<|im_end|>\n<|im_start|>user\n
// <image>\nQ<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n..." as preprocess_qwen builds it: each message
// tokenized on its own, the assistant's learned (its "<|im_start|>assistant\n" too), and then every
// <|im_start|>, <|im_end|> and "\n" token learned wherever it stands;
// mistral_instruct: "[INST] Q [/INST] A </s>[INST] ..." (llava_llama_2's style without <s> separators or a
// system prompt), masked by preprocess_llama_2.
enum class Template : uint8_t { Plain, VicunaV1, Llama2, Qwen, MistralInstruct };
Template parse_template(const std::string& s);

constexpr const char* kVicunaSystem =
    "A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, "
    "detailed, and polite answers to the user's questions.";
constexpr const char* kLlama2System =
    "You are a helpful language and vision assistant. You are able to understand the visual content that the user "
    "provides, and assist the user with a variety of tasks using natural language.";
constexpr const char* kQwenSystem = "You are a helpful assistant.";
// The template's own system prompt (what `data.system_prompt: default` means).
const char* default_system(Template t);

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
  bool mismatch = false;        // LLaVA's round lengths disagreed with the ids: every label is masked
};

// Tokenizes turns (the first human turn may contain "<image>"); `tokens_per_image` placeholders per image.
// system_prompt "default" is the template's own. With a real tokenizer, ids and labels are exactly those of
// LLaVA's preprocess_plain / preprocess_v1 / preprocess_llama_2 (prompt text built by its Conversation,
// tokenizer_image_token, the per-round lengths with their legacy-tokenizer offset, and the whole sample masked
// when those lengths disagree with the ids, as LLaVA does after its "tokenization mismatch" warning). With the
// byte tokenizer every token boundary is exact, so each part is emitted with its own mask (the masks agree with
// LLaVA's where it has no off-by-one). Throws a message naming what is malformed (empty conversation, roles out
// of order, several <image>).
Tokenized apply_template(Template t, const std::vector<Turn>& turns, const Tokenizer& tok, int64_t tokens_per_image,
                         const std::string& system_prompt, int64_t ignore_index,
                         int64_t model_max_length = int64_t(1) << 62);

}  // namespace hr::data
