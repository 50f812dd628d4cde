// Evaluation loop and greedy generation.
#include "train/evaluate.h"

#include <algorithm>

#include "models/data/loader.h"
#include "models/data/tokenizer.h"

namespace hr::train {

using namespace hr::core;
using namespace hr::models;

namespace {
std::string normalise(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  std::size_t b = 0;
  while (b < s.size() && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  s = s.substr(b);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}
}  // namespace

std::vector<std::vector<int64_t>> generate_greedy(const Llava& model, const std::vector<Example>& prompts,
                                                  int64_t max_new_tokens) {
  const int64_t vocab = model.config().llm.vocab;
  std::vector<Example> cur;
  for (const Example& e : prompts) {
    Example p;
    p.ids = e.prompt;
    p.labels.assign(p.ids.size(), model.config().ignore_index);
    p.images = e.images;
    cur.push_back(std::move(p));
  }
  std::vector<std::vector<int64_t>> out(prompts.size());
  std::vector<bool> done(prompts.size(), false);
  ModelOptions opt;
  opt.inference = true;
  opt.return_logits = true;
  for (int64_t step = 0; step < max_new_tokens; ++step) {
    int64_t seq = 0;
    for (const Example& e : cur) seq = std::max<int64_t>(seq, int64_t(e.ids.size()));
    Batch b = collate(cur, seq, model.config().ignore_index);
    LlavaState st;
    model.forward(b, st, opt);
    std::vector<float> logits = st.logits.to_floats();
    bool all_done = true;
    for (std::size_t i = 0; i < cur.size(); ++i) {
      if (done[i]) continue;
      const float* row = logits.data() + (int64_t(i) * seq + int64_t(cur[i].ids.size()) - 1) * vocab;
      const int64_t next = std::max_element(row, row + vocab) - row;
      out[i].push_back(next);
      cur[i].ids.push_back(next);
      cur[i].labels.push_back(model.config().ignore_index);
      if (next == ByteTokenizer::kEos) done[i] = true;
      all_done = all_done && done[i];
    }
    if (all_done) break;
  }
  return out;
}

EvalResult evaluate(const Llava& model, const LlavaDataset& data, const EvalOptions& o) {
  EvalResult r;
  const int64_t n = o.samples > 0 ? std::min(o.samples, data.size()) : data.size();
  const ByteTokenizer tok(model.config().llm.vocab, model.config().image_token_id);
  double loss_sum = 0;
  int64_t loss_tokens = 0, correct = 0;
  for (int64_t start = 0; start < n; start += o.batch_size) {
    std::vector<Example> batch;
    for (int64_t i = start; i < std::min(n, start + o.batch_size); ++i) {
      try {
        batch.push_back(data.get(i));
      } catch (const BadSample&) {
        ++r.skipped;
      }
    }
    if (batch.empty()) continue;
    int64_t seq = 0;
    for (const Example& e : batch) seq = std::max<int64_t>(seq, int64_t(e.ids.size()));
    Batch b = collate(batch, seq, model.config().ignore_index);
    ModelOptions opt;
    opt.inference = true;
    opt.ce_chunk_rows = o.ce_chunk_rows;
    LlavaState st;
    const float loss = model.forward(b, st, opt);
    loss_sum += double(loss) * double(st.valid_labels);
    loss_tokens += st.valid_labels;
    auto gen = generate_greedy(model, batch, o.max_new_tokens);
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const std::string pred = normalise(tok.decode(gen[i])), want = normalise(batch[i].answer);
      const bool ok = pred == want;
      correct += ok;
      auto& t = r.by_type[batch[i].question_type.empty() ? "all" : batch[i].question_type];
      t.first += ok;
      ++t.second;
      if (r.examples.size() < 4) r.examples.push_back(str(batch[i].id, ": '", pred, "' (answer '", want, "')"));
      ++r.samples;
    }
  }
  r.loss = loss_tokens ? loss_sum / double(loss_tokens) : 0.0;
  r.accuracy = r.samples ? double(correct) / double(r.samples) : 0.0;
  return r;
}

}  // namespace hr::train
