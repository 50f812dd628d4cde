// CPU kernel for one chunk of the fused cross-entropy (the logits chunk comes from a GEMM).
#include <cmath>

#include "core/backend/cpu/cpu_common.h"
#include "core/backend/cpu/cpu_kernels.h"

namespace hr::cpu {

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
          float mx = -INFINITY;
          for (int64_t c = 0; c < vocab; ++c) mx = std::max(mx, x[c]);
          double s = 0.0;
          for (int64_t c = 0; c < vocab; ++c) s += std::exp(double(x[c] - mx));
          const double l = double(mx) + std::log(s);
          lse[r] = float(l);
          return lab[r] == a.ignore_index ? 0.0 : l - double(x[lab[r]]);
        },
        vocab);
  });
  a.loss.data<float>()[0] += float(total(partial) * a.inv_normalizer);
}

void cross_entropy_backward(const CrossEntropyArgs& a) {
  const int64_t rows = a.logits.size(0), vocab = a.logits.size(1);
  float* lg = a.logits.data<float>();
  const float* lse = a.lse.data<float>();
  const float g = a.dloss.data<float>()[0] * a.inv_normalizer;
  dispatch_index(a.labels.dtype(), "cross_entropy_backward", [&](auto itag) {
    using I = decltype(itag);
    const I* lab = a.labels.data<I>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      float* x = lg + r * vocab;
      if (lab[r] == a.ignore_index) {
        std::fill(x, x + vocab, 0.f);
        continue;
      }
      const float l = lse[r];
      for (int64_t c = 0; c < vocab; ++c) x[c] = g * std::exp(x[c] - l);
      x[lab[r]] -= g;
    }
  });
}

}  // namespace hr::cpu
