// The files a run reads and writes beside its data and weights: its tokenizer, its image normalisation, and the
// Hugging Face files its checkpoints carry.
#include "train/run_files.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "data/image.h"
#include "data/tokenizer.h"

namespace hr::train {

namespace fs = std::filesystem;

std::shared_ptr<const data::Tokenizer> load_run_tokenizer(const RunConfig& c) {
  const models::LlavaConfig& m = c.model.config;
  std::string path = c.tokenizer;
  const std::string& model_dir = c.model.name_or_path.empty() ? c.model.language_model : c.model.name_or_path;
  if (path == "auto") path = model_dir.empty() ? "byte" : data::find_tokenizer_file(model_dir);
  try {
    return data::load_tokenizer(path.empty() ? "byte" : path, m.llm.vocab, m.image_token_id);
  } catch (const Error& e) {
    throw Error(str(e.what(), " (data.tokenizer: ", c.tokenizer, ")"));
  }
}

data::ImageNorm run_image_norm(const RunConfig& c) {
  const std::string& dir = c.model.name_or_path.empty() ? c.model.vision_tower : c.model.name_or_path;
  const std::string file = dir + "/preprocessor_config.json";
  if (dir.empty() || !std::filesystem::is_regular_file(file))  // the tower's own processor's
    return c.model.config.vision.tower == models::Tower::Siglip ? data::ImageNorm::siglip() : data::ImageNorm{};
  return data::read_preprocessor_config(file, c.model.config.vision.image_size);
}

data::ImageProcessor run_image_processor(const RunConfig& c) {
  return c.model.config.vision.tower == models::Tower::Siglip ? data::ImageProcessor::Siglip
                                                              : data::ImageProcessor::Clip;
}

std::string run_preprocessor_json(const RunConfig& c) {
  return data::preprocessor_config_json(c.model.config.vision.image_size, run_image_norm(c), run_image_processor(c),
                                        c.model.config.anyres.pinpoints);
}

namespace {
// tokenizer_config.json, tokenizer.json and added_tokens.json of `dir` with "<image>" at `image` and "<pad>"
// after it (where the vocabulary has room), the files that have them.
std::vector<std::pair<std::string, std::string>> stage1_tokenizer_files(const std::string& dir, int64_t image,
                                                                        int64_t vocab) {
  using json = nlohmann::json;
  std::vector<std::pair<std::string, int64_t>> add = {{"<image>", image}};
  if (image + 1 < vocab) add.emplace_back("<pad>", image + 1);
  auto token = [](const std::string& content) {
    return json{{"content", content}, {"lstrip", false},      {"normalized", false},
                {"rstrip", false},    {"single_word", false}, {"special", true}};
  };
  auto read = [&](const char* name) {
    const fs::path p = fs::path(dir) / name;
    if (!fs::is_regular_file(p)) return json();
    std::ifstream in(p, std::ios::binary);
    json j = json::parse(in, nullptr, false);
    HR_CHECK(!j.is_discarded() && j.is_object(), "[tokenizer] ", p.string(), " is not a JSON object");
    return j;
  };
  std::vector<std::pair<std::string, std::string>> out;
  if (json j = read("tokenizer_config.json"); !j.is_null()) {
    for (const auto& [content, id] : add) j["added_tokens_decoder"][std::to_string(id)] = token(content);
    out.emplace_back("tokenizer_config.json", j.dump(2) + "\n");
  }
  if (json j = read("tokenizer.json"); !j.is_null()) {
    for (const auto& [content, id] : add) {
      json t = token(content);
      t["id"] = id;
      j["added_tokens"].push_back(t);
    }
    out.emplace_back("tokenizer.json", j.dump() + "\n");
  }
  if (json j = read("added_tokens.json"); !j.is_null()) {
    for (const auto& [content, id] : add) j[content] = id;
    out.emplace_back("added_tokens.json", j.dump(2) + "\n");
  }
  return out;
}
}  // namespace

namespace {

// The tokenizer's directory: data.tokenizer's (its own, or the file's), else model.name_or_path's under auto; ""
// for the byte tokenizer.
std::string tokenizer_dir(const RunConfig& c, const data::Tokenizer& tok) {
  if (c.tokenizer == "auto" && !tok.is_bytes())
    return c.model.name_or_path.empty() ? c.model.language_model : c.model.name_or_path;
  if (c.tokenizer != "auto" && c.tokenizer != "byte")
    return fs::is_directory(c.tokenizer) ? c.tokenizer : fs::path(c.tokenizer).parent_path().string();
  return "";
}

// The image processor's file, as a LLaVA processor's (llava-hf's says processor_class LlavaProcessor, which is
// what makes AutoProcessor join it with the tokenizer; a CLIP directory's says CLIPProcessor or nothing); none
// where the model's directories have none.
std::optional<std::string> llava_preprocessor_config(const RunConfig& c) {
  const std::string& image_dir = c.model.name_or_path.empty() ? c.model.vision_tower : c.model.name_or_path;
  const fs::path pre = fs::path(image_dir) / "preprocessor_config.json";
  if (image_dir.empty() || !fs::is_regular_file(pre)) return std::nullopt;
  std::ifstream in(pre, std::ios::binary);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  HR_CHECK(!j.is_discarded() && j.is_object(), "[image] ", pre.string(), " is not a JSON object");
  const models::AnyresConfig& a = c.model.config.anyres;
  j["processor_class"] = a.max_num_patches > 0 ? "LlavaOnevisionProcessor"
                         : a.on()              ? "LlavaNextProcessor"
                                               : "LlavaProcessor";
  return j.dump(2) + "\n";
}

// processor_config.json: what the model's processor needs to expand "<image>" into the image's placeholders, which
// transformers reads into LlavaProcessor / LlavaNextProcessor (patch_size, the feature selection, the class token's
// extra position) or LlavaOnevisionProcessor (the tokens of one crop); the model directory's own file is kept with
// these keys set from the model.
std::string processor_config_json(const RunConfig& c) {
  const models::LlavaConfig& m = c.model.config;
  const fs::path own = fs::path(c.model.name_or_path) / "processor_config.json";
  nlohmann::json j = nlohmann::json::object();
  if (!c.model.name_or_path.empty() && fs::is_regular_file(own)) {
    std::ifstream in(own, std::ios::binary);
    j = nlohmann::json::parse(in, nullptr, false);
    HR_CHECK(!j.is_discarded() && j.is_object(), "[hf] ", own.string(), " is not a JSON object");
  }
  const bool patch = m.vision.select_feature == models::FeatureSelect::Patch;
  j["vision_feature_select_strategy"] = patch ? "default" : "full";
  if (m.anyres.max_num_patches > 0) {
    j["processor_class"] = "LlavaOnevisionProcessor";
    j["num_image_tokens"] = m.vision.grid() * m.vision.grid();
  } else {
    j["processor_class"] = m.anyres.on() ? "LlavaNextProcessor" : "LlavaProcessor";
    j["patch_size"] = m.vision.patch;
    j["num_additional_image_tokens"] = m.vision.class_token() ? 1 : 0;
  }
  return j.dump(2) + "\n";
}

}  // namespace

HfSidecar run_hf_sidecar(const RunConfig& c) {
  HfSidecar s;
  const auto tok = load_run_tokenizer(c);
  if (!tok->is_bytes()) s.tokens = {tok->bos(), tok->eos(), tok->pad()};
  const std::string dir = tokenizer_dir(c, *tok);
  if (!dir.empty())
    for (const char* name : kHfTokenizerFiles)
      if (fs::is_regular_file(fs::path(dir) / name)) s.files.push_back((fs::path(dir) / name).string());
  // From a LLaMA directory (the stage-1 start), the tokenizer learns "<image>" and "<pad>" at the ids the model
  // gave them, as llava-hf's conversion adds them, so that AutoProcessor of a checkpoint finds the image token.
  if (!c.model.language_model.empty() && c.tokenizer == "auto" && !tok->is_bytes())
    s.written = stage1_tokenizer_files(dir, c.model.config.image_token_id, c.model.config.llm.vocab);
  if (std::optional<std::string> pre = llava_preprocessor_config(c))
    s.written.emplace_back("preprocessor_config.json", std::move(*pre));
  s.written.emplace_back("processor_config.json", processor_config_json(c));
  s.preprocessor_json = run_preprocessor_json(c);
  s.max_shard_bytes = c.max_shard_bytes;
  return s;
}

}  // namespace hr::train
