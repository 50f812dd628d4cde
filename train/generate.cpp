// Generation: prefill and one decode step per token through the KV cache (or whole-sequence forwards), then the
// next token of each row by argmax or by sampling.
#include "train/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "data/loader.h"

namespace hr::train {

using namespace hr::core;
using namespace hr::models;
using namespace hr::data;

namespace {

// splitmix64: a small, well-mixed generator whose whole state is one integer (a row's state is its seed).
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double uniform01(uint64_t& state) {
  return double(splitmix64(state) >> 11) * 0x1.0p-53;
}

// What a row has produced so far and whether it is done.
struct Row {
  std::vector<int64_t> tokens;
  std::string text;
  bool done = false;
  Finish finish = Finish::Length;
  uint64_t rng = 0;  // the state of the row's own stream of draws
};

// Appends `next` to the row and ends it at </s> or a stop string.
void advance(Row& row, int64_t next, const GenerationOptions& o, const Tokenizer& tok) {
  row.tokens.push_back(next);
  if (next == o.eos_token_id) {
    row.done = true;
    row.finish = Finish::Eos;
    return;
  }
  // The whole text again: a SentencePiece token's text depends on its neighbours (the leading space, bytes).
  row.text = tok.decode(row.tokens);
  for (const std::string& s : o.stop) {
    if (s.empty()) continue;
    // Only the tail the new token can have completed needs searching.
    const std::size_t from = row.text.size() > s.size() + 8 ? row.text.size() - s.size() - 8 : 0;
    const std::size_t at = row.text.find(s, from);
    if (at != std::string::npos) {
      row.text.resize(at);
      row.done = true;
      row.finish = Finish::Stop;
      return;
    }
  }
}

// One generate() call: the prompts as a right-padded batch (each row's prompt first, its images in order), what
// each row has produced, and the KV cache the rows share.
class Generation {
 public:
  Generation(const Llava& model, const std::vector<Example>& prompts, const GenerationOptions& o, std::size_t counted)
      : model_(model),
        cfg_(model.config()),
        o_(o),
        counted_(counted),
        bytes_(cfg_.llm.vocab, cfg_.image_token_id),
        tok_(o.tokenizer ? *o.tokenizer : static_cast<const Tokenizer&>(bytes_)),
        rows_(prompts.size()) {
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      HR_CHECK(!prompts[i].prompt.empty(), "[generate] prompt ", i, " (", prompts[i].id, ") is empty");
      lengths_.push_back(int64_t(prompts[i].prompt.size()));
      rows_[i].done = i >= counted;
      uint64_t seed = o.seed + 0x632BE59BD9B4E019ull * (i + 1);  // each row its own stream
      rows_[i].rng = splitmix64(seed);
      if (i < counted) r_.prompt_tokens += lengths_.back();
    }
    for (const Example& e : prompts) {
      Example p;
      p.id = e.id;
      p.ids = e.prompt;
      p.labels.assign(p.ids.size(), cfg_.ignore_index);
      p.images = e.images;
      p.image_sizes = e.image_sizes;
      p.image_tokens = e.image_tokens;
      cur_.push_back(std::move(p));
    }
  }

  // Forward, next token of every open row, until every row (on every rank) is done or max_new_tokens is reached.
  GenerationResult run() {
    Tensor logits = o_.use_cache ? prefill() : Tensor();
    for (int64_t step = 0;; ++step) {
      if (!o_.use_cache) logits = whole_sequence();
      ++r_.forwards;
      const std::vector<float> host = logits.to_floats();
      logits = Tensor();
      std::vector<int64_t> fed(rows_.size(), ByteTokenizer::kPad);
      const int64_t open = next_tokens(host, step, fed);
      if (open_anywhere(open) == 0 || step + 1 >= o_.max_new_tokens) break;
      if (o_.use_cache) logits = model_.decode(fed, cache_);
    }
    cache_ = KvCache{};
    return result();
  }

 private:
  // The prompts through the model into a cache that holds every position ever fed: the longest prompt and every
  // generated token but the last. The logits of each row's last prompt position.
  Tensor prefill() {
    const int64_t B = int64_t(rows_.size()), longest = *std::max_element(lengths_.begin(), lengths_.end());
    cache_ = model_.make_cache(B, longest + o_.max_new_tokens - 1);
    r_.cache_bytes = KvCache::bytes(cfg_.llm, B, cache_.capacity, model_.params().dtype());
    return model_.prefill(collate(cur_, longest, cfg_.ignore_index), lengths_, cache_);
  }

  // Without a cache: the whole sequence again, and the logits of each row's last position only.
  Tensor whole_sequence() const {
    int64_t seq = 0;
    for (const Example& e : cur_) seq = std::max<int64_t>(seq, int64_t(e.ids.size()));
    ModelOptions mo;
    mo.inference = true;
    for (std::size_t i = 0; i < cur_.size(); ++i)
      mo.logits_at.push_back(int64_t(i) * seq + int64_t(cur_[i].ids.size()) - 1);
    LlavaState st;
    model_.forward(collate(cur_, std::max<int64_t>(seq, 2), cfg_.ignore_index), st, mo);
    return st.logits;
  }

  // The next token of every open row from its logits, into `fed` (the next forward's input); how many rows
  // remain open.
  int64_t next_tokens(const std::vector<float>& logits, int64_t step, std::vector<int64_t>& fed) {
    const int64_t vocab = cfg_.llm.vocab;
    int64_t open = 0;
    for (std::size_t i = 0; i < rows_.size(); ++i) {
      Row& row = rows_[i];
      if (row.done) continue;
      const int64_t next = next_token(logits.data() + int64_t(i) * vocab, vocab, o_, row.rng);
      advance(row, next, o_, tok_);
      fed[i] = next;
      if (!o_.use_cache) {
        cur_[i].ids.push_back(next);
        cur_[i].labels.push_back(cfg_.ignore_index);
      }
      if (step + 1 >= o_.max_new_tokens) row.done = true;
      open += !row.done;
    }
    return open;
  }

  // Open rows on every rank: a rank whose rows are done still runs the forwards of the others.
  double open_anywhere(int64_t open) const {
    return o_.comm && o_.comm->world() > 1 ? o_.comm->sum(double(open)) : double(open);
  }

  // The counted rows' tokens, text and finish (the fillers' are dropped).
  GenerationResult result() {
    for (std::size_t i = 0; i < counted_ && i < rows_.size(); ++i) {
      r_.new_tokens += int64_t(rows_[i].tokens.size());
      r_.tokens.push_back(std::move(rows_[i].tokens));
      r_.text.push_back(std::move(rows_[i].text));
      r_.finish.push_back(rows_[i].finish);
    }
    return std::move(r_);
  }

  const Llava& model_;
  const LlavaConfig& cfg_;
  const GenerationOptions& o_;
  const std::size_t counted_;
  const ByteTokenizer bytes_;  // the text of the tokens where the options name no tokenizer
  const Tokenizer& tok_;
  std::vector<Row> rows_;
  std::vector<int64_t> lengths_;  // of each prompt
  std::vector<Example> cur_;      // each row's prompt (and, without a cache, its tokens so far)
  KvCache cache_;
  GenerationResult r_;
};

}  // namespace

const char* finish_name(Finish f) {
  switch (f) {
    case Finish::Eos:
      return "eos";
    case Finish::Stop:
      return "stop";
    case Finish::Length:
      return "length";
  }
  return "?";
}

int64_t next_token(const float* logits, int64_t vocab, const GenerationOptions& o, uint64_t& rng) {
  if (!o.do_sample) return std::max_element(logits, logits + vocab) - logits;
  HR_CHECK(o.temperature > 0.f, "[generate] temperature must be > 0 when sampling; got ", o.temperature);
  HR_CHECK(o.top_p > 0.f && o.top_p <= 1.f, "[generate] top_p must be in (0, 1]; got ", o.top_p);
  HR_CHECK(o.top_k >= 0, "[generate] top_k must be >= 0; got ", o.top_k);
  // Temperature, then top-k, then top-p over what is left, in the order Hugging Face's samplers apply them.
  std::vector<int64_t> idx(static_cast<std::size_t>(vocab));
  std::iota(idx.begin(), idx.end(), 0);
  const auto by_logit = [&](int64_t a, int64_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, vocab) : vocab;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), by_logit);
  idx.resize(std::size_t(k));
  std::vector<double> p(idx.size());
  const double top = double(logits[idx[0]]) / o.temperature;
  double sum = 0;
  for (std::size_t i = 0; i < idx.size(); ++i) sum += p[i] = std::exp(double(logits[idx[i]]) / o.temperature - top);
  std::size_t keep = idx.size();
  if (o.top_p < 1.f) {
    double cum = 0;
    for (keep = 0; keep < idx.size();) {
      cum += p[keep++] / sum;
      if (cum >= double(o.top_p) - 1e-6) break;  // float top_p (0.8f is 0.80000001) against a double sum
    }
    sum = std::accumulate(p.begin(), p.begin() + long(keep), 0.0);
  }
  double u = uniform01(rng) * sum;
  for (std::size_t i = 0; i < keep; ++i) {
    if (u < p[i]) return idx[i];
    u -= p[i];
  }
  return idx[keep - 1];
}

GenerationResult generate(const Llava& model, const std::vector<Example>& prompts, const GenerationOptions& o,
                          std::size_t counted) {
  const auto t0 = std::chrono::steady_clock::now();
  HR_CHECK(!prompts.empty(), "[generate] no prompts");
  HR_CHECK(o.max_new_tokens >= 1, "[generate] max_new_tokens must be >= 1; got ", o.max_new_tokens);
  GenerationResult r = Generation(model, prompts, o, counted).run();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace hr::train
