// Parity with an independent PyTorch implementation (scripts/make_golden.py): loss, logits and every
// parameter gradient, in f32 and bf16, for select_layer -1/-2, GQA/MHA, one/two images per sample, a
// text-only sample, stage-1 freezing, and LLaVA-OneVision-0.5B's shape (SigLIP tower, Qwen2 decoder with q/k/v
// biases and tied embeddings).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "core/memory/device_memory.h"
#include "golden_util.h"
#include "models/model_spec.h"
#include "models/weights.h"

using namespace hr;
using namespace hr::core;
using namespace hr::models;
using hr::test::golden;

namespace {

class Golden : public testing::TestWithParam<std::tuple<std::string, DType>> {};

// f32: element-wise |got - want| <= 1e-5 + 1e-4 |want| (the values are O(0.01..1)).
void check_f32(const std::string& name, const Tensor& got, const Tensor& want) {
  ASSERT_TRUE(got.defined()) << name << " was not produced";
  ASSERT_EQ(got.shape(), want.shape()) << name;
  test::Mismatch m = test::compare(got.to_floats(), want.to_floats(), 1e-4, 1e-5);
  EXPECT_LE(m.worst, 1.0) << name << ": worst element " << m.at << " is " << m.got << ", PyTorch has " << m.want;
}

double norm_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(s);
}

// bf16: both implementations round activations and gradients to 8 mantissa bits, in different places, so
// element-wise agreement is not expected. Measured against PyTorch's f32 result, headroom's bf16 error must
// be at most twice PyTorch's own bf16 error, or below 3% of the tensor's norm, or below 1e-4 per element
// (gradients that are exactly zero in exact arithmetic, like attention key biases, are pure rounding noise).
void check_bf16(const std::string& name, const Tensor& got, const Tensor& want_bf16, const Tensor& want_f32) {
  ASSERT_TRUE(got.defined()) << name << " was not produced";
  ASSERT_EQ(got.shape(), want_f32.shape()) << name;
  std::vector<float> g = got.to_floats(), pb = want_bf16.to_floats(), pf = want_f32.to_floats();
  const std::vector<float> zero(pf.size(), 0.f);
  const double ours = norm_diff(g, pf), theirs = norm_diff(pb, pf), scale = norm_diff(pf, zero);
  const double bound = std::max({2.0 * theirs, 0.03 * scale, 1e-4 * std::sqrt(double(pf.size()))});
  EXPECT_LE(ours, bound) << name << ": |headroom bf16 - f32| = " << ours << ", |PyTorch bf16 - f32| = " << theirs
                         << ", |f32| = " << scale;
}

// The golden case's model (its weights, fused kernels as `kernels`) through forward and backward with `opt`: the
// loss, the logits when opt asks for them, then every parameter gradient. `after_forward` sees the pass's state.
std::vector<std::vector<float>> loss_and_grads(const ModelSpec& spec, const Checkpoint& weights, DType dt,
                                               FusedKernels kernels, const Batch& batch, const ModelOptions& opt,
                                               const std::function<void(const LlavaState&)>& after_forward = {}) {
  LlavaConfig cfg = spec.config;
  cfg.llm.kernels = cfg.vision.kernels = kernels;
  Llava model(cfg, Device::cpu(), dt);
  model.set_trainable({.vision = !spec.freeze_vision, .projector = !spec.freeze_projector, .llm = !spec.freeze_llm});
  load_weights(model.params(), weights);
  LlavaState st;
  std::vector<std::vector<float>> out{{model.forward(batch, st, opt)}};
  if (opt.return_logits) out.push_back(st.logits.to_floats());
  if (after_forward) after_forward(st);
  model.backward(st);
  for (const auto& p : model.params().all())
    if (p->grad.defined()) out.push_back(p->grad.to_floats());
  return out;
}

}  // namespace

TEST_P(Golden, LossLogitsAndEveryGradientMatchPyTorch) {
  const std::string cs = std::get<0>(GetParam());
  const DType dt = std::get<1>(GetParam());
  ModelSpec spec = load_model_spec(golden(cs + ".yaml"));
  Llava model(spec.config, Device::cpu(), dt);
  model.set_trainable({.vision = !spec.freeze_vision, .projector = !spec.freeze_projector, .llm = !spec.freeze_llm});
  load_weights(model.params(), Checkpoint::open(golden(test::first_line(golden(cs + ".weights")))));
  Batch batch = test::load_batch(golden(cs + "_batch.safetensors"));
  ModelOptions opt;
  opt.return_logits = true;
  opt.ce_chunk_rows = 7;  // several chunks, the last one partial
  LlavaState st;
  const float loss = model.forward(batch, st, opt);
  model.backward(st);

  SafetensorsFile ref = SafetensorsFile::open(golden(cs + "_" + dtype_name(dt) + ".safetensors"));
  SafetensorsFile ref32 = SafetensorsFile::open(golden(cs + "_f32.safetensors"));
  auto check = [&](const std::string& name, const Tensor& got) {
    if (dt == DType::F32)
      check_f32(name, got, ref.get(name));
    else
      check_bf16(name, got, ref.get(name), ref32.get(name));
  };
  const float want_loss = ref.get("loss").item();
  EXPECT_NEAR(loss, want_loss, dt == DType::F32 ? 1e-5 * std::fabs(want_loss) : 1e-2 * std::fabs(want_loss));
  check("logits", st.logits);
  int grads = 0;
  for (const auto& p : model.params().all()) {
    const std::string key = "grad." + p->name;
    if (!ref.contains(key)) {
      EXPECT_FALSE(p->trainable) << p->name << " is trainable but PyTorch has no gradient for it";
      EXPECT_FALSE(p->grad.defined()) << p->name << " is frozen yet holds a gradient buffer";
      continue;
    }
    ++grads;
    // Parameters that influence nothing (layers past select_layer, post_layernorm) may have no buffer.
    check(key, p->grad.defined() ? p->grad : Tensor::zeros(p->data.shape(), dt, Device::cpu()));
  }
  int want_grads = 0;
  for (const std::string& n : ref.names()) want_grads += n.rfind("grad.", 0) == 0;
  EXPECT_EQ(grads, want_grads);
}

// model.fused_kernels: auto (RoPE rotating by a table made once a step, the residual adds inside the norms after
// them, the tower's and the projector's bias adds inside their activations) computes exactly what off computes, with
// every checkpoint policy (what recompute finds kept differs): the loss, the logits and every gradient agree bit for
// bit, in f32 and bf16.
TEST_P(Golden, FusedKernelsChangeNoBit) {
  const std::string cs = std::get<0>(GetParam());
  const DType dt = std::get<1>(GetParam());
  const ModelSpec spec = load_model_spec(golden(cs + ".yaml"));
  const Batch batch = test::load_batch(golden(cs + "_batch.safetensors"));
  const Checkpoint weights = Checkpoint::open(golden(test::first_line(golden(cs + ".weights"))));
  auto run = [&](FusedKernels kernels, CheckpointKind kind) {
    ModelOptions opt;
    opt.return_logits = true;
    opt.vision_policy.kind = opt.llm_policy.kind = kind;
    return loss_and_grads(spec, weights, dt, kernels, batch, opt);
  };
  for (CheckpointKind kind : {CheckpointKind::None, CheckpointKind::Selective, CheckpointKind::Full}) {
    const auto fused = run(FusedKernels::Auto, kind), unfused = run(FusedKernels::Off, kind);
    ASSERT_EQ(fused.size(), unfused.size());
    for (std::size_t i = 0; i < fused.size(); ++i)
      EXPECT_TRUE(fused[i] == unfused[i])
          << "policy " << int(kind) << ": output " << i << " (0 the loss, 1 the logits, then the gradients) differs";
  }
}

// Padding-free training passes (ModelOptions::padding_free): with each row's positions after its last labelled
// token dropped (rows of several lengths and one of none), the LLM runs the rest packed, and where the loss reads only
// the ends of its sequences the last layer runs just those rows past its keys and values; the loss and every gradient
// are those of the whole batch: f32 within summation order (the weight gradients add fewer zero rows), bf16 as close
// to the f32 whole batch's as the bf16 whole batch's is (as against PyTorch above). With every checkpoint policy,
// fused kernels and not.
TEST_P(Golden, PaddingFreeGivesTheLossAndGradientsOfTheWholeBatch) {
  const std::string cs = std::get<0>(GetParam());
  const DType dt = std::get<1>(GetParam());
  const ModelSpec spec = load_model_spec(golden(cs + ".yaml"));
  // Three rows from the golden two: row 0 cut short (below), row 1 without any label, row 1 again whole (with its
  // images), so that a labelled row follows a shorter one and one of none in the packed rows.
  Batch whole_rows = test::load_batch(golden(cs + "_batch.safetensors"));
  const int64_t L = whole_rows.seq;
  ASSERT_EQ(whole_rows.batch, 2);
  for (auto* v : {&whole_rows.input_ids, &whole_rows.labels}) {
    const std::vector<int64_t> row1(v->begin() + L, v->begin() + 2 * L);
    v->insert(v->end(), row1.begin(), row1.end());
  }
  std::fill(whole_rows.labels.begin() + L, whole_rows.labels.begin() + 2 * L, -100);
  whole_rows.batch = 3;
  const int64_t row1_images =
      std::count(whole_rows.input_ids.begin() + L, whole_rows.input_ids.begin() + 2 * L, spec.config.image_token_id) /
      spec.config.vision.tokens_per_image();
  if (row1_images > 0) {
    std::vector<float> pixels = whole_rows.pixel_values.to_floats();
    const std::size_t image = pixels.size() / std::size_t(whole_rows.pixel_values.size(0));
    const std::vector<float> last(pixels.end() - std::ptrdiff_t(image * std::size_t(row1_images)), pixels.end());
    pixels.insert(pixels.end(), last.begin(), last.end());
    Shape shape = whole_rows.pixel_values.shape();
    shape[0] += row1_images;
    whole_rows.pixel_values = Tensor::from_floats(pixels, shape, DType::F32, Device::cpu());
  }
  // Row 0 without its last 3 labels; or with one label only, at position 2, so that it keeps 3 positions and its
  // image placeholders run past them (their projected tokens then get no gradient).
  Batch tail = whole_rows, short_row = whole_rows;
  for (int64_t t = L, taken = 0; t-- > 0 && taken < 3;)
    if (tail.labels[std::size_t(t)] != -100) tail.labels[std::size_t(t)] = -100, ++taken;
  std::fill(short_row.labels.begin(), short_row.labels.begin() + L, -100);
  short_row.labels[2] = 1;
  // Answers at the ends only: rows 0 and 2 keep their last 2 labels (each still packed short of its end where it
  // was), so the last layer runs 3 rows of each; and the same with every row labelled at its end, which packs
  // nothing (row 1 gets that one label): the last layer runs 3, 2 and 3 rows of the whole batch.
  Batch ends = tail;
  for (int64_t r : {int64_t(0), int64_t(2)})
    for (int64_t t = L, kept = 0; t-- > 0;)
      if (ends.labels[std::size_t(r * L + t)] != -100 && kept++ >= 2) ends.labels[std::size_t(r * L + t)] = -100;
  Batch ends_whole = whole_rows;
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t t = 0; t < L; ++t)
      ends_whole.labels[std::size_t(r * L + t)] = t == L - 1 || (t == L - 2 && r != 1) ? 1 : -100;
  struct Case {
    const Batch* batch;
    const char* what;
    bool packs;
    int trims;  // 1: the last layer runs fewer rows; 0: all; -1: whichever the batch makes
  };
  const Case cases[] = {{&tail, "row 0 without its last labels", true, -1},
                        {&short_row, "row 0 cut inside its image", true, -1},
                        {&ends, "answers at the ends", true, 1},
                        {&ends_whole, "answers at the ends of whole rows", false, 1}};
  const Checkpoint weights = Checkpoint::open(golden(test::first_line(golden(cs + ".weights"))));
  auto run = [&](const Case& c, bool padding_free, FusedKernels kernels, CheckpointKind kind, DType type) {
    ModelOptions opt;
    opt.padding_free = padding_free;
    opt.vision_policy.kind = opt.llm_policy.kind = kind;
    return loss_and_grads(spec, weights, type, kernels, *c.batch, opt, [&](const LlavaState& st) {
      EXPECT_EQ(st.packed.empty(), !(padding_free && c.packs)) << (st.packed.empty() ? "did not pack" : "packed");
      if (!padding_free || c.trims >= 0) {
        EXPECT_EQ(st.tails.empty(), !(padding_free && c.trims == 1)) << (st.tails.empty() ? "did not trim" : "trimmed");
      }
    });
  };
  for (const Case& c : cases)
    for (FusedKernels kernels : {FusedKernels::Auto, FusedKernels::Off})
      for (CheckpointKind kind : {CheckpointKind::None, CheckpointKind::Selective, CheckpointKind::Full}) {
        SCOPED_TRACE(
            str(c.what, ", fused kernels ", kernels == FusedKernels::Auto ? "on" : "off", ", policy ", int(kind)));
        const auto packed = run(c, true, kernels, kind, dt), whole = run(c, false, kernels, kind, dt);
        const auto truth = dt == DType::F32 ? whole : run(c, false, kernels, kind, DType::F32);
        ASSERT_EQ(packed.size(), whole.size());
        // bf16's floor: 0.1% of the largest gradient. A gradient zero in exact arithmetic (a key bias's: softmax
        // ignores a shift of every key) is rounding noise in both runs, in no particular ratio.
        double largest = 0;
        for (std::size_t i = 1; i < truth.size(); ++i)
          largest = std::max(largest, norm_diff(truth[i], std::vector<float>(truth[i].size(), 0.f)));
        for (std::size_t i = 0; i < packed.size(); ++i) {
          if (dt == DType::F32) {
            const test::Mismatch m = test::compare(packed[i], whole[i], 1e-4, 1e-6);
            EXPECT_LE(m.worst, 1.0) << "output " << i << " (0 the loss, then the gradients): element " << m.at << " is "
                                    << m.got << " packed, " << m.want << " whole";
          } else {
            const std::vector<float> zero(whole[i].size(), 0.f);
            const double ours = norm_diff(packed[i], truth[i]), whole_bf16 = norm_diff(whole[i], truth[i]);
            const double bound = std::max({2.0 * whole_bf16, 0.03 * norm_diff(truth[i], zero),
                                           1e-4 * std::sqrt(double(truth[i].size())), 1e-3 * largest});
            EXPECT_LE(ours, bound) << "output " << i
                                   << " (0 the loss, then the gradients): |packed bf16 - f32| = " << ours
                                   << ", |whole bf16 - f32| = " << whole_bf16;
          }
        }
      }
}

INSTANTIATE_TEST_SUITE_P(Cases, Golden,
                         testing::Combine(testing::Values("select_m2_gqa", "select_m1", "mha", "two_images_and_text",
                                                          "siglip_qwen2_tied", "stage1"),
                                          testing::Values(DType::F32, DType::BF16)),
                         [](const auto& p) { return std::get<0>(p.param) + "_" + dtype_name(std::get<1>(p.param)); });

// A label the vocabulary does not hold is named by sequence and position before anything runs: the model checks
// the batch's labels on the host once, so the loss kernels need not (on a GPU, a check there waits for the device
// at every chunk of the loss).
TEST(Llava, ALabelOutsideTheVocabularyIsNamedByItsPosition) {
  ModelSpec spec = load_model_spec(golden("mha.yaml"));
  Llava model(spec.config, Device::cpu(), DType::F32);
  load_weights(model.params(), Checkpoint::open(golden(test::first_line(golden("mha.weights")))));
  Batch batch = test::load_batch(golden("mha_batch.safetensors"));
  const int64_t at = batch.seq - 1;  // the last position of the first sequence
  batch.labels[std::size_t(at)] = spec.config.llm.vocab + 5;
  LlavaState st;
  try {
    model.forward(batch, st, {});
    FAIL() << "the bad label was not refused";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(str("[llava] label ", spec.config.llm.vocab + 5, " of sequence 0 at position ", at,
                         " is outside the vocabulary [0, ", spec.config.llm.vocab, ")")),
              std::string::npos)
        << m;
  }
}

// Only positions whose next token has a label reach the loss: forward packs them, in order, to the front of the
// loss's rows (zeros and ignore_index after them), so the loss's chunks past them run no GEMM. The golden batch
// (answers between prompts, images and padding; chunks of 7 rows) and the same batch with every position labelled
// and with none make the same allocations, in the same order: a step's memory does not depend on its labels.
TEST(Llava, TheLossTakesTheLabelledPositionsFirstAndItsAllocationsDoNotDependOnThem) {
  const ModelSpec spec = load_model_spec(golden("two_images_and_text.yaml"));
  Llava model(spec.config, Device::cpu(), DType::F32);
  load_weights(model.params(), Checkpoint::open(golden(test::first_line(golden("two_images_and_text.weights")))));
  const Batch batch = test::load_batch(golden("two_images_and_text_batch.safetensors"));
  const int64_t B = batch.batch, L = batch.seq, C = spec.config.llm.hidden;
  auto traced = [&](const Batch& b, LlavaState& st) {
    std::vector<std::pair<int, std::size_t>> requests;
    allocator_for(Device::cpu())->set_trace([&](const TraceEvent& e) { requests.emplace_back(int(e.kind), e.size); });
    ModelOptions opt;
    opt.ce_chunk_rows = 7;
    model.forward(b, st, opt);
    const std::vector<int64_t> labels = st.labels_shift.to_ints();
    const std::vector<float> rows = st.hidden_shift.to_floats();
    model.backward(st);
    allocator_for(Device::cpu())->set_trace({});
    return std::tuple{requests, labels, rows};
  };
  {
    LlavaState warm;
    traced(batch, warm);  // the gradients' buffers and the allocator's cache as every later step finds them
  }
  LlavaState st;
  const auto [requests, labels, rows] = traced(batch, st);
  std::vector<int64_t> want;
  for (int64_t r = 0; r < B; ++r)
    for (int64_t t = 1; t < L; ++t)
      if (batch.labels[std::size_t(r * L + t)] != -100) want.push_back(batch.labels[std::size_t(r * L + t)]);
  const int64_t n = int64_t(want.size());
  ASSERT_GT(n, 0);
  ASSERT_LT(n + 14, B * (L - 1)) << "the batch should leave whole chunks without labels";
  EXPECT_EQ(st.valid_labels, n);
  want.resize(std::size_t(B * (L - 1)), -100);
  EXPECT_EQ(labels, want);
  for (std::size_t i = std::size_t(n * C); i < rows.size(); ++i) ASSERT_EQ(rows[i], 0.f) << "row " << i / C;

  Batch every = batch, none = batch;
  for (int64_t& l : every.labels) l = 1;
  for (int64_t& l : none.labels) l = -100;
  LlavaState se, sn;
  EXPECT_EQ(std::get<0>(traced(every, se)), requests) << "every position labelled";
  EXPECT_EQ(std::get<0>(traced(none, sn)), requests) << "no position labelled";
  EXPECT_EQ(se.valid_labels, B * (L - 1));
  EXPECT_EQ(sn.valid_labels, 0);
}
