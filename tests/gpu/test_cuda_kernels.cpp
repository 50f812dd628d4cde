// What the op table (test_ops_cuda) does not cover of the CUDA kernels (label gpu): the optimizer updates against
// their CPU twins over several steps (f32, and bf16 parameters with f32 masters; 8-bit AdamW's codes and scales),
// reductions over arrays larger than one pass of the fixed grid, bit-for-bit repeatability of the kernels that sum
// (attention backward, norm weight gradients, embedding backward, global norm), bad ids and labels refused by position,
// cuDNN's fused attention against the own kernel in both directions, and the packed element-wise kernels against
// their element-by-element path. Skipped where no GPU is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>

#include "core/backend/cuda/attention_path.h"
#include "core/backend/cuda/cudnn_attention.h"
#include "core/backend/device_info.h"
#include "core/ops/attention.h"
#include "core/ops/copy.h"
#include "core/ops/elementwise.h"
#include "core/ops/embedding.h"
#include "core/ops/norm.h"
#include "core/ops/optimizer.h"
#include "core/ops/reduce.h"
#include "core/ops/softmax.h"

using namespace hr;
using namespace hr::core;

namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::vector<float> randoms(std::size_t n, uint64_t seed, float scale = 1.f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (float& e : v) e = d(rng);
  return v;
}

Tensor on(const std::vector<float>& v, const Shape& s, DType t, Device d) {
  return Tensor::from_floats(v, s, t, d);
}
std::vector<float> host(const Tensor& t) {
  return t.to(Device::cpu()).to_floats();
}

void expect_close(const std::vector<float>& a, const std::vector<float>& b, double rel, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double worst = 0, scale = 1e-12;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::fabs(double(a[i]) - b[i])), scale = std::max(scale, std::fabs(double(b[i])));
  EXPECT_LE(worst, rel * scale) << what;
}

// One optimizer, three steps on the CPU and on cuda:0 from the same start: parameters (and masters) agree.
template <typename Step>
void same_on_both(DType param_dtype, const Shape& shape, Step&& step, const std::string& what) {
  const int64_t n = shape_numel(shape);
  const bool master = param_dtype != DType::F32;
  std::vector<std::vector<float>> result;
  for (Device dev : {Device::cpu(), Device::cuda()}) {
    const std::vector<float> w0 = randoms(std::size_t(n), 1, 0.1f);
    Tensor p = on(w0, shape, param_dtype, dev);
    Tensor m = master ? on(host(p.to(Device::cpu())), shape, DType::F32, dev) : Tensor();
    Tensor s1 = Tensor::zeros(shape, DType::F32, dev), s2 = Tensor::zeros(shape, DType::F32, dev);
    for (int k = 1; k <= 3; ++k) step(p, on(randoms(std::size_t(n), 10 + k), shape, param_dtype, dev), m, s1, s2, k);
    result.push_back(host(master ? m : p));
  }
  expect_close(result[1], result[0], 1e-5, what);
}

}  // namespace

TEST(CudaKernels, OptimizerUpdatesMatchTheirCpuTwins) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  for (DType dt : {DType::F32, DType::BF16}) {
    const std::string d = dtype_name(dt);
    same_on_both(
        dt, {37, 129},
        [](const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& s1, const Tensor& s2, int k) {
          AdamWHyper h;
          h.lr = 1e-2f, h.weight_decay = 0.1f, h.step = k, h.grad_scale = 0.5f;
          adamw_update(p, g, m, s1, s2, h);
        },
        "adamw " + d);
    same_on_both(
        dt, {4099},
        [](const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& s1, const Tensor&, int) {
          SgdHyper h;
          h.lr = 0.05f, h.momentum = 0.9f, h.weight_decay = 0.01f, h.nesterov = true;
          sgd_update(p, g, m, s1, h);
        },
        "sgd " + d);
    // Factored (a matrix: row and column moments) and full (a vector) Adafactor.
    same_on_both(
        dt, {65, 300},
        [](const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& s1, const Tensor& s2, int k) {
          AdafactorHyper h;
          h.lr = 1e-2f, h.step = k, h.clip_threshold = 0.5f;
          adafactor_update(p, g, m, s1.view({s1.numel()}).slice(0, 0, 65), s2.view({s2.numel()}).slice(0, 0, 300), h);
        },
        "adafactor factored " + d);
    same_on_both(
        dt, {1000},
        [](const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& s1, const Tensor&, int k) {
          AdafactorHyper h;
          h.step = k;
          adafactor_update(p, g, m, s1, Tensor(), h);
        },
        "adafactor full " + d);
  }
}

// 8-bit AdamW on cuda:0 against the CPU twin, each of three steps from the CPU's state before it: 5,000 elements (a
// partial last block), f32 parameters and bf16 ones with f32 masters. The GPU may contract a multiply-add the CPU
// rounds twice, so a moment within rounding of the midpoint between two map values may take the other: codes one
// value apart, few.
TEST(CudaKernels, AdamW8bitMatchesItsCpuTwin) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const int64_t n = 5000, blocks = adam8bit_blocks(n);
  for (DType dt : {DType::F32, DType::BF16}) {
    const std::string d = dtype_name(dt);
    Tensor p = on(randoms(std::size_t(n), 1, 0.1f), {n}, dt, Device::cpu());
    Tensor master = dt == DType::F32 ? Tensor() : on(host(p), {n}, DType::F32, Device::cpu());
    std::vector<Tensor> st = {
        Tensor::zeros({n}, DType::U8, Device::cpu()), Tensor::zeros({blocks}, DType::F32, Device::cpu()),
        Tensor::zeros({n}, DType::U8, Device::cpu()), Tensor::zeros({blocks}, DType::F32, Device::cpu())};
    for (int k = 1; k <= 3; ++k) {
      AdamWHyper h;
      h.lr = 1e-2f, h.weight_decay = 0.1f, h.step = k, h.grad_scale = 0.5f;
      const Tensor g = on(randoms(std::size_t(n), 10 + k), {n}, dt, Device::cpu());
      Tensor gp = p.to(Device::cuda()), gm = master.defined() ? master.to(Device::cuda()) : Tensor();
      std::vector<Tensor> gs;
      for (const Tensor& t : st) gs.push_back(t.to(Device::cuda()));
      adamw8bit_update(gp, g.to(Device::cuda()), gm, gs[0], gs[1], gs[2], gs[3], h);
      adamw8bit_update(p, g, master, st[0], st[1], st[2], st[3], h);
      expect_close(host(gm.defined() ? gm : gp), host(master.defined() ? master : p), 1e-6,
                   str("adamw8bit weights ", d, " step ", k));
      for (int m : {1, 3})
        expect_close(host(gs[std::size_t(m)]), host(st[std::size_t(m)]), 1e-6, str("absmax ", d, " step ", k));
      int64_t differ = 0;
      for (int m : {0, 2}) {
        const Tensor a = gs[std::size_t(m)].to(Device::cpu());
        const uint8_t *x = a.data<uint8_t>(), *y = st[std::size_t(m)].data<uint8_t>();
        for (int64_t i = 0; i < n; ++i) {
          differ += x[i] != y[i];
          EXPECT_LE(std::abs(int(x[i]) - int(y[i])), 1) << "state" << m / 2 + 1 << " code " << i << " " << d;
        }
      }
      EXPECT_LE(differ, 2 * n / 100) << "codes differing " << d << " step " << k;
    }
  }
}

TEST(CudaKernels, ReductionsOverManyPassesOfTheGridMatchTheCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  // 3M elements: twelve strides of the 256 x 256 first pass, and a ragged end.
  const std::vector<float> v = randoms(3'000'001, 5);
  const Tensor x = on(v, {int64_t(v.size())}, DType::F32, Device::cpu());
  const Tensor norm_cpu = global_norm({x}), norm_gpu = global_norm({x.to(Device::cuda())});
  expect_close(host(norm_gpu), host(norm_cpu), 1e-6, "global_norm");
  const Tensor s_cpu = sum(x), s_gpu = sum(x.to(Device::cuda()));
  EXPECT_NEAR(host(s_gpu)[0], host(s_cpu)[0], 1e-3) << "sum";
}

TEST(CudaKernels, SummingKernelsGiveTheSameBitsEveryRun) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const Device g = Device::cuda();
  const Tensor q = on(randoms(2 * 70 * 8 * 64, 1), {2, 70, 8, 64}, DType::BF16, g);
  const Tensor k = on(randoms(2 * 70 * 2 * 64, 2), {2, 70, 2, 64}, DType::BF16, g);
  const Tensor v = on(randoms(2 * 70 * 2 * 64, 3), {2, 70, 2, 64}, DType::BF16, g);
  const Tensor dout = on(randoms(2 * 70 * 8 * 64, 4), {2, 70, 8, 64}, DType::BF16, g);
  // The own attention kernel (cuDNN's backward accumulates dQ with atomics and is not bit-repeatable).
  cuda::set_cudnn_attention_enabled(false);
  const AttentionOut fwd = attention_forward(q, k, v, Mask::Causal, 0.125f);
  const AttentionGrads a = attention_backward(dout, q, k, v, fwd, Mask::Causal, 0.125f);
  const AttentionGrads b = attention_backward(dout, q, k, v, fwd, Mask::Causal, 0.125f);
  cuda::set_cudnn_attention_enabled(true);
  EXPECT_EQ(host(a.dq), host(b.dq));
  EXPECT_EQ(host(a.dk), host(b.dk));
  EXPECT_EQ(host(a.dv), host(b.dv));

  const Tensor x = on(randoms(300 * 96, 5), {300, 96}, DType::F32, g);
  const Tensor w = on(randoms(96, 6), {96}, DType::F32, g), bias = on(randoms(96, 7), {96}, DType::F32, g);
  const Tensor dy = on(randoms(300 * 96, 8), {300, 96}, DType::F32, g);
  const NormOut n = layernorm_forward(x, w, bias, 1e-5f);
  const NormGrads n1 = layernorm_backward(dy, x, w, Bias::Yes, n.saved),
                  n2 = layernorm_backward(dy, x, w, Bias::Yes, n.saved);
  EXPECT_EQ(host(n1.dweight), host(n2.dweight));
  EXPECT_EQ(host(n1.dbias), host(n2.dbias));

  std::vector<int64_t> idv(500);
  for (std::size_t i = 0; i < idv.size(); ++i) idv[i] = int64_t(i * 7 % 13);  // repeated rows
  const Tensor ids = Tensor::from_ints(idv, {500}, DType::I64, g);
  const Tensor dyt = on(randoms(500 * 32, 9), {500, 32}, DType::F32, g);
  const Tensor e1 = embedding_backward(ids, dyt, {13, 32}, DType::BF16),
               e2 = embedding_backward(ids, dyt, {13, 32}, DType::BF16);
  EXPECT_EQ(host(e1), host(e2));
  // And in the CPU's order: the same bits as the CPU twin, bf16 rounding of every addition included.
  const Tensor e_cpu = embedding_backward(ids.to(Device::cpu()), dyt.to(Device::cpu()), {13, 32}, DType::BF16);
  EXPECT_EQ(host(e1), host(e_cpu));
  // The run walk takes 32 keys at a time: runs of exactly one and two batches, a run that reaches the last key,
  // fewer keys than a batch, and one id over most positions (padding: an f32 table of bf16 gradients, as the bench's),
  // each with the CPU twin's bits.
  std::vector<int64_t> batches;
  for (const auto& [id, count] : {std::pair{3, 32}, {1, 64}, {2, 5}, {0, 33}})
    batches.insert(batches.end(), std::size_t(count), int64_t(id));
  std::vector<int64_t> padded(3000);
  for (std::size_t i = 0; i < padded.size(); ++i) padded[i] = i % 15 < 2 ? int64_t(i * 5 % 13) : 5;
  for (const std::vector<int64_t>& walk : {batches, std::vector<int64_t>{4, 4, 1, 4, 0, 1, 4}, padded})
    for (const auto& [table_t, grad_t] :
         {std::pair{DType::F32, DType::BF16}, {DType::BF16, DType::BF16}, {DType::F32, DType::F32}}) {
      const int64_t n = int64_t(walk.size());
      const Tensor wid = Tensor::from_ints(walk, {n}, DType::I64, g);
      const Tensor wdy = on(randoms(std::size_t(n) * 40, 10), {n, 40}, grad_t, g);
      EXPECT_EQ(host(embedding_backward(wid, wdy, {13, 40}, table_t)),
                host(embedding_backward(wid.to(Device::cpu()), wdy.to(Device::cpu()), {13, 40}, table_t)))
          << n << " ids, table " << dtype_name(table_t) << ", gradients " << dtype_name(grad_t);
    }
}

// The element-wise kernels over packs (one 16-byte access per 8 bf16 or 4 f32: SwiGLU, the activations with and
// without a bias, add_, RoPE from a table) move a pack element by element where a tensor is not 16-byte aligned or ends
// inside the pack: the same values one element into a larger buffer take that path, and give the same bits.
TEST(CudaKernels, PackedKernelsGiveTheBitsOfTheirElementByElementPath) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const Device g = Device::cuda();
  for (DType dt : {DType::F32, DType::BF16}) {
    const std::string name(dtype_name(dt));
    // values at an aligned start, and the same values one element into a buffer (not 16-byte aligned)
    auto twins = [&](const Shape& shape, uint64_t seed) {
      const int64_t n = shape_numel(shape);
      const std::vector<float> v = randoms(std::size_t(n), seed);
      std::vector<float> shifted(std::size_t(n) + 1, 0.f);
      std::copy(v.begin(), v.end(), shifted.begin() + 1);
      const Tensor aligned = on(v, shape, dt, g);
      const Tensor unaligned = on(shifted, {n + 1}, dt, g).slice(0, 1, n + 1).view(shape);
      EXPECT_NE(reinterpret_cast<std::uintptr_t>(unaligned.data_ptr()) % 16, 0u) << name;
      return std::pair{aligned, unaligned};
    };
    const Shape flat{8 * 999 + 3};  // whole packs and a ragged end
    const auto [gate, gate1] = twins(flat, 1);
    const auto [up, up1] = twins(flat, 2);
    const auto [dy, dy1] = twins(flat, 3);
    EXPECT_EQ(host(swiglu_forward(gate, up)), host(swiglu_forward(gate1, up1))) << name << " swiglu";
    const SwigluGrads s = swiglu_backward(gate, up, dy), s1 = swiglu_backward(gate1, up1, dy1);
    EXPECT_EQ(host(s.dgate), host(s1.dgate)) << name << " swiglu dgate";
    EXPECT_EQ(host(s.dup), host(s1.dup)) << name << " swiglu dup";
    for (UnaryOp op : {UnaryOp::Gelu, UnaryOp::GeluTanh, UnaryOp::QuickGelu, UnaryOp::Silu}) {
      EXPECT_EQ(host(unary_forward(op, gate)), host(unary_forward(op, gate1))) << name << " unary " << int(op);
      EXPECT_EQ(host(unary_backward(op, gate, dy)), host(unary_backward(op, gate1, dy1)))
          << name << " unary_backward " << int(op);
    }
    // The bias add inside the activation, 999 columns: packs cross the rows' ends.
    const Shape rows{8, 999};
    const auto [pre, pre1] = twins(rows, 6);
    const auto [bias, bias1] = twins({999}, 7);
    const Tensor biased = unary_forward(UnaryOp::QuickGelu, pre, bias),
                 biased1 = unary_forward(UnaryOp::QuickGelu, pre1, bias1);
    EXPECT_EQ(host(biased), host(biased1)) << name << " unary with a bias";
    EXPECT_EQ(host(pre), host(pre1)) << name << " the bias add's pre-activation";
    const auto [acc, acc1] = twins(flat, 4);
    add_(acc, up, 0.5f);
    add_(acc1, up1, 0.5f);
    EXPECT_EQ(host(acc), host(acc1)) << name << " add_";

    const Shape qs{2, 5, 3, 32};  // a half head dim of 16: two bf16 packs, four f32 ones
    std::vector<int64_t> pos(10);
    for (std::size_t i = 0; i < pos.size(); ++i) pos[i] = int64_t(i * 37 % 11);
    const Tensor table = rope_table(Tensor::from_ints(pos, {2, 5}, DType::I64, g), 32, 10000.f);
    const auto [q, q1] = twins(qs, 5);
    EXPECT_EQ(host(rope_forward(q, table)), host(rope_forward(q1, table))) << name << " rope";
    EXPECT_EQ(host(rope_backward(q, table)), host(rope_backward(q1, table))) << name << " rope_backward";
    // and from the same table, the CPU twin's bits (its products and sums are rounded one by one too)
    const Tensor table_cpu = table.to(Device::cpu());
    EXPECT_EQ(host(rope_forward(q, table)), host(rope_forward(q.to(Device::cpu()), table_cpu))) << name << " rope, cpu";
    EXPECT_EQ(host(rope_backward(q, table)), host(rope_backward(q.to(Device::cpu()), table_cpu)))
        << name << " rope_backward, cpu";
  }
}

TEST(CudaKernels, IdsOutsideTheVocabularyAreRefusedByPosition) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const Device g = Device::cuda();
  const Tensor table = Tensor::zeros({10, 4}, DType::F32, g);
  const Tensor ids = Tensor::from_ints({1, 2, 3, 12, 4, 11}, {6}, DType::I64, g);
  try {
    embedding_forward(ids, table);
    FAIL() << "an id of 12 in a vocabulary of 10 went through";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("id 12 at position 3"), std::string::npos) << m;
  }
}

// The shapes cuDNN admits take its fused attention on the GPU (the sizing query says so), and give what the own
// kernel gives: output, log-sum-exp, and gradients, also when the backward is not the forward's kernel.
TEST(CudaKernels, CudnnFusedAttentionMatchesTheOwnKernelBothWays) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  cuda_memory_after_start(0);  // the library handles, which register cuDNN's sizing query
  struct Case {
    int64_t b, lq, lkv, hq, hkv, d;
    Mask mask;
    DType t;
  };
  const Device g = Device::cuda();
  for (const Case c :
       {Case{2, 64, 64, 8, 8, 64, Mask::Causal, DType::BF16}, Case{2, 70, 70, 8, 2, 64, Mask::Causal, DType::BF16},
        Case{1, 33, 80, 4, 4, 128, Mask::Causal, DType::F16}, Case{2, 48, 48, 4, 2, 32, Mask::None, DType::BF16}}) {
    const std::string what = str(c.b, "x", c.lq, "x", c.lkv, " heads ", c.hq, "/", c.hkv, " dim ", c.d,
                                 c.mask == Mask::Causal ? " causal " : " ", dtype_name(c.t));
    const float scale = 1.f / std::sqrt(float(c.d));
    const Tensor q = on(randoms(std::size_t(c.b * c.lq * c.hq * c.d), 1), {c.b, c.lq, c.hq, c.d}, c.t, g);
    const Tensor k = on(randoms(std::size_t(c.b * c.lkv * c.hkv * c.d), 2), {c.b, c.lkv, c.hkv, c.d}, c.t, g);
    const Tensor v = on(randoms(std::size_t(c.b * c.lkv * c.hkv * c.d), 3), {c.b, c.lkv, c.hkv, c.d}, c.t, g);
    const Tensor dout = on(randoms(std::size_t(c.b * c.lq * c.hq * c.d), 4), {c.b, c.lq, c.hq, c.d}, c.t, g);
    AttentionDesc d;
    d.batch = c.b, d.q_len = c.lq, d.kv_len = c.lkv, d.q_heads = c.hq, d.kv_heads = c.hkv, d.head_dim = c.d;
    d.dtype = c.t, d.mask = c.mask;
    ASSERT_TRUE(cudnn_attention_admits(d, AttentionPass::Forward)) << what;
    CudnnAttentionQuery query = cudnn_attention_query();
    ASSERT_NE(query, nullptr) << "no cuDNN sizing query registered";
    std::size_t ws = 0;
    EXPECT_TRUE(query(d, AttentionPass::Forward, &ws)) << "cuDNN does not take the forward of " << what;
    EXPECT_TRUE(query(d, AttentionPass::Backward, &ws)) << "cuDNN does not take the backward of " << what;

    cuda::set_cudnn_attention_enabled(true);
    const AttentionOut fc = attention_forward(q, k, v, c.mask, scale);
    const AttentionGrads gc = attention_backward(dout, q, k, v, fc, c.mask, scale);
    cuda::set_cudnn_attention_enabled(false);
    const AttentionOut fo = attention_forward(q, k, v, c.mask, scale);
    const AttentionGrads go = attention_backward(dout, q, k, v, fo, c.mask, scale);
    const AttentionGrads mixed = attention_backward(dout, q, k, v, fc, c.mask, scale);  // cuDNN's forward, own backward
    cuda::set_cudnn_attention_enabled(true);
    const AttentionGrads mixed2 = attention_backward(dout, q, k, v, fo, c.mask, scale);  // and the other way

    expect_close(host(fc.out), host(fo.out), 2e-2, what + " out");
    expect_close(host(fc.lse), host(fo.lse), 1e-3, what + " lse");
    for (const auto* grads : {&gc, &mixed, &mixed2}) {
      expect_close(host(grads->dq), host(go.dq), 3e-2, what + " dq");
      expect_close(host(grads->dk), host(go.dk), 3e-2, what + " dk");
      expect_close(host(grads->dv), host(go.dv), 3e-2, what + " dv");
    }
  }
}

// A cuDNN that cannot start (cudnnCreate fails: a library that does not match the driver or the GPU) leaves the
// fused path off with one warning, and every attention runs the own kernels; started again, cuDNN takes its shapes.
TEST(CudaKernels, ACudnnThatCannotStartLeavesAttentionToTheOwnKernels) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  cuda_memory_after_start(0);
  const Device g = Device::cuda();
  const Tensor q = on(randoms(2 * 64 * 4 * 64, 1), {2, 64, 4, 64}, DType::BF16, g);
  const Tensor kv = on(randoms(2 * 64 * 2 * 64, 2), {2, 64, 2, 64}, DType::BF16, g);
  cuda::stop_cudnn();
  testing::internal::CaptureStderr();
  EXPECT_FALSE(cuda::start_cudnn([](void**, std::string* why) {
    *why = "CUDNN_STATUS_NOT_INITIALIZED (simulated)";
    return false;
  }));
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("fused attention is off"), std::string::npos) << err;
  EXPECT_EQ(cudnn_attention_query(), nullptr);
  const AttentionOut own = attention_forward(q, kv, kv, Mask::Causal, 0.125f);
  EXPECT_EQ(last_attention_kernel(), AttentionKernel::Tiled);
  cuda::create_cudnn_handle();
  ASSERT_NE(cudnn_attention_query(), nullptr) << "cuDNN did not start again";
  const AttentionOut fused = attention_forward(q, kv, kv, Mask::Causal, 0.125f);
  EXPECT_EQ(last_attention_kernel(), AttentionKernel::Cudnn);
  expect_close(host(fused.out), host(own.out), 2e-2, "fused against own");
}

// Copies between host memory and a GPU that cast or follow strides (weights loaded in another dtype, f32 host
// masters of bf16 GPU parameters, transposed views): the cast and the strides are done in host memory (or, for a
// strided GPU side, on the GPU) and the bytes move as they are.
TEST(CudaKernels, CopiesBetweenHostAndGpuCastAndFollowStrides) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const std::vector<float> v = randoms(6 * 5, 7);
  const Tensor h32 = on(v, {6, 5}, DType::F32, Device::cpu());
  const std::vector<float> rounded = host(h32.to(DType::BF16));
  // Host f32 into GPU bf16, and back into host f32.
  Tensor g16 = Tensor::empty({6, 5}, DType::BF16, Device::cuda());
  copy_(g16, h32);
  EXPECT_EQ(host(g16), rounded);
  Tensor back = Tensor::empty({6, 5}, DType::F32, Device::host());
  copy_(back, g16);
  EXPECT_EQ(back.to_floats(), rounded);
  // A transposed host view into a contiguous GPU tensor, and a transposed GPU view into a contiguous host tensor.
  Tensor gt = Tensor::empty({5, 6}, DType::F32, Device::cuda());
  copy_(gt, h32.transpose(0, 1));
  EXPECT_EQ(host(gt), host(h32.transpose(0, 1).contiguous()));
  Tensor ht = Tensor::empty({6, 5}, DType::F32, Device::cpu());
  copy_(ht, gt.transpose(0, 1));
  EXPECT_EQ(ht.to_floats(), v);
  // Into a strided GPU view, with a cast.
  Tensor g2 = Tensor::zeros({5, 6}, DType::BF16, Device::cuda());
  copy_(g2.transpose(0, 1), h32);
  EXPECT_EQ(host(g2.transpose(0, 1).contiguous()), rounded);
  // Integer views on the GPU (ids, labels, quantized blobs) copy strided too.
  std::vector<int64_t> n(30);
  for (int64_t i = 0; i < 30; ++i) n[std::size_t(i)] = i * 7 - 50;
  const Tensor ids = Tensor::from_ints(n, {6, 5}, DType::I64, Device::cuda());
  EXPECT_EQ(ids.transpose(0, 1).contiguous().to(Device::cpu()).to_ints(),
            Tensor::from_ints(n, {6, 5}, DType::I64, Device::cpu()).transpose(0, 1).contiguous().to_ints());
}
