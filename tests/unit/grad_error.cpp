// The gradient-error measurement of grad_error.h: three copies of one model (f32, and the 16-bit dtype with
// gradients accumulated in it or in f32) run the same micro-batches of random text and images.
#include "grad_error.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>

#include "data/batch.h"
#include "models/llava.h"
#include "models/weights.h"

namespace hr::test {

using namespace hr::core;
using namespace hr::models;

namespace {

// A micro-batch of `b` sequences: text, one image's placeholders, text; labels on the text after the image.
data::Batch random_batch(const LlavaConfig& m, int64_t b, int64_t seq, std::mt19937_64& rng) {
  const int64_t image = m.vision.tokens_per_image(), start = 3;
  data::Batch batch;
  batch.batch = b;
  batch.seq = seq;
  // Zipf's law over the vocabulary (rank k drawn with weight 1 / (k + 1)).
  static thread_local std::vector<double> weights;
  weights.resize(std::size_t(m.llm.vocab));
  for (std::size_t k = 0; k < weights.size(); ++k) weights[k] = 1.0 / double(k + 1);
  std::discrete_distribution<int64_t> token(weights.begin(), weights.end());
  for (int64_t r = 0; r < b; ++r)
    for (int64_t t = 0; t < seq; ++t) {
      const bool placeholder = t >= start && t < start + image;
      int64_t id = token(rng);
      while (!placeholder && id == m.image_token_id) id = token(rng);
      batch.input_ids.push_back(placeholder ? m.image_token_id : id);
      batch.labels.push_back(t >= start + image ? batch.input_ids.back() : m.ignore_index);
    }
  std::normal_distribution<float> pixel(0.f, 1.f);
  std::vector<float> pixels(std::size_t(b * m.vision.channels * m.vision.image_size * m.vision.image_size));
  for (float& p : pixels) p = pixel(rng);
  batch.pixel_values = Tensor::from_floats(pixels, {b, m.vision.channels, m.vision.image_size, m.vision.image_size},
                                           DType::F32, Device::cpu());
  return batch;
}

double norm_of(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return std::sqrt(s);
}

}  // namespace

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<ParamError> measure_grad_error(const GradErrorCase& c) {
  Llava reference(c.model, Device::cpu(), DType::F32);
  init_weights(reference.params(), c.seed);
  Llava narrow(c.model, Device::cpu(), c.dtype), wide(c.model, Device::cpu(), c.dtype);
  wide.params().accumulate_grads_in(DType::F32);
  for (Llava* m : {&reference, &narrow, &wide}) m->set_trainable({.vision = true, .projector = true, .llm = true});
  for (Llava* m : {&narrow, &wide})
    for (std::size_t i = 0; i < m->params().all().size(); ++i)
      assign_param(*m->params().all()[i], reference.params().all()[i]->data);
  std::mt19937_64 rng(c.seed);
  for (int64_t k = 0; k < c.micro_batches; ++k) {
    const data::Batch batch = random_batch(c.model, c.micro_batch, c.seq, rng);
    for (Llava* m : {&reference, &narrow, &wide}) {
      LlavaState st;
      ModelOptions opt;
      opt.ce_chunk_rows = c.ce_chunk_rows;
      m->forward(batch, st, opt);
      m->backward(st, 1.f / float(c.micro_batches));
    }
  }
  std::vector<ParamError> out;
  const auto& ref = reference.params().all();
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (!ref[i]->grad.defined()) continue;
    const std::vector<float> want = ref[i]->grad.to_floats();
    const double scale = std::max(norm_of(want), 1e-30);
    auto error = [&](Llava& m) {
      const std::vector<float> got = m.params().all()[i]->grad.to_floats();
      std::vector<float> diff(got.size());
      for (std::size_t e = 0; e < got.size(); ++e) diff[e] = got[e] - want[e];
      return norm_of(diff) / scale;
    };
    out.push_back({ref[i]->name, error(narrow), error(wide), norm_of(want)});
  }
  return out;
}

}  // namespace hr::test
