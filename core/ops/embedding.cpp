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
