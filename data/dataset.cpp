// LLaVA JSON dataset: parsing, per-sample processing, truncation that never splits image features.
#include "data/dataset.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "core/io/text_file.h"
#include "core/memory/category.h"
#include "core/ops/copy.h"

namespace hr::data {

using json = nlohmann::json;
using namespace hr::core;

namespace {
std::string read_text(const std::string& path) {
  return core::read_text_file(path, "data");
}
}  // namespace

LlavaDataset::LlavaDataset(const DataOptions& opt, const InputSpec& inputs)
    : LlavaDataset(opt, inputs, read_text(opt.json_path)) {}

LlavaDataset::LlavaDataset(const DataOptions& opt, const InputSpec& inputs, const std::string& text)
    : opt_(opt),
      inputs_(inputs),
      tok_(opt.tokenizer ? opt.tokenizer : std::make_shared<ByteTokenizer>(inputs.vocab, inputs.image_token_id)) {
  HR_CHECK(tok_->image_token() == inputs.image_token_id, "[data] the tokenizer's image token ", tok_->image_token(),
           " is not the model's image_token_index ", inputs.image_token_id);
  std::size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {
    try {
      json all = json::parse(text);
      for (auto& e : all) entries_.push_back(std::move(e));
      malformed_line_.assign(entries_.size(), 0);
    } catch (const json::exception& e) {
      throw Error(str("[data] ", opt.json_path, " is not valid JSON: ", e.what()));
    }
  } else {  // JSON lines: a malformed line becomes a bad sample, not a failure of the whole file
    std::size_t line_start = 0, line_no = 0;
    while (line_start < text.size()) {
      std::size_t end = text.find('\n', line_start);
      if (end == std::string::npos) end = text.size();
      const std::string line = text.substr(line_start, end - line_start);
      ++line_no;
      if (line.find_first_not_of(" \t\r") != std::string::npos) {
        json j = json::parse(line, nullptr, false);
        const bool malformed = j.is_discarded();
        entries_.push_back(malformed ? json() : std::move(j));
        malformed_line_.push_back(malformed ? int64_t(line_no) : 0);
      }
      line_start = end + 1;
    }
  }
  const int64_t tpi = inputs.tokens_per_image;
  for (const json& e : entries_) {
    int64_t len = 0;
    bool img = e.is_object() && e.contains("image");
    if (e.is_object() && e.contains("conversations") && e["conversations"].is_array())
      for (const json& t : e["conversations"])
        if (t.is_object() && t.contains("value") && t["value"].is_string())
          len += int64_t(t["value"].get_ref<const std::string&>().size());
    lengths_.push_back(len + (img ? tpi : 0));
    has_image_.push_back(img);
  }
}

std::string LlavaDataset::name(int64_t i) const {
  const json& e = entries_[i];
  std::string id =
      e.is_object() && e.contains("id") ? (e["id"].is_string() ? e["id"].get<std::string>() : e["id"].dump()) : "?";
  return str(opt_.json_path, "[", i, "] (id ", id, ")");
}

Example LlavaDataset::get(int64_t index) const {
  const json& e = entries_[index];
  auto bad = [&](const std::string& why) { return BadSample(str("[data] ", name(index), ": ", why)); };
  if (malformed_line_[index] > 0) throw bad(str("line ", malformed_line_[index], " is not valid JSON"));
  if (!e.is_object() || !e.contains("conversations") || !e["conversations"].is_array())
    throw bad("entry has no 'conversations' array");
  std::vector<Turn> turns;
  for (const json& t : e["conversations"]) {
    if (!t.is_object() || !t.contains("from") || !t.contains("value") || !t["from"].is_string() ||
        !t["value"].is_string())
      throw bad("a turn needs string 'from' and 'value'");
    const std::string from = t["from"];
    if (from != "human" && from != "gpt") throw bad("turn 'from' is '" + from + "', not human or gpt");
    turns.push_back({from == "human", t["value"]});
  }
  Example ex;
  ex.id =
      e.contains("id") ? (e["id"].is_string() ? e["id"].get<std::string>() : e["id"].dump()) : std::to_string(index);
  if (e.contains("question_type") && e["question_type"].is_string()) ex.question_type = e["question_type"];
  const bool has_image = e.contains("image");
  if (has_image && !turns.empty() && turns[0].value.find("<image>") == std::string::npos)
    turns[0].value = "<image>\n" + turns[0].value;  // LLaVA adds the tag when an entry has an image but no tag
  Tokenized tk;
  try {
    tk = apply_template(opt_.chat_template, turns, *tok_, inputs_.tokens_per_image, opt_.system_prompt,
                        inputs_.ignore_index, opt_.max_seq_len);
  } catch (const Error& err) {
    throw bad(err.what());
  }
  if (tk.images > 0 && !has_image) throw bad("<image> in the text but no 'image' field");
  if (has_image) {
    if (!e["image"].is_string()) throw bad("'image' must be a file name");
    const std::filesystem::path rel = std::filesystem::path(e["image"].get<std::string>()).lexically_normal();
    if (!opt_.allow_outside_image_folder &&
        (rel.is_absolute() || rel.has_root_name() || rel.empty() || *rel.begin() == ".."))
      throw bad("image '" + e["image"].get<std::string>() +
                "' is outside data.image_folder (set data.allow_outside_image_folder: true to allow it)");
    const std::string path = (std::filesystem::path(opt_.image_folder) / rel).string();
    std::error_code missing;  // a name the file system refuses (too long) is a bad sample, not an exception
    if (!std::filesystem::exists(path, missing))
      throw bad("image " + path + (missing ? " cannot be looked up: " + missing.message() : " does not exist"));
    try {
      ex.images.push_back(load_clip_image(path, inputs_.image_size, opt_.aspect, opt_.image_norm));
    } catch (const Error& err) {
      throw bad(err.what());
    }
    if (opt_.blank_images) fill_(ex.images.back(), 0.f);
  }
  // Truncate to max_seq_len, never inside an image's placeholders: a cut there moves before them, and an image
  // whose placeholders are cut off (or that the cut comes before) is dropped with them, as LLaVA truncates and
  // trains on. The model needs as many images as placeholder runs.
  if (int64_t(tk.ids.size()) > opt_.max_seq_len) {
    int64_t cut = opt_.max_seq_len;
    const int64_t img = inputs_.image_token_id;
    if (tk.ids[std::size_t(cut)] == img)
      while (cut > 0 && tk.ids[std::size_t(cut - 1)] == img) --cut;
    tk.ids.resize(std::size_t(cut));
    tk.labels.resize(std::size_t(cut));
    const auto kept = std::size_t(std::count(tk.ids.begin(), tk.ids.end(), img) / inputs_.tokens_per_image);
    if (kept < ex.images.size()) {
      ex.images_dropped = int64_t(ex.images.size() - kept);
      ex.images.resize(kept);
      // The generation prompt goes without the dropped images' placeholders too (the sample is text-only now).
      int64_t drop = ex.images_dropped * inputs_.tokens_per_image;
      for (auto it = tk.prompt.end(); it != tk.prompt.begin() && drop > 0;)
        if (*--it == img) it = tk.prompt.erase(it), --drop;
    }
    ex.truncated = true;
  }
  ex.ids = std::move(tk.ids);
  ex.labels = std::move(tk.labels);
  ex.prompt = std::move(tk.prompt);
  ex.answer = std::move(tk.answer);
  ex.masked = tk.mismatch;
  return ex;
}

}  // namespace hr::data
