// What an evaluation during training records: each pass's measured peak against the dry run of its shape,
// eval.jsonl's line, predictions.jsonl's lines, and the console's summary.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/lru_map.h"
#include "core/memory/caching_allocator.h"
#include "core/memory/replay.h"
#include "train/evaluate.h"
#include "train/log_file.h"
#include "train/planner.h"

namespace hr::train {

// Evaluation passes' dry runs, by shape: a loss pass is {0, batch, seq, images, logit rows}, generation {1,
// images, max_new_tokens, decode steps, prompt lengths...}. Every evaluation runs the same loss passes.
using EvalPredictions = core::LruMap<std::vector<int64_t>, Prediction>;

// Each evaluation pass's measured peak against the dry run of its shape on the predictor's engine (which a
// step has left as the real one: parameters, gradients and states in place), its requests replayed from the
// allocator's state at the pass's start: with the caching kind what is cached changes the allocated peak (a large
// block splits only when more than 1 MiB would remain, and an allocation counts its whole block).
class EvalMemory final : public EvalWatch {
 public:
  struct Peaks {
    int64_t measured = 0, predicted = 0, passes = 0, mismatches = 0;
    nlohmann::json json() const {
      return {
          {"peak_allocated", measured}, {"predicted_peak", predicted}, {"passes", passes}, {"mismatches", mismatches}};
    }
  };
  EvalMemory(core::CachingAllocator& device, Predictor& predictor, EvalPredictions& predicted)
      : device_(device), predictor_(predictor), predicted_(predicted) {}
  void begin() override {
    device_.reset_peak_stats();
    start_ = device_.snapshot();
  }
  void end(const EvalShape& s) override {
    add(loss, predicted_.get({0, s.batch, s.seq, s.images, s.logit_rows}, [&] { return predictor_.evaluation(s); }));
  }
  void end(const GenerationShape& s) override {
    std::vector<int64_t> key = {1, s.images, s.max_new_tokens, s.decode_steps};
    key.insert(key.end(), s.prompt_lengths.begin(), s.prompt_lengths.end());
    add(generation, predicted_.get(key, [&] { return predictor_.generation(s); }));
  }
  Peaks loss, generation;

 private:
  void add(Peaks& p, const Prediction& pass) {
    const int64_t predicted = core::replay(start_, *pass.requests, device_.capacity()).peak_allocated;
    const int64_t measured = device_.stats().allocated_bytes.peak;
    p.measured = std::max(p.measured, measured);
    p.predicted = std::max(p.predicted, predicted);
    ++p.passes;
    p.mismatches += measured != predicted;
  }
  core::CachingAllocator& device_;
  Predictor& predictor_;
  EvalPredictions& predicted_;
  core::AllocatorSnapshot start_;  // the allocator when the pass began
};

// Appends the evaluation's line to eval.jsonl: loss, accuracy (overall and per question type), samples, bad samples
// skipped, and the passes' memory against their dry runs.
void write_eval_line(LogFile& log, int64_t step, const EvalResult& r, const EvalMemory& m);

// Every evaluated sample's answer, one line each, tagged with the step: what a confusion matrix is made from.
void write_predictions(LogFile& log, int64_t step, const EvalResult& r);

// "eval loss L | accuracy A% (type a%, ...) over N samples".
std::string eval_summary(const EvalResult& r);

}  // namespace hr::train
