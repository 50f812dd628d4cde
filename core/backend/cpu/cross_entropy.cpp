// CPU kernel for one chunk of the fused cross-entropy (the logits chunk comes from a GEMM). The exponentials go in
// stretches of kStretch through exp_floats (vectorized where the CPU has AVX2 + FMA); the row sums add them in double,
// in eight lanes.
#include <algorithm>
#include <cmath>

#include "core/backend/cpu/cpu_common.h"
#include "core/backend/cpu/cpu_kernels.h"

namespace hr::cpu {

namespace {
constexpr int64_t kStretch = 512;  // logits per exp_floats call: 2 KiB on the stack
constexpr int kLanes = 8;          // running sums of a row's exponentials (kStretch is a multiple)
static_assert(kLanes == 8 && kStretch % kLanes == 0, "the row sum adds eight lanes pairwise");
}  // namespace

void cross_entropy_forward(const CrossEntropyArgs& a) {
  const int64_t rows = a.logits.size(0), vocab = a.logits.size(1);
  const float* lg = a.logits.data<float>();
  float* lse = a.lse.data<float>();
  ChunkSums partial{};
  dispatch_index(a.labels.dtype(), "cross_entropy", [&](auto itag) {
    using I = decltype(itag);
    const I* lab = a.labels.data<I>();
    for (int64_t r = 0; r < rows; ++r)
      HR_CHECK(lab[r] == a.ignore_index || (lab[r] >= 0 && lab[r] < vocab), "[cross_entropy] label ", int64_t(lab[r]),
               " at row ", r, " is outside [0, ", vocab, ") and is not ignore_index ", a.ignore_index);
    // Each row's log-sum-exp is saved; its loss -log p[label] joins the row sums (0 on ignored rows).
    sum_fixed_chunks(
        rows, partial,
        [&](int64_t r) {
          const float* x = lg + r * vocab;
          float lane_max[kLanes];
          std::fill(lane_max, lane_max + kLanes, -INFINITY);
          int64_t c = 0;
          for (; c + kLanes <= vocab; c += kLanes)
            for (int j = 0; j < kLanes; ++j) lane_max[j] = std::max(lane_max[j], x[c + j]);
          for (; c < vocab; ++c) lane_max[c % kLanes] = std::max(lane_max[c % kLanes], x[c]);
          const float mx = *std::max_element(lane_max, lane_max + kLanes);
          // kLanes running sums, column c into lane c % kLanes, then added pairwise: independent chains the
          // compiler vectorizes, where one running sum waited on each add; the order is fixed, so every run and
          // thread count gives the same bits.
          double lane[kLanes] = {};
          alignas(32) float e[kStretch];
          for (int64_t c0 = 0; c0 < vocab; c0 += kStretch) {
            const int64_t m = std::min(kStretch, vocab - c0);
            for (int64_t k = 0; k < m; ++k) e[k] = x[c0 + k] - mx;
            exp_floats(e, e, m);
            int64_t k = 0;
            for (; k + kLanes <= m; k += kLanes)
              for (int j = 0; j < kLanes; ++j) lane[j] += e[k + j];
            for (; k < m; ++k) lane[k % kLanes] += e[k];
          }
          const double s = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
          const double l = double(mx) + std::log(s);
          lse[r] = float(l);
          return lab[r] == a.ignore_index ? 0.0 : l - double(x[lab[r]]);
        },
        vocab);
  });
  a.loss.data<float>()[0] += float(total(partial) * a.inv_normalizer);
}

// The gradient goes over the logits and, where dlogits is given, into it in its dtype (rounded once) as well.
void cross_entropy_backward(const CrossEntropyArgs& a) {
  const int64_t rows = a.logits.size(0), vocab = a.logits.size(1);
  const Tensor& out = a.dlogits.defined() ? a.dlogits : a.logits;
  HR_CHECK(out.numel() == rows * vocab && out.is_contiguous(), "[cross_entropy_backward] dlogits ", out.describe(),
           " does not hold the chunk's ", rows, " x ", vocab, " logits");
  float* lg = a.logits.data<float>();
  const bool both = a.dlogits.defined();
  const float* lse = a.lse.data<float>();
  const float g = a.dloss.data<float>()[0] * a.inv_normalizer;
  dispatch_index(a.labels.dtype(), "cross_entropy_backward", [&](auto itag) {
    using I = decltype(itag);
    const I* lab = a.labels.data<I>();
    dispatch_float(out.dtype(), "cross_entropy_backward", [&](auto otag) {
      using O = decltype(otag);
      O* o = out.data<O>();
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        float* x = lg + r * vocab;
        O* y = o + r * vocab;
        const bool ignored = lab[r] == a.ignore_index;
        const float l = lse[r];
        alignas(32) float e[kStretch];
        for (int64_t c0 = 0; c0 < vocab; c0 += kStretch) {
          const int64_t m = std::min(kStretch, vocab - c0);
          for (int64_t k = 0; k < m; ++k) e[k] = x[c0 + k] - l;
          exp_floats(e, e, m);
          for (int64_t k = 0, c = c0; k < m; ++k, ++c) {
            const float v = ignored ? 0.f : g * e[k] - (c == int64_t(lab[r]) ? g : 0.f);
            if (both) x[c] = v;
            store(y, c, v);
          }
        }
      }
    });
  });
}

}  // namespace hr::cpu
