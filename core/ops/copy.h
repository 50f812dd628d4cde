// Copies, fills, casts and the layout ops built on copy: concat, split, slice (forward and backward).
#pragma once

#include <vector>

#include "core/tensor.h"

namespace hr::core {

// dst = src element-wise (same shape; any strides; casts between dtypes; host/cpu/meta/cuda as the build allows).
void copy_(const Tensor& dst, const Tensor& src);
// copy_ that may return while a host<->device transfer still runs on the compute stream: the caller keeps dst
// and src alive until the stream next synchronizes (a batch copied in at a step's start, read back at its end).
void copy_async_(const Tensor& dst, const Tensor& src);
// A host<->device copy on `dst`'s or `src`'s GPU's side stream, after what the compute stream has queued, so that
// it moves while later kernels compute (offloaded gradients leaving during the backward, updated parameters
// arriving during the next group's host update). dst and src stay alive and untouched until
// side_copies_done(that device). On the CPU and the meta device it is copy_.
void copy_side_(const Tensor& dst, const Tensor& src);
// Blocks until every side copy of `device` has arrived; nothing on the CPU or the meta device.
void side_copies_done(Device device);
void fill_(const Tensor& dst, float value);

Tensor cast(const Tensor& x, DType dtype);
Tensor cast_backward(const Tensor& dy, DType input_dtype);

// Concatenates along `dim`; backward splits the gradient back into the inputs' sizes.
Tensor concat(const std::vector<Tensor>& xs, int dim);
std::vector<Tensor> concat_backward(const Tensor& dy, const std::vector<int64_t>& sizes, int dim);

// Contiguous copies of pieces along `dim`.
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int dim);
Tensor split_backward(const std::vector<Tensor>& dys, int dim);

// A contiguous copy of x[start:end] along dim; backward scatters dy into zeros of the input's shape.
Tensor slice_copy(const Tensor& x, int dim, int64_t start, int64_t end);
Tensor slice_backward(const Tensor& dy, const Shape& input_shape, int dim, int64_t start);

}  // namespace hr::core
