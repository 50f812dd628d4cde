// Text generation: greedy or sampled decoding (temperature, top-k, top-p, a seed), stopping at </s>, a stop
// string or max_new_tokens, for a batch of prompts of different lengths (each row at its own positions), with a
// KV cache or, as a reference, by running the whole sequence again for every token.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "models/llava.h"
#include "parallel/comm.h"

namespace hr::train {

struct GenerationOptions {
  int64_t max_new_tokens = 64;
  bool do_sample = false;         // false: greedy (argmax); true: sample from temperature / top-k / top-p
  float temperature = 1.f;        // logits are divided by it before sampling
  int64_t top_k = 0;              // 0: every token
  float top_p = 1.f;              // nucleus: the smallest set of tokens whose probability reaches top_p
  uint64_t seed = 0;              // sampling is a function of the seed, the prompts and the model
  std::vector<std::string> stop;  // a row ends once its text contains one of these (cut from the text)
  int64_t eos_token_id = data::ByteTokenizer::kEos;  // set it to tokenizer->eos() with a real tokenizer
  const data::Tokenizer* tokenizer = nullptr;        // the text of the tokens; null: byte-level
  bool use_cache = true;
  // Several ranks: every rank runs as many forwards as the rank that generates longest (ZeRO-3 gathers
  // parameters inside them). Null: this process alone.
  parallel::Communicator* comm = nullptr;
};

enum class Finish : uint8_t { Eos, Stop, Length };
const char* finish_name(Finish f);  // "eos", "stop", "length"

struct GenerationResult {
  std::vector<std::vector<int64_t>> tokens;  // per prompt: the new tokens (ending with </s> when it stopped there)
  std::vector<std::string> text;             // per prompt: the new tokens' text, cut at </s> or a stop string
  std::vector<Finish> finish;
  int64_t prompt_tokens = 0, new_tokens = 0;  // of the counted prompts
  int64_t forwards = 0;
  int64_t cache_bytes = 0;  // the KV cache (0 without one)
  double seconds = 0;       // the whole generation, prefill included
};

// Generates for `prompts` (their `prompt` ids and `images`); only the first `counted` are real, the rest are
// fillers that keep a rank in step with the others (generated for, not reported).
GenerationResult generate(const models::Llava& model, const std::vector<data::Example>& prompts,
                          const GenerationOptions& options, std::size_t counted);
inline GenerationResult generate(const models::Llava& model, const std::vector<data::Example>& prompts,
                                 const GenerationOptions& options) {
  return generate(model, prompts, options, prompts.size());
}

// The next token from one row of logits: argmax, or a draw by the options' sampling rules with `rng_state`
// (advanced). Exposed for tests.
int64_t next_token(const float* logits, int64_t vocab, const GenerationOptions& options, uint64_t& rng_state);

}  // namespace hr::train
