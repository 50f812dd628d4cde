// Evaluation: mean loss over answer tokens and exact-match accuracy of greedy answers, overall and per
// question type.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "models/data/dataset.h"
#include "models/llava.h"
#include "parallel/comm.h"

namespace hr::train {

struct EvalOptions {
  int64_t samples = 0;  // 0: the whole set
  int64_t batch_size = 16;
  int64_t max_new_tokens = 12;
  int64_t ce_chunk_rows = 0;
  // Several ranks: each evaluates its share (samples rank, rank + world, ...) and the results are merged on
  // every rank. Null: this process evaluates everything.
  parallel::Communicator* comm = nullptr;
};

// One evaluated sample: what the model answered and whether it matched.
struct EvalPrediction {
  std::string id, question_type, prediction, answer;
  bool correct = false;
};

struct EvalResult {
  double loss = 0, accuracy = 0;
  int64_t samples = 0, skipped = 0;
  std::map<std::string, std::pair<int64_t, int64_t>> by_type;  // type -> (correct, total)
  std::vector<std::string> examples;                          // a few "question -> prediction (answer)" lines
  std::vector<EvalPrediction> predictions;                    // every sample, in eval-set order
};

// Greedy decoding: appends the argmax token until </s> or max_new_tokens, for every prompt at once.
std::vector<std::vector<int64_t>> generate_greedy(const models::Llava& model, const std::vector<models::Example>& prompts,
                                                  int64_t max_new_tokens);

EvalResult evaluate(const models::Llava& model, const models::LlavaDataset& data, const EvalOptions& options);

}  // namespace hr::train
