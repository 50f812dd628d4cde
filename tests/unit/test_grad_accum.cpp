// memory.grad_accum_dtype: a bf16 model's gradients accumulated in f32 (DeepSpeed's grad_accum_dtype, what PyTorch's
// autocast keeps) stay closer to an f32 model's than gradients accumulated in bf16, where many adds land in one
// element (the embedding table, the output projection across loss chunks, every weight across micro-batches).
#include <gtest/gtest.h>

#include "core/parameters.h"
#include "grad_error.h"
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
