// The synthetic VQA set: scenes of one to three coloured shapes in three slots (left, middle, right), with
// one-word questions about colour, shape, count and position that cannot be answered without the image.
#pragma once

#include <cstdint>
#include <string>

namespace hr::data {

enum class SynthAspect : uint8_t { Square, Mixed, Tall, Wide };
// "square", "mixed", "tall" or "wide"; errors name `what` (the key or flag).
SynthAspect parse_synth_aspect(const std::string& s, const std::string& what);
const char* synth_aspect_name(SynthAspect a);

struct SynthOptions {
  std::string out_dir;
  int64_t train = 2000, eval = 200;
  uint64_t seed = 0;
  int image_size = 32;
  int questions = 1;  // question-answer turns per training image (eval entries always hold one)
  // Fraction of training entries that describe the scene instead ("Describe the shapes from left to right."
  // -> "red circle, blue square"): every object's colour and shape in one answer. Eval entries are questions.
  double captions = 0;
  // Square images, or of mixed aspect ratios (width:height 1:1, 2:1, 1:2, 3:1, 1:3, 3:2, 2:3; the short side
  // image_size), as AnyRes meets them, or only the tall (1:2, 1:3, 2:3) or wide (2:1, 3:1, 3:2) ones; each entry's
  // ratio drawn from its own generator, so the scenes are those of a square set.
  SynthAspect aspect = SynthAspect::Square;
};

// Writes out_dir/train.json, out_dir/eval.json (LLaVA format, with a "question_type" per entry) and
// out_dir/images/*.png. Deterministic by seed; the images, the eval entries and each other entry's first
// question do not depend on `questions` or `captions`. Returns the number of entries written.
int64_t write_synthetic_vqa(const SynthOptions& options);

}  // namespace hr::data
