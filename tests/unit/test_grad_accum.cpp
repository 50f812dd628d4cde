// memory.grad_accum_dtype: a bf16 model's gradients accumulated in f32 (DeepSpeed's grad_accum_dtype, what PyTorch's
// autocast keeps) stay closer to an f32 model's than gradients accumulated in bf16, where many adds land in one
// element (the embedding table, the output projection across loss chunks, every weight across micro-batches). And
// a step's first backward writes a layer's gradients into buffers it never zero-fills; the next ones add onto them.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <set>

#include "core/ops/copy.h"
#include "core/ops/linear.h"
#include "core/ops/norm.h"
#include "core/parameters.h"
#include "grad_error.h"
#include "models/layers.h"
#include "models/llava.h"

using namespace hr;
using namespace hr::core;
using namespace hr::test;

TEST(GradAccum, F32AccumulationOfBf16GradientsIsCloserToF32) {
  GradErrorCase c;
  c.model = models::preset("tiny");
  c.model.llm.vocab = 4096;  // a vocabulary the loss splits into chunks, ids that repeat across micro-batches
  c.micro_batches = 8;
  c.seq = 64;
  c.ce_chunk_rows = 16;  // the head's gradient adds up over 8 loss chunks a micro-batch
  const std::vector<ParamError> errors = measure_grad_error(c);
  ASSERT_FALSE(errors.empty());
  std::vector<double> narrow, wide;
  for (const ParamError& e : errors) {
    narrow.push_back(e.model_accum);
    wide.push_back(e.f32_accum);
    const bool many_adds =
        e.name.find("embed_tokens") != std::string::npos || e.name.find("lm_head") != std::string::npos;
    if (many_adds) {
      EXPECT_LT(e.f32_accum, 0.5 * e.model_accum)
          << e.name << ": f32 accumulation " << e.f32_accum << ", bf16 " << e.model_accum;
    }
  }
  EXPECT_LT(median_of(wide), median_of(narrow));
}

// The gradients themselves are f32 tensors for 16-bit parameters, and only for those.
TEST(GradAccum, SixteenBitParametersKeepF32Gradients) {
  models::Llava m(models::preset("tiny"), Device::cpu(), DType::BF16, DType::F32);
  m.params().accumulate_grads_in(DType::F32);
  m.set_trainable({.vision = true, .projector = true, .llm = true});
  int sixteen = 0, wide = 0;
  for (const auto& p : m.params().all()) {
    EXPECT_EQ(p->grad_dtype, DType::F32) << p->name;
    EXPECT_EQ(p->ensure_grad().dtype(), DType::F32) << p->name;
    (p->dtype == DType::BF16 ? sixteen : wide)++;
  }
  EXPECT_GT(sixteen, 0);
  EXPECT_GT(wide, 0) << "memory.vision_precision fp32 keeps the tower in f32";
}

// A linear layer's weight and bias gradients and an RMS norm's weight gradient, with no gradient yet (a step's first
// backward, after zero_grad released them): the backward writes them into new buffers that are not zero-filled,
// here ones that held NaN just before, and gets exactly what a backward into fresh tensors gives; a second backward
// adds the same again.
TEST(GradAccum, TheFirstBackwardWritesGradientsOverWhateverTheirBuffersHeld) {
  const Device cpu = Device::cpu();
  ParamStore store(cpu, DType::F32);
  ParamStore::GroupScope in(store, store.add_group("block", GroupKind::DecoderLayer));
  const models::Linear lin = models::Linear::make(store, "block.proj", 8, 6, Bias::Yes);
  const models::RMSNorm norm = models::RMSNorm::make(store, "block.norm", 8, 1e-6f);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto random = [&](const Shape& shape) {
    std::vector<float> v(std::size_t(shape_numel(shape)));
    for (float& x : v) x = nd(rng);
    return Tensor::from_floats(v, shape, DType::F32, cpu);
  };
  for (const auto& p : store.all()) copy_(p->data, random(p->shape));
  const Tensor x = random({5, 8}), dy = random({5, 6}), dn = random({5, 8});
  const LinearGrads want = linear_backward(dy, x, lin.weight->data, Bias::Yes);
  const NormOut nf = rmsnorm_forward(x, norm.weight->data, 1e-6f);
  NormBackwardOptions no;
  const NormGrads want_norm = rmsnorm_backward(dn, x, norm.weight->data, nf.saved, no);

  // Blocks of the gradients' sizes full of NaN, freed together: the caching allocator hands them out again.
  std::set<void*> poisoned;
  {
    std::vector<Tensor> nan;
    for (const auto& p : store.all()) {
      nan.push_back(Tensor::full(p->shape, std::numeric_limits<float>::quiet_NaN(), DType::F32, cpu));
      poisoned.insert(nan.back().data_ptr());
    }
  }
  lin.backward(dy, x);
  norm.backward(dn, x, nf.saved);
  for (const auto& p : store.all()) {
    ASSERT_TRUE(p->grad.defined()) << p->name;
    EXPECT_TRUE(poisoned.count(p->grad.data_ptr())) << p->name << ": not in a NaN block (the allocator chose another)";
  }
  // Exactly, but for the norm's second backward: it adds its row-chunk partials onto the gradient one by one.
  auto expect_times = [](const Tensor& got, const Tensor& one, float times, const std::string& what) {
    const std::vector<float> g = got.to_floats(), o = one.to_floats();
    ASSERT_EQ(g.size(), o.size()) << what;
    const bool exact = times == 1.f || what.find("norm") == std::string::npos;
    for (std::size_t i = 0; i < g.size(); ++i) {
      if (exact) {
        ASSERT_EQ(g[i], times * o[i]) << what << "[" << i << "]";
      } else {
        ASSERT_NEAR(g[i], times * o[i], 1e-5f * std::fabs(times * o[i])) << what << "[" << i << "]";
      }
    }
  };
  expect_times(lin.weight->grad, want.dw, 1.f, "weight gradient");
  expect_times(lin.bias->grad, want.dbias, 1.f, "bias gradient");
  expect_times(norm.weight->grad, want_norm.dweight, 1.f, "norm weight gradient");
  lin.backward(dy, x);
  norm.backward(dn, x, nf.saved);
  expect_times(lin.weight->grad, want.dw, 2.f, "weight gradient after two backwards");
  expect_times(lin.bias->grad, want.dbias, 2.f, "bias gradient after two backwards");
  expect_times(norm.weight->grad, want_norm.dweight, 2.f, "norm weight gradient after two backwards");
}
