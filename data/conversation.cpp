// Prompt templates and label masking, following LLaVA's preprocess_plain, _v1 and _llama_2, and LLaVA-NeXT's
// preprocess_qwen and preprocess_llama_2 (with its mistral_instruct conversation).
#include "data/conversation.h"

#include "core/check.h"
#include "data/tokenizer_parts.h"

namespace hr::data {

namespace {
constexpr const char* kImageTag = "<image>";

int count_images(const std::string& s) {
  int n = 0;
  for (std::size_t at = s.find(kImageTag); at != std::string::npos; at = s.find(kImageTag, at + 1)) ++n;
  return n;
}

// LLaVA moves the image to the front of its message: "<image>\n" + the rest.
std::string strip_image(const std::string& s) {
  std::string out = s;
  for (std::size_t at = out.find(kImageTag); at != std::string::npos; at = out.find(kImageTag)) out.erase(at, 7);
  while (!out.empty() && (out.front() == '\n' || out.front() == ' ')) out.erase(out.begin());
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}
}  // namespace

Template parse_template(const std::string& s) {
  if (s == "plain") return Template::Plain;
  if (s == "vicuna_v1" || s == "v1") return Template::VicunaV1;
  if (s == "llava_llama_2") return Template::Llama2;
  if (s == "qwen_1_5") return Template::Qwen;
  if (s == "mistral_instruct") return Template::MistralInstruct;
  throw Error(str("[config] data.template '", s,
                  "' is not one of: plain, vicuna_v1 (v1), llava_llama_2, qwen_1_5, mistral_instruct"));
}

const char* default_system(Template t) {
  switch (t) {
    case Template::VicunaV1:
      return kVicunaSystem;
    case Template::Llama2:
      return kLlama2System;
    case Template::Qwen:
      return kQwenSystem;
    case Template::Plain:
    case Template::MistralInstruct:
      break;
  }
  return "";
}

namespace {

constexpr int64_t kImage = -200;  // LLaVA's IMAGE_TOKEN_INDEX: one id per image until the model expands it

// Python's str.isspace (what str.strip() strips): ASCII whitespace, the separators U+001C-U+001F, U+0085, NBSP,
// U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F and U+3000.
bool python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// The code point of the UTF-8 sequence of `n` bytes at `p` (-1 where it is not a well-formed one).
char32_t code_point(const unsigned char* p, std::size_t n) {
  if (n == 1) return p[0] < 0x80 ? p[0] : char32_t(-1);
  char32_t c = p[0] & (0xFF >> (n + 1));
  for (std::size_t i = 1; i < n; ++i) {
    if ((p[i] & 0xC0) != 0x80) return char32_t(-1);
    c = (c << 6) | (p[i] & 0x3F);
  }
  return c;
}

std::size_t utf8_length(unsigned char lead) {
  return lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
}

// LLaVA's .strip(): Python's, on the text's code points.
std::string py_strip(const std::string& s) {
  const auto* u = reinterpret_cast<const unsigned char*>(s.data());
  std::size_t b = 0, e = s.size();
  while (b < e) {
    const std::size_t n = utf8_length(u[b]);
    if (b + n > e || !python_space(code_point(u + b, n))) break;
    b += n;
  }
  while (e > b) {
    std::size_t start = e - 1;  // back over continuation bytes to the sequence's first byte
    while (start > b && e - start < 4 && (u[start] & 0xC0) == 0x80) --start;
    const std::size_t n = e - start;
    if (utf8_length(u[start]) != n || !python_space(code_point(u + start, n))) break;
    e = start;
  }
  return s.substr(b, e - b);
}

std::vector<std::string> py_split(const std::string& s, const std::string& sep) {
  std::vector<std::string> out;
  std::size_t at = 0;
  for (std::size_t hit = s.find(sep); hit != std::string::npos; hit = s.find(sep, at)) {
    out.push_back(s.substr(at, hit - at));
    at = hit + sep.size();
  }
  out.push_back(s.substr(at));
  return out;
}

// llava.mm_utils.tokenizer_image_token: each chunk between "<image>" tags tokenized with <s>, which only the
// first chunk keeps; an image is one kImage id.
std::vector<int64_t> tokenizer_image_token(const std::string& prompt, const Tokenizer& tok) {
  const std::vector<std::string> chunks = py_split(prompt, kImageTag);
  std::vector<int64_t> ids;
  std::size_t offset = 0;
  std::vector<std::vector<int64_t>> enc;
  for (const std::string& c : chunks) enc.push_back(tok.encode(c, SpecialTokens::Add));
  if (!enc.empty() && !enc[0].empty() && enc[0][0] == tok.bos()) {
    offset = 1;
    ids.push_back(enc[0][0]);
  }
  for (std::size_t i = 0; i < enc.size(); ++i) {
    if (i > 0) ids.push_back(kImage);  // insert_separator's [image] * (offset + 1), of which x[offset:] stays
    if (enc[i].size() > offset) ids.insert(ids.end(), enc[i].begin() + std::ptrdiff_t(offset), enc[i].end());
  }
  return ids;
}

// preprocess_multimodal: the tag moves to the front of its message. LLaVA-NeXT's leaves a message that already
// starts with it as it is.
std::vector<Turn> tags_in_front(const std::vector<Turn>& turns_in, Template t) {
  const bool next = t == Template::Qwen || t == Template::MistralInstruct;
  std::vector<Turn> turns = turns_in;
  for (Turn& turn : turns)
    if (count_images(turn.value) > 0 && !(next && turn.value.rfind(kImageTag, 0) == 0))
      turn.value = py_strip("<image>\n" + py_strip(tok::replace_all(turn.value, kImageTag, "")));
  return turns;
}

// A conversation as LLaVA's Conversation.get_prompt() writes it, the generation prompt (the last answer left open,
// as LLaVA's eval builds it) and the separator before each answer.
struct Prompted {
  std::string conv, prompt, sep;
};

Prompted vicuna_v1(const std::vector<Turn>& turns, const std::string& system) {  // SeparatorStyle.TWO, " ", "</s>"
  Prompted p;
  p.conv = system + " ";
  for (std::size_t i = 0; i < turns.size(); ++i) {
    const std::string role = i % 2 == 0 ? "USER" : "ASSISTANT";
    if (i + 1 == turns.size()) p.prompt = p.conv + role + ":";
    p.conv += turns[i].value.empty() ? role + ":" : role + ": " + turns[i].value + (i % 2 == 0 ? " " : "</s>");
  }
  p.sep = " ASSISTANT: ";
  return p;
}

// SeparatorStyle.LLAMA_2 with sep2 "</s>" and `sep` "<s>" (llava_llama_2) or "" (mistral_instruct).
Prompted llama_2(const std::vector<Turn>& turns, const std::string& system, const std::string& sep) {
  Prompted p;
  for (std::size_t i = 0; i < turns.size(); ++i) {
    if (i + 1 == turns.size()) p.prompt = p.conv;
    std::string m = turns[i].value;
    if (m.empty()) continue;
    if (i == 0 && !system.empty()) m = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + m;
    p.conv += i % 2 == 0 ? sep + "[INST] " + m + " [/INST]" : " " + m + " </s>";
  }
  for (std::string* s : {&p.conv, &p.prompt}) {  // ret.lstrip(sep): every leading character of sep
    const std::size_t b = sep.empty() ? 0 : s->find_first_not_of(sep);
    *s = b == std::string::npos ? "" : s->substr(b);
  }
  p.sep = "[/INST] ";
  return p;
}

// The ids of a token's text, which must be one token (-1 where it is not).
int64_t single_id(const Tokenizer& tok, const std::string& text) {
  const std::vector<int64_t> ids = tok.encode(text, SpecialTokens::Omit);
  return ids.size() == 1 ? ids[0] : -1;
}

// LLaVA-NeXT's preprocess_qwen: the system message and each turn as its own ChatML message, tokenized alone (with
// the image as one kImage id, LLaVA-NeXT's added "<image>" token); the system and user messages masked, the
// assistant's learned; then every <|im_start|>, <|im_end|> and newline token learned wherever it stands
// (LLaVA-NeXT names the newline by Qwen2's id, 198: here it is the tokenizer's "\n" token). `prompt` gets the ids
// before the last answer and the assistant's header, as LLaVA-NeXT's eval prompts end.
void chatml(const std::vector<Turn>& turns, const Tokenizer& tok, const std::string& system, int64_t ignore,
            std::vector<int64_t>& ids, std::vector<int64_t>& labels, std::vector<int64_t>& prompt) {
  const int64_t im_start = single_id(tok, "<|im_start|>"), im_end = single_id(tok, "<|im_end|>");
  HR_CHECK(im_start >= 0 && im_end >= 0,
           "[data] the qwen_1_5 template needs a tokenizer with the tokens "
           "<|im_start|> and <|im_end|> (",
           tok.describe(), ")");
  const int64_t newline = single_id(tok, "\n");
  auto message = [&](const std::string& role, const std::string& content, bool learn) {
    std::vector<int64_t> enc;
    const std::vector<std::string> chunks =
        py_split("<|im_start|>" + role + "\n" + content + "<|im_end|>\n", kImageTag);
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      if (i > 0) enc.push_back(kImage);
      const std::vector<int64_t> c = tok.encode(chunks[i], SpecialTokens::Omit);
      enc.insert(enc.end(), c.begin(), c.end());
    }
    for (int64_t id : enc) {
      ids.push_back(id);
      const bool unmask = id == im_start || id == im_end || (newline >= 0 && id == newline);
      labels.push_back(learn || unmask ? id : ignore);
    }
  };
  message("system", system, false);
  for (std::size_t i = 0; i < turns.size(); ++i) {
    if (i + 1 == turns.size()) {
      prompt = ids;
      const std::vector<int64_t> header = tok.encode("<|im_start|>assistant\n", SpecialTokens::Omit);
      prompt.insert(prompt.end(), header.begin(), header.end());
    }
    message(i % 2 == 0 ? "user" : "assistant", turns[i].value, i % 2 == 1);
  }
  for (std::size_t k = 0; k < ids.size(); ++k)
    if (ids[k] == kImage) labels[k] = ignore;
}

// LLaVA's preprocess_v1 / preprocess_llama_2 masking: each round's instruction is ignored, its answer learned,
// counted in tokens of the round as tokenized alone. Where the count disagrees with the conversation's tokens (its
// "tokenization mismatch") every label is masked; returns whether that happened.
bool mask_instructions(Template t, const Prompted& p, const Tokenizer& tok, const std::vector<int64_t>& ids,
                       std::vector<int64_t>& labels, int64_t ignore, int64_t max_len) {
  int64_t total = 0;
  for (int64_t id : ids) total += id != tok.pad();
  const auto n = int64_t(labels.size());
  auto mask = [&](int64_t from, int64_t to) {
    for (int64_t k = std::max<int64_t>(from, 0); k < std::min(to, n); ++k) labels[std::size_t(k)] = ignore;
  };
  int64_t cur = 1;
  mask(0, cur);
  const std::vector<std::string> rounds = py_split(p.conv, "</s>");
  for (std::size_t i = 0; i < rounds.size(); ++i) {
    const std::string& rou = rounds[i];
    if (rou.empty()) break;
    std::vector<std::string> parts = py_split(rou, p.sep);
    if (parts.size() != 2) break;
    parts[0] += p.sep;
    auto round_len = int64_t(tokenizer_image_token(rou, tok).size());
    auto instruction_len = int64_t(tokenizer_image_token(parts[0], tok).size()) - 2;
    if (t == Template::VicunaV1 && i != 0 && !tok.legacy()) --round_len, --instruction_len;
    mask(cur, cur + instruction_len);
    cur += round_len;
  }
  mask(cur, n);
  if (cur < max_len && cur != total) {
    mask(0, n);
    return true;
  }
  return false;
}

// The image ids become tokens_per_image placeholders, never learned.
void expand_images(const std::vector<int64_t>& in, const std::vector<int64_t>* labels, const Tokenizer& tok,
                   int64_t tpi, int64_t ignore, std::vector<int64_t>& to_ids, std::vector<int64_t>* to_labels) {
  for (std::size_t k = 0; k < in.size(); ++k) {
    const bool image = in[k] == kImage;
    for (int64_t r = 0; r < (image ? tpi : 1); ++r) {
      to_ids.push_back(image ? tok.image_token() : in[k]);
      if (to_labels) to_labels->push_back(image ? ignore : (*labels)[k]);
    }
  }
}

// The sample as LLaVA builds it with a real tokenizer (see conversation.h).
Tokenized llava_exact(Template t, const std::vector<Turn>& turns_in, const Tokenizer& tok, int64_t tpi,
                      const std::string& system, int64_t ignore, int64_t max_len) {
  const std::vector<Turn> turns = tags_in_front(turns_in, t);
  Tokenized out;
  out.images = count_images(turns[0].value);
  std::vector<int64_t> ids, labels;
  std::string prompt;
  if (t == Template::Qwen) {
    std::vector<int64_t> prompt_ids;
    chatml(turns, tok, system, ignore, ids, labels, prompt_ids);
    expand_images(ids, &labels, tok, tpi, ignore, out.ids, &out.labels);
    expand_images(prompt_ids, nullptr, tok, tpi, ignore, out.prompt, nullptr);
    out.answer = turns.back().value;
    return out;
  }
  if (t == Template::Plain) {
    HR_CHECK(out.images == 1, "the plain template needs an <image> in the first turn (LLaVA's preprocess_plain)");
    ids = tokenizer_image_token(std::string(kImageTag) + turns[1].value + "\n", tok);
    labels = ids;
    const std::size_t masked = tokenizer_image_token(kImageTag, tok).size();
    std::fill(labels.begin(), labels.begin() + std::ptrdiff_t(std::min(masked, labels.size())), ignore);
    prompt = kImageTag;
  } else {
    const Prompted p = t == Template::VicunaV1 ? vicuna_v1(turns, system)
                       : t == Template::Llama2 ? llama_2(turns, system, "<s>")
                                               : llama_2(turns, system, "");
    ids = tokenizer_image_token(p.conv, tok);
    labels = ids;
    prompt = p.prompt;
    out.mismatch = mask_instructions(t, p, tok, ids, labels, ignore, max_len);
  }
  expand_images(ids, &labels, tok, tpi, ignore, out.ids, &out.labels);
  expand_images(tokenizer_image_token(prompt, tok), nullptr, tok, tpi, ignore, out.prompt, nullptr);
  out.answer = turns.back().value;
  return out;
}

// Human and gpt turns in pairs, one <image> at most, in the first human turn; returns the images.
int checked_images(const std::vector<Turn>& turns) {
  HR_CHECK(turns.size() >= 2 && turns.size() % 2 == 0, "conversation needs human/gpt pairs; got ", turns.size(),
           " turns");
  int images = 0;
  for (std::size_t i = 0; i < turns.size(); ++i) {
    HR_CHECK(turns[i].from_human == (i % 2 == 0), "turn ", i, " should be from ", i % 2 == 0 ? "human" : "gpt");
    const int n = count_images(turns[i].value);
    HR_CHECK(n == 0 || (i == 0 && n == 1), "only the first human turn may hold one <image>; turn ", i, " has ", n);
    images += n;
  }
  return images;
}

// The byte tokenizer's rendering of the templates (headroom's own, for models without a tokenizer file).
class ByteTemplate {
 public:
  ByteTemplate(const Tokenizer& tok, int images, int64_t tpi, int64_t ignore)
      : tok_(tok), ignore_(ignore), image_(std::size_t(images ? tpi : 0), tok.image_token()) {
    out_.images = images;
  }

  // The caption is the first gpt turn; the human turn contributes only its image.
  Tokenized plain(const std::vector<Turn>& turns) {
    start();
    emit(image_, Learn::No);
    out_.prompt = out_.ids;
    out_.answer = turns[1].value;
    emit(tok_.encode(turns[1].value + "\n"), Learn::Yes);
    return out_;
  }

  Tokenized vicuna(const std::vector<Turn>& turns, const std::string& system) {
    start();
    emit(tok_.encode(system.empty() ? std::string() : system + " "), Learn::No);
    for (std::size_t i = 0; i < turns.size(); i += 2) {
      std::string question = turns[i].value;
      const bool has_image = count_images(question) > 0;
      if (has_image) question = strip_image(question);
      emit(tok_.encode("USER: "), Learn::No);
      if (has_image) {
        emit(image_, Learn::No);
        emit(tok_.encode("\n"), Learn::No);
      }
      emit(tok_.encode(question + " ASSISTANT: "), Learn::No);
      if (i + 2 == turns.size()) {
        out_.prompt = out_.ids;
        out_.answer = turns[i + 1].value;
      }
      emit(tok_.encode(turns[i + 1].value), Learn::Yes);
      emit({tok_.eos()}, Learn::Yes);
    }
    return out_;
  }

 private:
  enum class Learn : uint8_t { No, Yes };
  void start() {
    out_.ids.push_back(tok_.bos());
    out_.labels.push_back(ignore_);
  }
  void emit(const std::vector<int64_t>& ids, Learn learn) {
    for (int64_t id : ids) {
      out_.ids.push_back(id);
      out_.labels.push_back(learn == Learn::Yes ? id : ignore_);
    }
  }

  const Tokenizer& tok_;
  const int64_t ignore_;
  const std::vector<int64_t> image_;
  Tokenized out_;
};

}  // namespace

Tokenized apply_template(Template t, const std::vector<Turn>& turns, const Tokenizer& tok, int64_t tpi,
                         const std::string& system_in, int64_t ignore, int64_t max_len) {
  const std::string system = system_in == "default" ? default_system(t) : system_in;
  const int images = checked_images(turns);
  if (!tok.is_bytes()) return llava_exact(t, turns, tok, tpi, system, ignore, max_len);
  HR_CHECK(t == Template::Plain || t == Template::VicunaV1, "the ",
           t == Template::Llama2 ? "llava_llama_2"
           : t == Template::Qwen ? "qwen_1_5"
                                 : "mistral_instruct",
           " template needs a real tokenizer (data.tokenizer)");
  ByteTemplate bytes(tok, images, tpi, ignore);
  return t == Template::Plain ? bytes.plain(turns) : bytes.vicuna(turns, system);
}

}  // namespace hr::data
