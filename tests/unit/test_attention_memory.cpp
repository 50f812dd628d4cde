// Fused attention keeps memory O(L): forward+backward peak at L=4096 is about 4x the peak at L=1024.
#include <gtest/gtest.h>

#include <cmath>

#include "core/memory/device_memory.h"
#include "core/ops/attention.h"

using namespace hr;
using namespace hr::core;

namespace {
// Peak bytes allocated by attention forward+backward beyond its inputs, on the given device.
int64_t attention_peak(int64_t L, Device dev) {
  configure_device(dev, {});
  auto alloc = allocator_for(dev);
  const int64_t B = 1, H = 4, D = 32;
  Tensor q = Tensor::zeros({B, L, H, D}, DType::F32, dev), k = Tensor::zeros({B, L, H, D}, DType::F32, dev),
         v = Tensor::zeros({B, L, H, D}, DType::F32, dev), dout = Tensor::zeros({B, L, H, D}, DType::F32, dev);
  alloc->reset_peak_stats();
  const int64_t base = alloc->stats().allocated_bytes.current;
  {
    const float scale = 1.f / std::sqrt(float(D));
    AttentionOut o = attention_forward(q, k, v, Mask::Causal, scale);
    AttentionGrads g = attention_backward(dout, q, k, v, o, Mask::Causal, scale);
  }
  return alloc->stats().allocated_bytes.peak - base;
}
}  // namespace

TEST(AttentionMemory, PeakGrowsLinearlyWithSequenceLength) {
  // Measured on the CPU (real kernels run) and on meta (same allocations); both must be linear.
  for (Device dev : {Device::meta(), Device::cpu()}) {
    const int64_t p1 = attention_peak(1024, dev), p4 = attention_peak(4096, dev);
    const double ratio = double(p4) / double(p1);
    EXPECT_GT(ratio, 3.0) << dev.name();
    EXPECT_LT(ratio, 5.0) << dev.name() << ": " << p1 << " -> " << p4 << " bytes (a quadratic op would be ~16x)";
    std::printf("attention fwd+bwd peak on %s: L=1024 %lld B, L=4096 %lld B, ratio %.2f\n", dev.name().c_str(),
                (long long)p1, (long long)p4, ratio);
  }
}

TEST(AttentionMemory, MatchesExpectationOnLongSequence) {
  // Spanning many tiles: equal keys make every visible key equally likely, so out[i] is the mean of v[0..i].
  const int64_t L = 300, H = 2, D = 16;
  Tensor q = Tensor::full({1, L, H, D}, 0.1f, DType::F32, Device::cpu());
  Tensor k = Tensor::full({1, L, H, D}, 0.2f, DType::F32, Device::cpu());
  std::vector<float> vv(std::size_t(L * H * D));
  for (int64_t j = 0; j < L; ++j)
    for (int64_t h = 0; h < H * D; ++h) vv[j * H * D + h] = float(j);
  Tensor v = Tensor::from_floats(vv, {1, L, H, D}, DType::F32, Device::cpu());
  std::vector<float> out = attention_forward(q, k, v, Mask::Causal, 0.25f).out.to_floats();
  for (int64_t i : {0L, 63L, 64L, 299L}) EXPECT_NEAR(out[i * H * D], float(i) / 2.f, 1e-3) << i;
}
