// Copies, fills, casts and the layout ops built on them.
#include "core/ops/copy.h"

#include "core/ops/dispatch.h"

namespace hr::core {

namespace {
int norm_dim(const char* op, int dim, int nd) {
  if (dim < 0) dim += nd;
  HR_CHECK(dim >= 0 && dim < nd, "[", op, "] dim ", dim, " out of range for ", nd, "-d tensors");
  return dim;
}
}  // namespace

namespace {
using CopyKernel = void (*)(const Tensor&, const Tensor&);

void copy_with(const char* op, CopyKernel Kernels::*kernel, const Tensor& dst, const Tensor& src) {
  HR_CHECK(dst.shape() == src.shape(), "[", op, "] shape mismatch: ", dst.describe(), " <- ", src.describe());
  if (dst.numel() == 0) return;
  Device dd = dst.device(), sd = src.device();
  if (dd.type == DeviceType::Meta || sd.type == DeviceType::Meta) return;
  // Between host memory and a GPU the bytes move as they are (cudaMemcpy): a cast, or a strided host side, is
  // done in host memory on a contiguous host tensor of the GPU side's dtype (no GPU memory borrowed for it); only
  // a strided GPU side is made contiguous on the GPU. The staged copy is a plain, synchronous one.
  const bool dgpu = dd.type == DeviceType::CUDA, sgpu = sd.type == DeviceType::CUDA;
  if (dgpu != sgpu && (dst.dtype() != src.dtype() || !dst.is_contiguous() || !src.is_contiguous())) {
    if (dgpu) {
      Tensor h = Tensor::empty(src.shape(), dst.dtype(), Device::host());
      copy_(h, src);
      if (dst.is_contiguous()) return launch(op, dd, &Kernels::copy, dst, h);
      Tensor g = Tensor::empty(dst.shape(), dst.dtype(), dd);
      launch(op, dd, &Kernels::copy, g, h);
      return launch(op, dd, &Kernels::copy, dst, g);
    }
    const Tensor g = src.is_contiguous() ? src : src.contiguous();
    Tensor h = Tensor::empty(src.shape(), src.dtype(), Device::host());
    launch(op, sd, &Kernels::copy, h, g);
    return copy_(dst, h);
  }
  // A copy touching a GPU runs on the GPU backend; anything else is host memory.
  Device run = dgpu ? dd : sd;
  launch(op, run, kernel, dst, src);
}
}  // namespace

void copy_(const Tensor& dst, const Tensor& src) {
  copy_with("copy", &Kernels::copy, dst, src);
}
void copy_async_(const Tensor& dst, const Tensor& src) {
  copy_with("copy_async", &Kernels::copy_async, dst, src);
}
void copy_side_(const Tensor& dst, const Tensor& src) {
  copy_with("copy_side", &Kernels::copy_side, dst, src);
}
void side_copies_done(Device device) {
  if (device.type == DeviceType::CUDA) launch("side_sync", device, &Kernels::side_sync);
}

void fill_(const Tensor& dst, float value) {
  if (dst.numel() == 0) return;
  launch("fill", dst.device(), &Kernels::fill, dst, value);
}

Tensor cast(const Tensor& x, DType dtype) {
  Tensor y = Tensor::empty(x.shape(), dtype, x.device());
  copy_(y, x);
  return y;
}

Tensor cast_backward(const Tensor& dy, DType input_dtype) {
  return cast(dy, input_dtype);
}

Tensor concat(const std::vector<Tensor>& xs, int dim) {
  HR_CHECK(!xs.empty(), "[concat] no inputs");
  dim = norm_dim("concat", dim, xs[0].dim());
  Shape shape = xs[0].shape();
  int64_t total = 0;
  for (const Tensor& x : xs) {
    HR_CHECK(x.dim() == xs[0].dim() && x.dtype() == xs[0].dtype(), "[concat] ", x.describe(), " does not match ",
             xs[0].describe());
    check_same_device("concat", x, xs[0]);
    for (int d = 0; d < x.dim(); ++d)
      HR_CHECK(d == dim || x.size(d) == shape[d], "[concat] ", x.describe(), " differs from ", xs[0].describe(),
               " outside dim ", dim);
    total += x.size(dim);
  }
  shape[dim] = total;
  Tensor out = Tensor::empty(shape, xs[0].dtype(), xs[0].device());
  int64_t at = 0;
  for (const Tensor& x : xs) {
    copy_(out.slice(dim, at, at + x.size(dim)), x);
    at += x.size(dim);
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int dim) {
  dim = norm_dim("split", dim, x.dim());
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  HR_CHECK(total == x.size(dim), "[split] sizes add up to ", total, " but dim ", dim, " of ", x.describe(), " is ",
           x.size(dim));
  std::vector<Tensor> out;
  int64_t at = 0;
  for (int64_t s : sizes) {
    out.push_back(slice_copy(x, dim, at, at + s));
    at += s;
  }
  return out;
}

std::vector<Tensor> concat_backward(const Tensor& dy, const std::vector<int64_t>& sizes, int dim) {
  return split(dy, sizes, dim);
}

Tensor split_backward(const std::vector<Tensor>& dys, int dim) {
  return concat(dys, dim);
}

Tensor slice_copy(const Tensor& x, int dim, int64_t start, int64_t end) {
  return x.slice(dim, start, end).clone();
}

Tensor slice_backward(const Tensor& dy, const Shape& input_shape, int dim, int64_t start) {
  dim = norm_dim("slice_backward", dim, int(input_shape.size()));
  Tensor dx = Tensor::zeros(input_shape, dy.dtype(), dy.device());
  copy_(dx.slice(dim, start, start + dy.size(dim)), dy);
  return dx;
}

}  // namespace hr::core
