// Chunked fused cross-entropy: per chunk a GEMM into an f32 logits workspace, then the loss kernel. On a back-end
// whose GEMMs would stage an f32 operand in the 16-bit type of the other (cuBLAS), the backward kernel writes the
// logit gradient in that type once, and both GEMMs read it as it is (the weight gradient's through a transposed
// view: an op flag, not a copy).
#include "core/ops/cross_entropy.h"

#include <algorithm>
#include <array>

#include "core/ops/copy.h"
#include "core/ops/dispatch.h"
#include "core/ops/linear.h"

namespace hr::core {

int64_t default_chunk_rows(int64_t tokens, int64_t vocab, std::size_t chunk_bytes) {
  int64_t rows = int64_t(chunk_bytes / (sizeof(float) * std::size_t(std::max<int64_t>(vocab, 1))));
  return std::max<int64_t>(1, std::min(rows, tokens));
}

namespace {

struct Checked {
  int64_t tokens, d, vocab, chunk;
  int64_t labelled;  // rows [0, labelled) may carry a label
  int64_t grain;     // 0: a chunk with a labelled row runs its products over all its rows

  // The rows of the chunk at r0 (`rows` of them) its products run over: none past the labelled rows, and in the chunk
  // they end in, those rounded up to the grain. `fits` whether the back-end's kernels run that part of the products
  // inside the whole's allocations.
  template <class Fits>
  int64_t live(int64_t r0, int64_t rows, const Fits& fits) const {
    if (r0 >= labelled) return 0;
    if (grain <= 0 || labelled >= r0 + rows) return rows;
    const int64_t part = std::min(rows, (labelled - r0 + grain - 1) / grain * grain);
    return part < rows && fits(part) ? part : rows;
  }
};

Checked check(const char* op, const Tensor& hidden, const Tensor& weight, const Tensor& labels,
              const CrossEntropyOptions& o) {
  check_float(op, "hidden", hidden);
  HR_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1), "[", op, "] hidden ",
           hidden.describe(), " does not match weight ", weight.describe());
  HR_CHECK(labels.dtype() == DType::I32 || labels.dtype() == DType::I64, "[", op, "] labels must be i32 or i64; got ",
           labels.describe());
  check_shape(op, "labels", labels, {hidden.size(0)});
  check_same_device(op, hidden, weight);
  check_same_device(op, hidden, labels);
  HR_CHECK(o.normalizer > 0.f, "[", op, "] normalizer must be positive; got ", o.normalizer);
  HR_CHECK(o.labelled_rows >= -1 && o.labelled_rows <= hidden.size(0), "[", op, "] labelled_rows ", o.labelled_rows,
           " is outside [-1, ", hidden.size(0), "]");
  HR_CHECK(o.row_grain >= 0, "[", op, "] row_grain must be 0 or positive; got ", o.row_grain);
  const Kernels& sizing = sizing_kernels(hidden.device());
  Checked c{hidden.size(0), hidden.size(1), weight.size(0),
            o.chunk_rows,   hidden.size(0), o.row_grain > 0 ? o.row_grain : sizing.cross_entropy_row_grain};
  if (c.chunk <= 0) c.chunk = default_chunk_rows(c.tokens, c.vocab, sizing.cross_entropy_chunk_bytes);
  if (o.labelled_rows >= 0) c.labelled = o.labelled_rows;
  return c;
}

// A chunk's logits (f32), or its logit gradient in the GEMMs' operand type.
Tensor logits_buffer(const Checked& c, Device device, DType dtype = DType::F32) {
  MemoryScope scope(Category::Workspace);
  return Tensor::empty({std::min(c.chunk, std::max<int64_t>(c.tokens, 1)), c.vocab}, dtype, device);
}

CrossEntropyArgs chunk_args(const Tensor& logits, const Tensor& labels, const Tensor& lse,
                            const CrossEntropyOptions& o) {
  CrossEntropyArgs a;
  a.logits = logits;
  a.labels = labels;
  a.lse = lse;
  a.ignore_index = o.ignore_index;
  a.inv_normalizer = 1.f / o.normalizer;
  a.check = o.labels;
  return a;
}

}  // namespace

CrossEntropyOut cross_entropy_forward(const Tensor& hidden, const Tensor& weight, const Tensor& labels,
                                      const CrossEntropyOptions& o) {
  const Checked c = check("cross_entropy", hidden, weight, labels, o);
  const Device dev = hidden.device();
  CrossEntropyOut out{Tensor::zeros({}, DType::F32, dev), Tensor::empty({c.tokens}, DType::F32, dev)};
  Tensor logits = logits_buffer(c, dev);
  Tensor wt = weight.view({1, c.vocab, c.d}).transpose(1, 2);
  for (int64_t r0 = 0; r0 < c.tokens; r0 += c.chunk) {
    const int64_t rows = std::min(c.chunk, c.tokens - r0);
    const Tensor lg = logits.slice(0, 0, rows);
    auto product = [&](int64_t n) -> GemmOperands {
      return {hidden.slice(0, r0, r0 + n).view({1, n, c.d}), wt, lg.slice(0, 0, n).view({1, n, c.vocab})};
    };
    const GemmOperands whole = product(rows);
    const int64_t live = c.live(r0, rows, [&](int64_t n) { return gemm_fits_within(product(n), whole); });
    if (live == 0) {  // a chunk wholly past the labelled rows: no loss, no product
      gemm_allocations(whole.a, whole.b, whole.c);
      continue;
    }
    gemm_within(product(live), whole);
    // The rows past the part carry no label. Their lse is written all the same: the backward runs them where its own
    // products do not fit the part, and its kernel reads every row's lse (to drop it on a row without a label).
    if (live < rows) fill_(out.lse.slice(0, r0 + live, r0 + rows), 0.f);
    CrossEntropyArgs a =
        chunk_args(lg.slice(0, 0, live), labels.slice(0, r0, r0 + live), out.lse.slice(0, r0, r0 + live), o);
    a.loss = out.loss;
    launch("cross_entropy", dev, &Kernels::cross_entropy_forward, a);
  }
  return out;
}

namespace {

// One chunk of the backward, rows [r0, r0 + rows): its logits again, their gradient (in `grads` as well, cast, when
// the GEMMs would narrow it), then dhidden and the weight gradient (overwritten by the first chunk, `first`).
struct BackwardChunks {
  const Checked& c;
  const Tensor &dloss, &hidden, &weight, &labels, &lse;
  const CrossEntropyOptions& o;
  Tensor logits, grads, wt;
  // A chunk wholly past the labelled rows runs no product (its loss and gradients are zero), and the one they end
  // in runs its products over the part Checked::live names (the gradient of the rows past it is zero); both make the
  // allocations of the whole products. Returns whether it wrote the weight gradient.
  bool run(int64_t r0, CrossEntropyGrads& g, bool weight_grads, bool first) const {
    const int64_t rows = std::min(c.chunk, c.tokens - r0);
    const Device dev = hidden.device();
    const Tensor lg = logits.slice(0, 0, rows), dh = g.dhidden.slice(0, r0, r0 + rows);
    const Tensor dlg = grads.defined() ? grads.slice(0, 0, rows) : lg;
    // An f32 weight gradient (grad_accum_dtype fp32) takes the f32 logit gradient: no rounding before its sum.
    const Tensor dw_in = weight_grads && g.dweight.dtype() == DType::F32 ? lg : dlg;
    // The chunk's three products over its first n rows: its logits again, dhidden, the weight gradient.
    auto products = [&](int64_t n) -> std::array<GemmOperands, 3> {
      const Tensor h = hidden.slice(0, r0, r0 + n).view({1, n, c.d});
      return {GemmOperands{h, wt, lg.slice(0, 0, n).view({1, n, c.vocab})},
              GemmOperands{dlg.slice(0, 0, n).view({1, n, c.vocab}), weight.view({1, c.vocab, c.d}),
                           dh.slice(0, 0, n).view({1, n, c.d})},
              GemmOperands{dw_in.slice(0, 0, n).view({1, n, c.vocab}).transpose(1, 2), h,
                           weight_grads ? g.dweight.view({1, c.vocab, c.d}) : Tensor()}};
    };
    const std::array<GemmOperands, 3> whole = products(rows);
    const float beta = first ? 0.f : 1.f;  // the weight gradient's
    const int64_t live = c.live(r0, rows, [&](int64_t n) {
      const std::array<GemmOperands, 3> part = products(n);
      return gemm_fits_within(part[0], whole[0]) && gemm_fits_within(part[1], whole[1]) &&
             (!weight_grads || gemm_fits_within(part[2], whole[2], 1.f, beta));
    });
    if (live == 0) {  // wholly past the labelled rows: no product (its loss and gradients are zero), the allocations
      gemm_allocations(whole[0].a, whole[0].b, whole[0].c);
      gemm_allocations(whole[1].a, whole[1].b, whole[1].c);
      fill_(dh, 0.f);
      if (weight_grads) gemm_allocations(whole[2].a, whole[2].b, whole[2].c, 1.f, beta);
      return false;
    }
    const std::array<GemmOperands, 3> part = products(live);
    gemm_within(part[0], whole[0]);
    CrossEntropyArgs a =
        chunk_args(lg.slice(0, 0, live), labels.slice(0, r0, r0 + live), lse.slice(0, r0, r0 + live), o);
    a.dloss = dloss;
    if (grads.defined()) a.dlogits = dlg.slice(0, 0, live);
    launch("cross_entropy_backward", dev, &Kernels::cross_entropy_backward, a);
    gemm_within(part[1], whole[1]);
    if (live < rows) fill_(dh.slice(0, live, rows), 0.f);
    if (!weight_grads) return false;
    gemm_within(part[2], whole[2], 1.f, beta);
    return true;
  }
};

}  // namespace

CrossEntropyGrads cross_entropy_backward(const Tensor& dloss, const Tensor& hidden, const Tensor& weight,
                                         const Tensor& labels, const CrossEntropyOut& saved,
                                         const CrossEntropyOptions& o, const CrossEntropyBackwardOptions& b) {
  const Checked c = check("cross_entropy_backward", hidden, weight, labels, o);
  HR_CHECK(dloss.numel() == 1 && dloss.dtype() == DType::F32,
           "[cross_entropy_backward] dloss must be an f32 scalar; got ", dloss.describe());
  check_shape("cross_entropy_backward", "lse", saved.lse, {c.tokens});
  const Device dev = hidden.device();
  CrossEntropyGrads g;
  g.dhidden = Tensor::empty(hidden.shape(), hidden.dtype(), dev);
  const bool into = b.dweight_into.defined();
  if (b.weight_grads) {
    g.dweight = into ? b.dweight_into : Tensor::empty(weight.shape(), weight.dtype(), dev);
    check_shape("cross_entropy_backward", "dweight", g.dweight, weight.shape());
  }
  // Where cuBLAS would stage the f32 gradient in the 16-bit type for each GEMM (once through a transposed copy), the
  // kernel writes it in that type too, in the same pass; the f32 one stays for an f32 weight gradient.
  const bool narrow = sizing_kernels(dev).gemm_mixing == GemmMixing::NarrowToOutput && hidden.dtype() != DType::F32;
  Tensor logits = logits_buffer(c, dev);
  Tensor grads = narrow ? logits_buffer(c, dev, hidden.dtype()) : Tensor();
  const BackwardChunks chunks{c,
                              dloss,
                              hidden,
                              weight,
                              labels,
                              saved.lse,
                              o,
                              std::move(logits),
                              std::move(grads),
                              weight.view({1, c.vocab, c.d}).transpose(1, 2)};
  const bool overwrite = !(into && b.accumulate == Accumulate::Yes);
  bool written = false;
  for (int64_t r0 = 0; r0 < c.tokens; r0 += c.chunk)
    written = chunks.run(r0, g, b.weight_grads, overwrite && r0 == 0) || written;
  if (b.weight_grads && overwrite && !written) fill_(g.dweight, 0.f);  // no chunk wrote it
  return g;
}

}  // namespace hr::core
