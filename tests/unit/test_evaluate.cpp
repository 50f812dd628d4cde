// Evaluation: answers settled by the loss pass are exactly the ones greedy decoding produces, one process
// and the decode-everything path agree sample for sample, truncated samples are decoded.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/ops/copy.h"
#include "data/synth.h"
#include "data/tokenizer.h"
#include "models/weights.h"
#include "train/evaluate.h"

using namespace hr;
using namespace hr::core;
using namespace hr::models;
using namespace hr::data;
using namespace hr::train;

namespace {

LlavaConfig small_model() {
  LlavaConfig c = preset("tiny");
  c.llm.vocab = 300;
  c.image_token_id = 299;
  c.vision.image_size = 8;
  c.vision.patch = 4;
  return c;
}

void set(Param& p, const std::vector<float>& values) {
  copy_(p.data, Tensor::from_floats(values, p.shape, p.dtype, p.data.device()));
}

Param& param(Llava& model, const std::string& name) {
  for (const auto& p : model.params().all())
    if (p->name == name) return *p;
  throw std::runtime_error("no parameter " + name);
}

// Every block's output projections zeroed leaves the residual stream at the token's embedding: the model
// predicts the next token from the current one alone. The head then maps ' ' (the end of "ASSISTANT: ") to
// 'x' and 'x' to </s>, so every greedy answer is "x".
void answer_x(Llava& model) {
  for (const auto& p : model.params().all())
    if (p->name.find("o_proj") != std::string::npos || p->name.find("down_proj") != std::string::npos)
      set(*p, std::vector<float>(std::size_t(p->numel()), 0.f));
  const LlmConfig& llm = model.config().llm;
  const std::vector<float> embed = param(model, "language_model.model.embed_tokens.weight").data.to_floats();
  const int64_t C = llm.hidden, x = ByteTokenizer::kByteOffset + 'x', space = ByteTokenizer::kByteOffset + ' ';
  std::vector<float> head(std::size_t(llm.vocab * C), 0.f);
  for (int64_t c = 0; c < C; ++c) {
    head[std::size_t(x * C + c)] = embed[std::size_t(space * C + c)];
    head[std::size_t(ByteTokenizer::kEos * C + c)] = embed[std::size_t(x * C + c)];
  }
  set(param(model, "language_model.lm_head.weight"), head);
}

void expect_same(const EvalResult& a, const EvalResult& b) {
  EXPECT_EQ(a.accuracy, b.accuracy);
  EXPECT_EQ(a.loss, b.loss);
  ASSERT_EQ(a.predictions.size(), b.predictions.size());
  for (std::size_t i = 0; i < a.predictions.size(); ++i) {
    EXPECT_EQ(a.predictions[i].id, b.predictions[i].id);
    EXPECT_EQ(a.predictions[i].prediction, b.predictions[i].prediction) << a.predictions[i].id;
    EXPECT_EQ(a.predictions[i].correct, b.predictions[i].correct) << a.predictions[i].id;
  }
}

// A model built to answer "x", and the synthetic eval set with every other answer replaced by "x" in a
// directory of the test's own (ctest runs tests in parallel).
class Evaluate : public testing::Test {
 protected:
  Evaluate() : model(small_model(), Device::cpu(), DType::F32) {
    init_weights(model.params(), 3);
    answer_x(model);
    const std::string d = testing::TempDir() + "/eval_" + testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(d);
    write_synthetic_vqa({d, 1, 10, 5, 8});
    nlohmann::json all = nlohmann::json::parse(std::ifstream(d + "/eval.json"));
    for (std::size_t i = 0; i < all.size(); i += 2) all[i]["conversations"][1]["value"] = "x";
    std::ofstream(d + "/eval_x.json") << all.dump();
    options.json_path = d + "/eval_x.json";
    options.image_folder = d;
    options.system_prompt = "";
  }
  Llava model;
  DataOptions options;
};

}  // namespace

TEST_F(Evaluate, LossPassSettlesExactlyTheAnswersGreedyDecodingProduces) {
  LlavaDataset data(options, models::input_spec(model.config()));

  // The construction holds: greedy decoding answers "x" everywhere.
  std::vector<Example> prompts;
  for (int64_t i = 0; i < data.size(); ++i) prompts.push_back(data.get(i));
  for (const auto& gen : generate_greedy(model, prompts, 12))
    ASSERT_EQ(gen, (std::vector<int64_t>{ByteTokenizer::kByteOffset + 'x', ByteTokenizer::kEos}));

  EvalOptions eo;
  eo.batch_size = 4;
  const EvalResult fast = evaluate(model, data, eo);
  eo.decode_all = true;
  const EvalResult slow = evaluate(model, data, eo);
  expect_same(fast, slow);
  EXPECT_EQ(fast.accuracy, 0.5);
  EXPECT_EQ(fast.decoded, 5);  // the five whose reference is not "x"
  EXPECT_EQ(slow.decoded, 10);
  for (const EvalPrediction& p : fast.predictions) EXPECT_EQ(p.prediction, "x") << p.id;

  // A reference longer than max_new_tokens allows can never be produced: decoded, not settled.
  eo.decode_all = false;
  eo.max_new_tokens = 1;
  const EvalResult one = evaluate(model, data, eo);
  EXPECT_EQ(one.decoded, 10);
  EXPECT_EQ(one.accuracy, 0.5);  // "x" without its </s> still reads "x"
}

TEST_F(Evaluate, TruncatedAnswersAreDecodedNotSettled) {
  const int64_t full = int64_t(LlavaDataset(options, models::input_spec(model.config())).get(0).ids.size());
  options.max_seq_len = full - 1;  // sample 0 loses its </s>
  LlavaDataset data(options, models::input_spec(model.config()));
  ASSERT_EQ(int64_t(data.get(0).ids.size()), full - 1);
  EvalOptions eo;
  eo.batch_size = 4;
  const EvalResult r = evaluate(model, data, eo);
  eo.decode_all = true;
  expect_same(r, evaluate(model, data, eo));
  EXPECT_EQ(r.predictions[0].prediction, "x");
  EXPECT_TRUE(r.predictions[0].correct);
  EXPECT_GE(r.decoded, 6);  // the five non-"x" references and the truncated sample at least
}
