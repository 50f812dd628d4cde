// A LLaVA-format dataset: a JSON array (or JSON lines) of {id, image?, conversations[{from, value}]} entries
// with images under an image folder. Samples are processed on demand (decode, template, truncation).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/batch.h"
#include "data/conversation.h"
#include "data/image.h"

namespace hr::data {

struct DataOptions {
  std::string json_path, image_folder;
  Template chat_template = Template::VicunaV1;
  std::string system_prompt = "default";  // the template's own
  // null: the byte-level tokenizer over the model's vocabulary (load_tokenizer for a real one).
  std::shared_ptr<const Tokenizer> tokenizer;
  AspectMode aspect = AspectMode::Pad;
  ImageProcessor processor = ImageProcessor::Clip;  // the tower's, for each AnyRes crop
  ImageNorm image_norm;                             // preprocessor_config.json's mean and std (CLIP's by default)
  int64_t max_seq_len = 2048;
  bool blank_images = false;  // replace every image by zeros (an ablation: can the text alone answer?)
  // An entry's image path must stay inside image_folder (no absolute path, no "..") unless this is set.
  bool allow_outside_image_folder = false;
  // AnyRes: an entry's length (for grouping by length) counts its image's own tokens, read from the file's header
  // when the data set opens, rather than tokens_per_image.
  bool image_lengths = false;
  // AnyRes: images whose layout makes more tokens are shrunk to the largest size that makes at most this many (0:
  // none).
  int64_t max_image_tokens = 0;
};

// One processed sample. `ids` hold each image's placeholders: tokens_per_image, or with AnyRes its token count.
struct Example {
  std::vector<int64_t> ids, labels;
  // (3, size, size) f32 on the host, tagged io; AnyRes: (crops, 3, size, size), the base image and its tiles
  std::vector<core::Tensor> images;
  std::vector<Resolution> image_sizes;  // AnyRes: each image's size before processing
  std::vector<int64_t> image_tokens;    // each image's placeholders
  std::string id, question_type;        // question_type: the entry's optional "question_type" (eval breakdown)
  std::vector<int64_t> prompt;          // for generation: ids before the last answer
  std::string answer;
  bool masked = false;         // LLaVA's round lengths disagreed with the ids: every label masked, as LLaVA does
  bool truncated = false;      // cut to data.max_seq_len
  int64_t images_dropped = 0;  // images the cut left without their placeholders, dropped with them
};

// An image as the model takes it: (3, size, size), or with AnyRes (crops, 3, size, size), its base image and tiles;
// its size before processing and its placeholders.
struct ModelImage {
  core::Tensor pixels;
  Resolution size;
  int64_t tokens = 0;
};
// `path` decoded and processed as `inputs` say: one square image (data.image_aspect_ratio's pad or resize), or with
// AnyRes cut for its pinpoint with `processor`'s steps for each crop, after shrinking to `max_tokens` (0: no bound).
ModelImage load_model_image(const std::string& path, const InputSpec& inputs, AspectMode aspect,
                            ImageProcessor processor, const ImageNorm& norm, int64_t max_tokens = 0);
// The largest size of an image of `size` (its aspect ratio kept: the longer side shortened pixel by pixel, the shorter
// rounded) whose AnyRes layout makes at most `max_tokens` tokens; `size` itself when it does. Throws naming `name`
// when no size does.
Resolution within_image_tokens(Resolution size, const InputSpec& inputs, int64_t max_tokens, const std::string& name);

// A sample that cannot be used: the message names the file, the entry and the reason.
class BadSample : public Error {
 public:
  using Error::Error;
};

class LlavaDataset {
 public:
  // Throws if the file is missing or not JSON; a malformed entry only fails when processed.
  LlavaDataset(const DataOptions& options, const InputSpec& inputs);
  // The same on `text`, the contents of options.json_path already in memory.
  LlavaDataset(const DataOptions& options, const InputSpec& inputs, const std::string& text);
  int64_t size() const { return int64_t(entries_.size()); }
  // Throws BadSample for a malformed entry, a missing or undecodable image.
  Example get(int64_t index) const;
  // Cheap length estimate (bytes of text + image tokens) and modality, for length grouping.  With AnyRes and
  // options.image_lengths the image's tokens are its own layout's.
  int64_t length(int64_t index) const { return lengths_[index]; }
  bool has_image(int64_t index) const { return has_image_[index]; }
  std::string name(int64_t index) const;  // "file.json[12] (id 000012)"
  const std::string& path() const { return opt_.json_path; }
  const Tokenizer& tokenizer() const { return *tok_; }
  Template chat_template() const { return opt_.chat_template; }

 private:
  BadSample bad(int64_t index, const std::string& why) const;
  // The file the entry's image field names, checked to lie inside data.image_folder and to exist.
  std::string image_path(int64_t index, const nlohmann::json& field) const;
  int64_t image_tokens_from_header(int64_t index) const;
  // The entry's image as the model takes it.
  ModelImage image(int64_t index, const nlohmann::json& field) const;
  void add_image(Example& ex, ModelImage img) const;
  // The entry's turns in the template, `tokens_per_image` placeholders for its image; errors name the entry.
  Tokenized templated(int64_t index, const std::vector<Turn>& turns, int64_t tokens_per_image) const;

  DataOptions opt_;
  InputSpec inputs_;
  std::shared_ptr<const Tokenizer> tok_;
  std::vector<nlohmann::json> entries_;
  std::vector<int64_t> malformed_line_;  // per entry: its JSON-lines line number when it did not parse, else 0
  std::vector<int64_t> lengths_;
  std::vector<bool> has_image_;
};

}  // namespace hr::data
