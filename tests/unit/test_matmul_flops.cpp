// core::matmul_flops: what the GEMMs and the attention ran, counted where they launch (the trainer logs each step's
// share as `flops`, and `headroom bench` divides it by the step time).
#include <gtest/gtest.h>

#include <array>
#include <tuple>

#include "core/ops/attention.h"
#include "core/ops/dispatch.h"
#include "core/ops/linear.h"

using namespace hr;
using namespace hr::core;

namespace {
// What `fn` adds to the counter.
template <typename Fn>
double counted(Fn&& fn) {
  const double before = matmul_flops();
  fn();
  return matmul_flops() - before;
}

Tensor filled(const Shape& s, Device dev) {
  return Tensor::full(s, 0.25f, DType::F32, dev);
}
}  // namespace

TEST(MatmulFlops, AGemmCountsTwoFlopsAMultiplyAdd) {
  const int64_t m = 5, n = 7, k = 3;
  for (int64_t batch : {1, 3}) {
    const Tensor a = filled({batch, m, k}, Device::cpu()), b = filled({batch, k, n}, Device::cpu()),
                 c = Tensor::empty({batch, m, n}, DType::F32, Device::cpu());
    EXPECT_EQ(counted([&] { gemm(a, b, c); }), 2.0 * double(batch * m * n * k)) << "batch " << batch;
  }
  // A part of a larger product counts its own size.
  const Tensor a = filled({1, 8, 4}, Device::cpu()), b = filled({1, 4, 6}, Device::cpu()),
               c = Tensor::empty({1, 8, 6}, DType::F32, Device::cpu());
  EXPECT_EQ(counted([&] { gemm_within({a.slice(1, 0, 3), b, c.slice(1, 0, 3)}, {a, b, c}); }), 2.0 * 3 * 6 * 4);
  // The meta device computes nothing and counts nothing.
  const Tensor am = filled({1, m, k}, Device::meta()), bm = filled({1, k, n}, Device::meta()),
               cm = Tensor::empty({1, m, n}, DType::F32, Device::meta());
  EXPECT_EQ(counted([&] { gemm(am, bm, cm); }), 0.0);
}

TEST(MatmulFlops, AttentionCountsThePairsItsMaskLetsThrough) {
  const int64_t B = 2, Hq = 4, Hkv = 2, D = 8;
  const double per_pair = 4.0 * D * B * Hq;  // S = QK^T and PV, each head of each row
  auto qkv = [&](int64_t lq, int64_t lkv, Device dev) {
    return std::array<Tensor, 3>{filled({B, lq, Hq, D}, dev), filled({B, lkv, Hkv, D}, dev),
                                 filled({B, lkv, Hkv, D}, dev)};
  };
  auto both = [&](int64_t lq, int64_t lkv, Mask mask, int64_t window, Device dev) {
    const auto [q, k, v] = qkv(lq, lkv, dev);
    AttentionOut o;
    const double f = counted([&] { o = attention_forward(q, k, v, mask, 0.5f, window); });
    const Tensor dout = filled({B, lq, Hq, D}, dev);
    const double b = counted([&] { attention_backward(dout, q, k, v, o, mask, 0.5f, window); });
    return std::pair{f, b};
  };
  // No mask: every query sees every key.
  auto [f, b] = both(5, 7, Mask::None, 0, Device::cpu());
  EXPECT_EQ(f, per_pair * 5 * 7);
  EXPECT_EQ(b, 2.5 * f);
  // Causal, six queries over six keys: 1 + 2 + ... + 6 pairs.
  std::tie(f, b) = both(6, 6, Mask::Causal, 0, Device::cpu());
  EXPECT_EQ(f, per_pair * 21);
  EXPECT_EQ(b, 2.5 * f);
  // Causal, the two queries at the end of five keys: positions 3 and 4 see 4 and 5 keys.
  std::tie(f, b) = both(2, 5, Mask::Causal, 0, Device::cpu());
  EXPECT_EQ(f, per_pair * 9);
  // A window of 3 over six positions: 1 + 2 + 3 + 3 + 3 + 3.
  std::tie(f, b) = both(6, 6, Mask::Causal, 3, Device::cpu());
  EXPECT_EQ(f, per_pair * 15);
  // A window no shorter than the keys is plain causal attention.
  std::tie(f, b) = both(6, 6, Mask::Causal, 6, Device::cpu());
  EXPECT_EQ(f, per_pair * 21);
  // Meta counts nothing.
  std::tie(f, b) = both(6, 6, Mask::Causal, 0, Device::meta());
  EXPECT_EQ(f, 0.0);
  EXPECT_EQ(b, 0.0);
}

TEST(MatmulFlops, PackedAttentionCountsEachSequence) {
  const int64_t H = 2, D = 4;
  // Sequences of 4 and 3 positions; the first keeps its last 2 queries (positions 2 and 3: 3 + 4 pairs), the
  // second all 3 (1 + 2 + 3).
  const std::vector<int64_t> lengths{4, 3}, queries{2, 3};
  const Tensor q = filled({1, 5, H, D}, Device::cpu()), k = filled({1, 7, H, D}, Device::cpu()),
               v = filled({1, 7, H, D}, Device::cpu()), dout = filled({1, 5, H, D}, Device::cpu());
  AttentionOut o;
  const double f = counted([&] { o = attention_forward_packed(q, k, v, lengths, Mask::Causal, 0.5f, 0, queries); });
  EXPECT_EQ(f, 4.0 * D * H * 13);
  const double b =
      counted([&] { attention_backward_packed(dout, q, k, v, o, lengths, Mask::Causal, 0.5f, 0, queries); });
  EXPECT_EQ(b, 2.5 * f);
}
