// LLaVA JSON dataset: parsing, per-sample processing, truncation that never splits image features.
#include "data/dataset.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <system_error>

#include "core/io/text_file.h"
#include "core/memory/category.h"
#include "core/ops/copy.h"
#include "data/anyres.h"

namespace hr::data {

using json = nlohmann::json;
using namespace hr::core;

namespace {

std::string read_text(const std::string& path) {
  return core::read_text_file(path, "data");
}

// Entries of a JSON array, or of JSON lines: there a malformed line becomes a bad sample (its line number kept in
// `malformed`), not a failure of the whole file.
void parse_entries(const std::string& text, const std::string& path, std::vector<json>& entries,
                   std::vector<int64_t>& malformed) {
  const std::size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {
    try {
      json all = json::parse(text);
      for (auto& e : all) entries.push_back(std::move(e));
      malformed.assign(entries.size(), 0);
    } catch (const json::exception& e) {
      throw Error(str("[data] ", path, " is not valid JSON: ", e.what()));
    }
    return;
  }
  std::size_t line_start = 0, line_no = 0;
  while (line_start < text.size()) {
    std::size_t end = text.find('\n', line_start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(line_start, end - line_start);
    ++line_no;
    if (line.find_first_not_of(" \t\r") != std::string::npos) {
      json j = json::parse(line, nullptr, false);
      const bool bad = j.is_discarded();
      entries.push_back(bad ? json() : std::move(j));
      malformed.push_back(bad ? int64_t(line_no) : 0);
    }
    line_start = end + 1;
  }
}

// An entry's length for grouping by modality: its turns' characters, plus an image's tokens.
int64_t entry_length(const json& e, int64_t tokens_per_image) {
  int64_t len = 0;
  if (e.is_object() && e.contains("conversations") && e["conversations"].is_array())
    for (const json& t : e["conversations"])
      if (t.is_object() && t.contains("value") && t["value"].is_string())
        len += int64_t(t["value"].get_ref<const std::string&>().size());
  return len + (e.is_object() && e.contains("image") ? tokens_per_image : 0);
}

std::string id_of(const json& e, const std::string& otherwise) {
  if (!e.is_object() || !e.contains("id")) return otherwise;
  return e["id"].is_string() ? e["id"].get<std::string>() : e["id"].dump();
}

// The entry's turns, each from human or gpt with a string value; `why` names what is wrong otherwise.
std::vector<Turn> turns_of(const json& e, std::string& why) {
  std::vector<Turn> turns;
  if (!e.is_object() || !e.contains("conversations") || !e["conversations"].is_array()) {
    why = "entry has no 'conversations' array";
    return {};
  }
  for (const json& t : e["conversations"]) {
    if (!t.is_object() || !t.contains("from") || !t.contains("value") || !t["from"].is_string() ||
        !t["value"].is_string()) {
      why = "a turn needs string 'from' and 'value'";
      return {};
    }
    const std::string from = t["from"];
    if (from != "human" && from != "gpt") {
      why = "turn 'from' is '" + from + "', not human or gpt";
      return {};
    }
    turns.push_back({from == "human", t["value"]});
  }
  return turns;
}

// Truncates to `max_seq_len`, never inside an image's placeholders: a cut there moves before them, and an image
// whose placeholders are cut off (or that the cut comes before) is dropped with them, as LLaVA truncates and
// trains on. The model needs as many images as placeholder runs.
void truncate(Tokenized& tk, Example& ex, int64_t max_seq_len, const InputSpec& inputs) {
  int64_t cut = max_seq_len;
  const int64_t img = inputs.image_token_id;
  if (tk.ids[std::size_t(cut)] == img)
    while (cut > 0 && tk.ids[std::size_t(cut - 1)] == img) --cut;
  tk.ids.resize(std::size_t(cut));
  tk.labels.resize(std::size_t(cut));
  int64_t left = std::count(tk.ids.begin(), tk.ids.end(), img);  // placeholders kept: whole images, in order
  std::size_t kept = 0;
  while (kept < ex.image_tokens.size() && left >= ex.image_tokens[kept]) left -= ex.image_tokens[kept++];
  if (kept < ex.images.size()) {
    ex.images_dropped = int64_t(ex.images.size() - kept);
    // The generation prompt goes without the dropped images' placeholders too (the sample is text-only now).
    int64_t drop = 0;
    for (std::size_t i = kept; i < ex.image_tokens.size(); ++i) drop += ex.image_tokens[i];
    ex.images.resize(kept);
    ex.image_tokens.resize(kept);
    if (!ex.image_sizes.empty()) ex.image_sizes.resize(kept);
    for (auto it = tk.prompt.end(); it != tk.prompt.begin() && drop > 0;)
      if (*--it == img) it = tk.prompt.erase(it), --drop;
  }
  ex.truncated = true;
}

// LLaVA adds the tag when an entry has an image but no tag.
void tag_image(std::vector<Turn>& turns) {
  if (!turns.empty() && turns[0].value.find("<image>") == std::string::npos)
    turns[0].value = "<image>\n" + turns[0].value;
}

}  // namespace

Resolution within_image_tokens(Resolution size, const InputSpec& inputs, int64_t max_tokens, const std::string& name) {
  auto tokens = [&](Resolution r) {
    try {
      return inputs.anyres_tokens(r);
    } catch (const Error&) {  // so thin that un-padding keeps no row or column of its tiles
      return INT64_MAX;
    }
  };
  if (max_tokens <= 0 || tokens(size) <= max_tokens) return size;
  const bool tall = size.height >= size.width;
  const int64_t longer = tall ? size.height : size.width, shorter = tall ? size.width : size.height;
  for (int64_t l = longer - 1; l >= 1; --l) {
    const int64_t s = std::max<int64_t>(1, (shorter * l + longer / 2) / longer);
    const Resolution r = tall ? Resolution{l, s} : Resolution{s, l};
    if (tokens(r) <= max_tokens) return r;
  }
  throw Error(str("[image] ", name, ": no size of this ", size.height, " x ", size.width,
                  " image makes at most data.max_image_tokens ", max_tokens, " tokens"));
}

ModelImage load_model_image(const std::string& path, const InputSpec& inputs, AspectMode aspect,
                            ImageProcessor processor, const ImageNorm& norm, int64_t max_tokens) {
  if (!inputs.anyres())
    return {load_clip_image(path, inputs.image_size, aspect, norm, processor), {}, inputs.tokens_per_image};
  RgbImage decoded = decode_image(path);
  const Resolution fits = within_image_tokens({decoded.height, decoded.width}, inputs, max_tokens, path);
  if (fits.height != decoded.height || fits.width != decoded.width)
    decoded = resize_bicubic(decoded, int(fits.width), int(fits.height));
  AnyresImage a = anyres_image(std::move(decoded), inputs.pinpoints, inputs.image_size, processor, norm, path);
  return {std::move(a.pixels), a.original, inputs.anyres_tokens(a.original)};
}

LlavaDataset::LlavaDataset(const DataOptions& opt, const InputSpec& inputs)
    : LlavaDataset(opt, inputs, read_text(opt.json_path)) {}

LlavaDataset::LlavaDataset(const DataOptions& opt, const InputSpec& inputs, const std::string& text)
    : opt_(opt),
      inputs_(inputs),
      tok_(opt.tokenizer ? opt.tokenizer : std::make_shared<ByteTokenizer>(inputs.vocab, inputs.image_token_id)) {
  HR_CHECK(tok_->image_token() == inputs.image_token_id, "[data] the tokenizer's image token ", tok_->image_token(),
           " is not the model's image_token_index ", inputs.image_token_id);
  parse_entries(text, opt.json_path, entries_, malformed_line_);
  for (const json& e : entries_) {
    lengths_.push_back(entry_length(e, inputs.tokens_per_image));
    has_image_.push_back(e.is_object() && e.contains("image"));
  }
  if (opt.image_lengths && inputs.anyres()) {  // one header read each, in parallel: a file system is slow to open
    std::vector<int64_t> extra(entries_.size(), 0);
#pragma omp parallel for schedule(dynamic, 64)
    for (int64_t i = 0; i < size(); ++i)
      if (has_image_[std::size_t(i)]) extra[std::size_t(i)] = image_tokens_from_header(i) - inputs.tokens_per_image;
    for (std::size_t i = 0; i < extra.size(); ++i) lengths_[i] += extra[i];
  }
}

// An AnyRes image's tokens as its file's header says; a file that cannot be read counts as tokens_per_image (it is
// refused, naming the entry, when the sample is loaded).
int64_t LlavaDataset::image_tokens_from_header(int64_t index) const {
  try {
    const std::string path = image_path(index, entries_[std::size_t(index)]["image"]);
    if (const auto size = image_resolution(path))
      return inputs_.anyres_tokens(within_image_tokens(*size, inputs_, opt_.max_image_tokens, path));
  } catch (const std::exception&) {  // nothing may leave the OpenMP loop this runs in
  }
  return inputs_.tokens_per_image;
}

std::string LlavaDataset::name(int64_t i) const {
  return str(opt_.json_path, "[", i, "] (id ", id_of(entries_[i], "?"), ")");
}

BadSample LlavaDataset::bad(int64_t index, const std::string& why) const {
  return BadSample(str("[data] ", name(index), ": ", why));
}

// The entry's image file, checked to lie inside data.image_folder (unless allowed) and to exist.
std::string LlavaDataset::image_path(int64_t index, const json& field) const {
  if (!field.is_string()) throw bad(index, "'image' must be a file name");
  const std::string file = field.get<std::string>();
  const std::filesystem::path rel = std::filesystem::path(file).lexically_normal();
  if (!opt_.allow_outside_image_folder &&
      (rel.is_absolute() || rel.has_root_name() || rel.empty() || *rel.begin() == ".."))
    throw bad(index, "image '" + file +
                         "' is outside data.image_folder (set data.allow_outside_image_folder: true to allow it)");
  const std::string path = (std::filesystem::path(opt_.image_folder) / rel).string();
  std::error_code missing;  // a name the file system refuses (too long) is a bad sample, not an exception
  if (!std::filesystem::exists(path, missing))
    throw bad(index, "image " + path + (missing ? " cannot be looked up: " + missing.message() : " does not exist"));
  return path;
}

// The entry's image loaded as the model's input (with AnyRes: its base image and tiles).
ModelImage LlavaDataset::image(int64_t index, const json& field) const {
  const std::string path = image_path(index, field);
  try {
    ModelImage out =
        load_model_image(path, inputs_, opt_.aspect, opt_.processor, opt_.image_norm, opt_.max_image_tokens);
    if (opt_.blank_images) fill_(out.pixels, 0.f);
    return out;
  } catch (const Error& err) {
    throw bad(index, err.what());
  }
}

Tokenized LlavaDataset::templated(int64_t index, const std::vector<Turn>& turns, int64_t tokens_per_image) const {
  try {
    return apply_template(opt_.chat_template, turns, *tok_, tokens_per_image, opt_.system_prompt, inputs_.ignore_index,
                          opt_.max_seq_len);
  } catch (const Error& err) {
    throw bad(index, err.what());
  }
}

void LlavaDataset::add_image(Example& ex, ModelImage img) const {
  ex.images.push_back(std::move(img.pixels));
  ex.image_tokens.push_back(img.tokens);
  if (inputs_.anyres()) ex.image_sizes.push_back(img.size);
}

Example LlavaDataset::get(int64_t index) const {
  const json& e = entries_[index];
  if (malformed_line_[index] > 0) throw bad(index, str("line ", malformed_line_[index], " is not valid JSON"));
  std::string why;
  std::vector<Turn> turns = turns_of(e, why);
  if (!why.empty()) throw bad(index, why);
  Example ex;
  ex.id = id_of(e, std::to_string(index));
  if (e.contains("question_type") && e["question_type"].is_string()) ex.question_type = e["question_type"];
  const bool has_image = e.contains("image");
  if (has_image) tag_image(turns);
  // An AnyRes image's size decides its token count, so it is loaded before the text is templated.
  std::optional<ModelImage> img;
  if (has_image && inputs_.anyres()) img = image(index, e["image"]);
  Tokenized tk = templated(index, turns, img ? img->tokens : inputs_.tokens_per_image);
  if (tk.images > 0 && !has_image) throw bad(index, "<image> in the text but no 'image' field");
  if (has_image) add_image(ex, img ? std::move(*img) : image(index, e["image"]));
  if (int64_t(tk.ids.size()) > opt_.max_seq_len) truncate(tk, ex, opt_.max_seq_len, inputs_);
  ex.ids = std::move(tk.ids);
  ex.labels = std::move(tk.labels);
  ex.prompt = std::move(tk.prompt);
  ex.answer = std::move(tk.answer);
  ex.masked = tk.mismatch;
  return ex;
}

}  // namespace hr::data
