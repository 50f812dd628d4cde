// CPU embedding lookup (and its scatter-add backward) and image patchify.
#include "core/backend/cpu/cpu_common.h"
#include "core/backend/cpu/cpu_kernels.h"

namespace hr::cpu {

namespace {
template <typename I>
void check_ids(const I* ids, int64_t n, int64_t vocab, const char* op) {
  for (int64_t i = 0; i < n; ++i)
    HR_CHECK(ids[i] >= 0 && ids[i] < vocab, "[", op, "] id ", int64_t(ids[i]), " at position ", i,
             " is outside the vocabulary [0, ", vocab, ")");
}
}  // namespace

void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out) {
  const int64_t n = ids.numel(), vocab = table.size(0), dim = table.size(1);
  const std::size_t row_bytes = std::size_t(dim) * table.element_size();
  dispatch_index(ids.dtype(), "embedding", [&](auto itag) {
    using I = decltype(itag);
    const I* id = ids.data<I>();
    check_ids(id, n, vocab, "embedding");
    const char* t = static_cast<const char*>(table.data_ptr());
    char* o = static_cast<char*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (n > 256)
    for (int64_t i = 0; i < n; ++i) std::memcpy(o + i * row_bytes, t + int64_t(id[i]) * row_bytes, row_bytes);
  });
}

// Rows are accumulated in token order per embedding row: threads split the embedding dim, not the tokens,
// so no two threads touch the same element and the sum order is fixed.
std::size_t embedding_workspace_bytes(int64_t) {
  return 0;
}

void embedding_backward(const Tensor& ids, const Tensor& dy, const Tensor& dtable, const Tensor&) {
  const int64_t n = ids.numel(), vocab = dtable.size(0), dim = dtable.size(1);
  dispatch_index(ids.dtype(), "embedding_backward", [&](auto itag) {
    using I = decltype(itag);
    const I* id = ids.data<I>();
    check_ids(id, n, vocab, "embedding_backward");
    dispatch_float(dtable.dtype(), "embedding_backward", [&](auto tag) {
      using T = decltype(tag);
      T* dt = dtable.data<T>();
      dispatch_float(dy.dtype(), "embedding_backward", [&](auto gtag) {
        using G = decltype(gtag);
        const G* g = dy.data<G>();
#pragma omp parallel for schedule(static)
        for (int64_t c = 0; c < dim; ++c)
          for (int64_t i = 0; i < n; ++i) {
            const int64_t o = int64_t(id[i]) * dim + c;
            store(dt, o, load(dt, o) + load(g, i * dim + c));
          }
      });
    });
  });
}

void mix_rows(const MixArgs& a) {
  const int64_t tokens = a.out.size(0), dim = a.out.size(1);
  const int64_t* begin = a.begin.data<int64_t>();
  const int64_t* row = a.row.data<int64_t>();
  const float* weight = a.weight.data<float>();
  dispatch_float(a.src.dtype(), "mix_rows", [&](auto tag) {
    using T = decltype(tag);
    const T* src = a.src.data<T>();
    const T* extra = a.extra.defined() ? a.extra.data<T>() : nullptr;
    T* out = a.out.data<T>();
#pragma omp parallel for schedule(static) if (tokens * dim > 4096)
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t c = 0; c < dim; ++c) {
        float acc = 0.f;
        for (int64_t k = begin[t]; k < begin[t + 1]; ++k)
          acc += weight[k] * (row[k] < 0 ? load(extra, c) : load(src, row[k] * dim + c));
        store(out, t * dim + c, acc);
      }
  });
}

void patchify(const Tensor& images, const Tensor& patches, int64_t p, PatchDirection direction) {
  const bool inverse = direction == PatchDirection::ToImages;
  const int64_t b = images.size(0), ch = images.size(1), h = images.size(2), w = images.size(3);
  const int64_t gh = h / p, gw = w / p, pd = ch * p * p;
  const std::size_t es = images.element_size();
  char* img = static_cast<char*>(images.data_ptr());
  char* pat = static_cast<char*>(patches.data_ptr());
#pragma omp parallel for schedule(static) collapse(2)
  for (int64_t n = 0; n < b; ++n)
    for (int64_t g = 0; g < gh * gw; ++g) {
      const int64_t gy = g / gw, gx = g % gw;
      for (int64_t c = 0; c < ch; ++c)
        for (int64_t y = 0; y < p; ++y) {
          char* src = img + (((n * ch + c) * h + gy * p + y) * w + gx * p) * int64_t(es);
          char* dst = pat + ((n * gh * gw + g) * pd + (c * p + y) * p) * int64_t(es);
          if (inverse)
            std::memcpy(src, dst, std::size_t(p) * es);
          else
            std::memcpy(dst, src, std::size_t(p) * es);
        }
    }
}

}  // namespace hr::cpu
