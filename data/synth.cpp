// Synthetic VQA scenes and questions.
#include "data/synth.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "core/check.h"
#include "core/io/atomic_file.h"
#include "data/image.h"

namespace hr::data {

namespace {

using json = nlohmann::json;

struct Color {
  const char* name;
  uint8_t rgb[3];
};
constexpr std::array<Color, 4> kColors = {
    {{"red", {220, 40, 40}}, {"green", {40, 170, 60}}, {"blue", {50, 80, 220}}, {"yellow", {230, 200, 30}}}};
constexpr std::array<const char*, 3> kShapes = {"circle", "square", "triangle"};
constexpr std::array<const char*, 3> kSlots = {"left", "middle", "right"};
constexpr std::array<const char*, 3> kCounts = {"one", "two", "three"};
constexpr uint8_t kBackground = 235;

struct Object {
  int shape, color, slot;
};

// The image is a 3×3 grid of cells; an object sits inside one cell of the middle row, its column being its
// slot. With a patch that divides the cell (24 px, patch 8; 48 px, patch 16) every object falls inside one
// patch and no patch holds parts of two objects. `half`: the object's half-width, centred on (cx, cy).
void draw(RgbImage& img, const Object& o, int cx, int cy, int half) {
  const int W = img.width, H = img.height;
  for (int y = cy - half; y <= cy + half; ++y)
    for (int x = cx - half; x <= cx + half; ++x) {
      if (x < 0 || y < 0 || x >= W || y >= H) continue;
      const int dx = x - cx, dy = y - cy;
      bool inside = false;
      if (o.shape == 0) inside = dx * dx + dy * dy <= half * half;
      if (o.shape == 1) inside = true;
      if (o.shape == 2) inside = dy >= -half && std::abs(dx) * 2 <= (dy + half);  // apex up
      if (!inside) continue;
      for (int ch = 0; ch < 3; ++ch) img.pixels[(std::size_t(y) * W + x) * 3 + ch] = kColors[o.color].rgb[ch];
    }
}

struct Question {
  std::string type, text, answer;
};

json make_entry(const std::string& id, const std::string& image, const std::vector<Question>& qs) {
  json turns = json::array();
  for (std::size_t i = 0; i < qs.size(); ++i) {
    turns.push_back({{"from", "human"}, {"value", (i == 0 ? "<image>\n" : "") + qs[i].text}});
    turns.push_back({{"from", "gpt"}, {"value", qs[i].answer}});
  }
  return {{"id", id}, {"image", image}, {"question_type", qs.back().type}, {"conversations", turns}};
}

enum class SampleKind : uint8_t { Questions, Caption };

// The kinds of question, in the order of the draw that picks one.
enum QuestionType : int { kColorQuestion, kShapeQuestion, kPositionQuestion, kCountQuestion, kQuestionTypes };

int pick(std::mt19937_64& rng, int n) {
  return int(rng() % uint64_t(n));
}

// One to three objects, each of a drawn shape and colour, in slots of their own.
std::vector<Object> make_objects(std::mt19937_64& rng) {
  const int count = 1 + pick(rng, 3);
  std::vector<int> slots = {0, 1, 2};
  std::shuffle(slots.begin(), slots.end(), rng);
  std::vector<Object> objs;
  for (int i = 0; i < count; ++i) objs.push_back({pick(rng, 3), pick(rng, 4), slots[i]});
  return objs;
}

// The scene on a `width` x `height` canvas: three slots across, each object in the middle row of its slot.
RgbImage render(const std::vector<Object>& objs, int width, int height, std::mt19937_64& rng) {
  RgbImage img{width, height, std::vector<uint8_t>(std::size_t(width) * height * 3, kBackground)};
  // Each object's centre is jittered by a pixel or so within its cell (never past the cell's edge), which keeps
  // scenes from repeating exactly. On a square canvas a cell is a third of a side; otherwise objects keep the size
  // of the shorter side's cells, centred in their slot.
  const int cell_x = width / 3, cell_y = height / 3, cell = std::min(cell_x, cell_y);
  const int half = std::max(2, cell * 2 / 5), room = std::max(1, cell - 2 * half);
  for (const Object& o : objs) {
    const int jitter_y = pick(rng, room), jitter_x = pick(rng, room);
    draw(img, o, o.slot * cell_x + (cell_x - cell) / 2 + half + jitter_x,
         cell_y + (cell_y - cell) / 2 + half + jitter_y, half);
  }
  return img;
}

bool unique(const std::vector<Object>& objs, int Object::*field, int value) {
  return std::count_if(objs.begin(), objs.end(), [&](const Object& o) { return o.*field == value; }) == 1;
}

// The question of `type` about `o`, where it is well posed: a colour or shape question names the object by
// what no other object shares.
std::optional<Question> ask(const std::vector<Object>& objs, int type, const Object& o) {
  if (type == kColorQuestion && unique(objs, &Object::shape, o.shape))
    return Question{"color", str("What color is the ", kShapes[o.shape], "?"), kColors[o.color].name};
  if (type == kShapeQuestion && unique(objs, &Object::color, o.color))
    return Question{"shape", str("What shape is the ", kColors[o.color].name, " object?"), kShapes[o.shape]};
  if (type == kPositionQuestion)
    return Question{"position", str("Where is the ", kColors[o.color].name, " ", kShapes[o.shape], "?"),
                    kSlots[o.slot]};
  if (type == kCountQuestion) return Question{"count", "How many shapes are there?", kCounts[objs.size() - 1]};
  return std::nullopt;
}

// Pick a question type whose question is well posed for this scene; fall back to counting.
Question first_question(std::mt19937_64& rng, const std::vector<Object>& objs) {
  std::optional<Question> first;
  for (int attempt = 0; attempt < 8 && !first; ++attempt) {
    const int type = pick(rng, kQuestionTypes);
    first = ask(objs, type, objs[std::size_t(pick(rng, int(objs.size())))]);
  }
  return first ? *first : *ask(objs, kCountQuestion, objs[0]);
}

Question caption(const std::vector<Object>& objs) {
  std::vector<Object> by_slot = objs;
  std::sort(by_slot.begin(), by_slot.end(), [](const Object& a, const Object& b) { return a.slot < b.slot; });
  std::string text;
  for (const Object& o : by_slot) text += str(text.empty() ? "" : ", ", kColors[o.color].name, " ", kShapes[o.shape]);
  return {"caption", "Describe the shapes from left to right.", text};
}

// Further turns up to `questions`: the scene's other well-posed questions, in an order drawn from the sample's
// own generator (`turn_seed`).
void add_turns(const std::vector<Object>& objs, int questions, uint64_t turn_seed, std::vector<Question>& qs) {
  std::vector<Question> rest;
  for (int type = 0; type < kQuestionTypes; ++type)
    for (const Object& o : objs)
      if (auto q = ask(objs, type, o);
          q && q->text != qs[0].text &&
          std::none_of(rest.begin(), rest.end(), [&](const Question& r) { return r.text == q->text; }))
        rest.push_back(*q);
  std::mt19937_64 local(turn_seed);
  std::shuffle(rest.begin(), rest.end(), local);
  for (std::size_t i = 0; i < rest.size() && int(qs.size()) < questions; ++i) qs.push_back(rest[i]);
}

struct Canvas {
  int width, height;
};

// A scene (its image written under `dir`) and its entry. A caption entry draws its first question too, so that
// the scenes after it do not depend on which entries are captions.
json make_sample(std::mt19937_64& rng, const std::string& id, const std::string& dir, Canvas canvas, int questions,
                 SampleKind kind, uint64_t turn_seed) {
  const std::vector<Object> objs = make_objects(rng);
  const std::string file = "images/" + id + ".png";
  write_png(dir + "/" + file, render(objs, canvas.width, canvas.height, rng));
  std::vector<Question> qs = {first_question(rng, objs)};
  if (kind == SampleKind::Caption) return make_entry(id, file, {caption(objs)});
  if (questions > 1) add_turns(objs, questions, turn_seed, qs);
  return make_entry(id, file, qs);
}

}  // namespace

SynthAspect parse_synth_aspect(const std::string& s, const std::string& what) {
  if (s == "square") return SynthAspect::Square;
  if (s == "mixed") return SynthAspect::Mixed;
  if (s == "tall") return SynthAspect::Tall;
  if (s == "wide") return SynthAspect::Wide;
  throw Error(str(what, " '", s, "' is not one of: square, mixed, tall, wide"));
}

const char* synth_aspect_name(SynthAspect a) {
  switch (a) {
    case SynthAspect::Mixed:
      return "mixed";
    case SynthAspect::Tall:
      return "tall";
    case SynthAspect::Wide:
      return "wide";
    case SynthAspect::Square:
      break;
  }
  return "square";
}

int64_t write_synthetic_vqa(const SynthOptions& o) {
  HR_CHECK(o.image_size >= 8, "[data synth] --image-size must be at least 8; got ", o.image_size);
  HR_CHECK(o.questions >= 1, "[data synth] --questions must be at least 1; got ", o.questions);
  HR_CHECK(o.captions >= 0 && o.captions <= 1, "[data synth] --captions must be a fraction in [0, 1]; got ",
           o.captions);
  std::filesystem::create_directories(o.out_dir + "/images");
  std::mt19937_64 rng(o.seed);
  for (const auto& [split, n] : {std::pair<std::string, int64_t>{"train", o.train}, {"eval", o.eval}}) {
    json all = json::array();
    for (int64_t i = 0; i < n; ++i) {
      char id[64];
      std::snprintf(id, sizeof id, "%s-%06lld", split.c_str(), (long long)i);
      const int questions = split == "train" ? o.questions : 1;
      const uint64_t turn_seed = o.seed * 1000003 + uint64_t(i);
      // Which entries are captions: drawn from the entry's own generator, so the scenes do not change.
      std::mt19937_64 caption_rng(~turn_seed);
      const SampleKind kind =
          split == "train" && std::uniform_real_distribution<double>(0.0, 1.0)(caption_rng) < o.captions
              ? SampleKind::Caption
              : SampleKind::Questions;
      Canvas canvas{o.image_size, o.image_size};
      if (o.aspect != SynthAspect::Square) {  // the ratio from the entry's own generator too
        constexpr int kRatios[][2] = {{1, 1}, {2, 1}, {1, 2}, {3, 1}, {1, 3}, {3, 2}, {2, 3}};
        constexpr int kWide[] = {1, 3, 5}, kTall[] = {2, 4, 6};
        std::mt19937_64 aspect_rng(turn_seed ^ 0x9E3779B97F4A7C15ull);
        const int pick = std::uniform_int_distribution<int>(0, o.aspect == SynthAspect::Mixed ? 6 : 2)(aspect_rng);
        const auto& r = kRatios[o.aspect == SynthAspect::Mixed  ? pick
                                : o.aspect == SynthAspect::Wide ? kWide[pick]
                                                                : kTall[pick]];
        const int shorter = std::min(r[0], r[1]);
        canvas = {o.image_size * r[0] / shorter, o.image_size * r[1] / shorter};
      }
      all.push_back(make_sample(rng, id, o.out_dir, canvas, questions, kind, turn_seed));
    }
    core::AtomicFile f(o.out_dir + "/" + split + ".json");
    const std::string text = all.dump(1) + "\n";
    f.write(text.data(), text.size());
    f.commit();
  }
  return o.train + o.eval;
}

}  // namespace hr::data
