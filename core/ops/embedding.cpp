// Embedding and patchify: shape rules, allocation, dispatch.
#include "core/ops/embedding.h"

#include "core/ops/copy.h"
#include "core/ops/dispatch.h"

namespace hr::core {

namespace {
void check_ids(const char* op, const Tensor& ids) {
  HR_CHECK(ids.dtype() == DType::I32 || ids.dtype() == DType::I64, "[", op, "] ids must be i32 or i64; got ",
           ids.describe());
}
}  // namespace

Tensor embedding_forward(const Tensor& ids, const Tensor& table) {
  check_ids("embedding", ids);
  HR_CHECK(table.dim() == 2, "[embedding] table must be (vocab, dim); got ", table.describe());
  check_same_device("embedding", ids, table);
  Shape shape = ids.shape();
  shape.push_back(table.size(1));
  Tensor out = Tensor::empty(shape, table.dtype(), table.device());
  Tensor idc = ids.contiguous(), tc = table.contiguous();
  launch("embedding", table.device(), &Kernels::embedding_forward, idc, tc, out);
  return out;
}

Tensor embedding_backward(const Tensor& ids, const Tensor& dy, const Shape& table_shape, DType table_dtype,
                          const Tensor& dtable_into) {
  check_ids("embedding_backward", ids);
  HR_CHECK(table_shape.size() == 2 && dy.numel() == ids.numel() * table_shape[1], "[embedding_backward] dy ",
           dy.describe(), " does not match ids ", ids.describe(), " and table ", shape_str(table_shape));
  Tensor dtable = dtable_into.defined() ? dtable_into : Tensor::zeros(table_shape, table_dtype, dy.device());
  check_shape("embedding_backward", "dtable", dtable, table_shape);
  Tensor idc = ids.contiguous(), dyc = dy.contiguous();
  Tensor workspace =
      allocate_workspace(sizing_kernels(dy.device()).embedding_workspace_bytes(ids.numel()), dy.device());
  launch("embedding_backward", dy.device(), &Kernels::embedding_backward, idc, dyc, dtable, workspace);
  return dtable;
}

Tensor mix_rows(const Tensor& src, const Tensor& extra, const Tensor& begin, const Tensor& row, const Tensor& weight) {
  HR_CHECK(src.dim() == 2, "[mix_rows] src must be (rows, dim); got ", src.describe());
  HR_CHECK(!extra.defined() || (extra.dim() == 1 && extra.size(0) == src.size(1) && extra.dtype() == src.dtype()),
           "[mix_rows] extra must be (", src.size(1), ") of ", dtype_name(src.dtype()), "; got ", extra.describe());
  HR_CHECK(begin.dim() == 1 && begin.size(0) >= 1 && begin.dtype() == DType::I64 && row.dim() == 1 &&
               row.dtype() == DType::I64 && weight.dim() == 1 && weight.dtype() == DType::F32 &&
               weight.size(0) == row.size(0),
           "[mix_rows] begin (tokens + 1) and row (entries) must be i64, weight (entries) f32; got ", begin.describe(),
           ", ", row.describe(), ", ", weight.describe());
  for (const Tensor* t : {&extra, &begin, &row, &weight})
    if (t->defined()) check_same_device("mix_rows", src, *t);
  Tensor out = Tensor::empty({begin.size(0) - 1, src.size(1)}, src.dtype(), src.device());
  MixArgs a{src.contiguous(),    extra.defined() ? extra.contiguous() : Tensor(),
            begin.contiguous(),  row.contiguous(),
            weight.contiguous(), out};
  launch("mix_rows", src.device(), &Kernels::mix_rows, a);
  return out;
}

HostMix transpose_mix(const std::vector<int64_t>& begin, const std::vector<int64_t>& row,
                      const std::vector<float>& weight, int64_t rows) {
  HR_CHECK(!begin.empty() && begin.back() == int64_t(row.size()) && row.size() == weight.size(),
           "[mix_rows] a mix's begin must end at its ", row.size(), " entries");
  std::vector<int64_t> count(std::size_t(rows) + 1, 0);
  for (const int64_t r : row) {
    HR_CHECK(r >= -1 && r < rows, "[mix_rows] row ", r, " is outside [-1, ", rows, ")");
    ++count[std::size_t(r < 0 ? rows : r)];
  }
  HostMix t;
  t.begin.resize(std::size_t(rows) + 2, 0);
  for (std::size_t r = 0; r <= std::size_t(rows); ++r) t.begin[r + 1] = t.begin[r] + count[r];
  t.row.resize(row.size());
  t.weight.resize(row.size());
  std::vector<int64_t> at(t.begin.begin(), t.begin.end() - 1);
  for (std::size_t tok = 0; tok + 1 < begin.size(); ++tok)  // tokens in order: each row's entries in token order
    for (int64_t k = begin[tok]; k < begin[tok + 1]; ++k) {
      const std::size_t r = std::size_t(row[std::size_t(k)] < 0 ? rows : row[std::size_t(k)]);
      t.row[std::size_t(at[r])] = int64_t(tok);
      t.weight[std::size_t(at[r]++)] = weight[std::size_t(k)];
    }
  return t;
}

Tensor patchify(const Tensor& images, int64_t p) {
  HR_CHECK(images.dim() == 4 && p > 0 && images.size(2) % p == 0 && images.size(3) % p == 0,
           "[patchify] images must be (batch, channels, height, width) with sides divisible by patch ", p, "; got ",
           images.describe());
  const int64_t n = (images.size(2) / p) * (images.size(3) / p);
  Tensor out = Tensor::empty({images.size(0), n, images.size(1) * p * p}, images.dtype(), images.device());
  Tensor ic = images.contiguous();
  launch("patchify", images.device(), &Kernels::patchify, ic, out, p, PatchDirection::ToPatches);
  return out;
}

Tensor patchify_backward(const Tensor& dpatches, const Shape& image_shape, int64_t p) {
  HR_CHECK(image_shape.size() == 4, "[patchify_backward] image shape must have 4 dims; got ", shape_str(image_shape));
  const Shape expect = {image_shape[0], (image_shape[2] / p) * (image_shape[3] / p), image_shape[1] * p * p};
  check_shape("patchify_backward", "dpatches", dpatches, expect);
  Tensor dimg = Tensor::empty(image_shape, dpatches.dtype(), dpatches.device());
  Tensor dc = dpatches.contiguous();
  launch("patchify_backward", dpatches.device(), &Kernels::patchify, dimg, dc, p, PatchDirection::ToImages);
  return dimg;
}

}  // namespace hr::core
