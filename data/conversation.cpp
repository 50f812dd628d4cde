// Prompt templates and label masking, following LLaVA's preprocess_plain and preprocess_v1.
#include "data/conversation.h"

#include "core/check.h"

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
  throw Error(str("[config] data.template '", s, "' is not one of: plain, vicuna_v1"));
}

Tokenized apply_template(Template t, const std::vector<Turn>& turns, const ByteTokenizer& tok, int64_t tpi,
                         const std::string& system, int64_t ignore) {
  HR_CHECK(turns.size() >= 2 && turns.size() % 2 == 0, "conversation needs human/gpt pairs; got ", turns.size(),
           " turns");
  int images = 0;
  for (std::size_t i = 0; i < turns.size(); ++i) {
    HR_CHECK(turns[i].from_human == (i % 2 == 0), "turn ", i, " should be from ", i % 2 == 0 ? "human" : "gpt");
    const int n = count_images(turns[i].value);
    HR_CHECK(n == 0 || (i == 0 && n == 1), "only the first human turn may hold one <image>; turn ", i, " has ", n);
    images += n;
  }
  Tokenized out;
  out.images = images;
  auto emit = [&](const std::vector<int64_t>& ids, bool learn) {
    for (int64_t id : ids) {
      out.ids.push_back(id);
      out.labels.push_back(learn ? id : ignore);
    }
  };
  const std::vector<int64_t> image(std::size_t(images ? tpi : 0), tok.image_token());
  if (t == Template::Plain) {
    // The caption is the first gpt turn; the human turn contributes only its image.
    out.ids.push_back(ByteTokenizer::kBos);
    out.labels.push_back(ignore);
    emit(image, false);
    out.prompt = out.ids;
    out.answer = turns[1].value;
    emit(tok.encode(turns[1].value + "\n"), true);
    return out;
  }
  out.ids.push_back(ByteTokenizer::kBos);
  out.labels.push_back(ignore);
  emit(tok.encode(system.empty() ? std::string() : system + " "), false);
  for (std::size_t i = 0; i < turns.size(); i += 2) {
    std::string question = turns[i].value;
    const bool has_image = count_images(question) > 0;
    if (has_image) question = strip_image(question);
    emit(tok.encode("USER: "), false);
    if (has_image) {
      emit(image, false);
      emit(tok.encode("\n"), false);
    }
    emit(tok.encode(question + " ASSISTANT: "), false);
    if (i + 2 == turns.size()) {
      out.prompt = out.ids;
      out.answer = turns[i + 1].value;
    }
    emit(tok.encode(turns[i + 1].value), true);
    emit({ByteTokenizer::kEos}, true);
  }
  return out;
}

}  // namespace hr::data
