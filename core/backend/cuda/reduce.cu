// CUDA reductions: whole-tensor sum / sum of squares and sums over leading dims, the twins of
// backend/cpu/reduce.cpp, in a fixed order (double accumulators; no atomics). A whole-tensor sum runs as a fixed
// grid whose block sums land in a buffer of this file's own (device/partials.cuh), then one block adds them. A sum
// over the leading dims tiles the rows as well as the columns (column_sums.cuh): its partials are the workspace.
#include "core/backend/cuda/column_sums.cuh"
#include "core/backend/cuda/cuda_common.h"
#include "core/backend/cuda/cuda_kernels.h"
#include "core/backend/cuda/device/dtype.cuh"
#include "core/backend/cuda/device/partials.cuh"

namespace hr::cuda {

namespace {

using device::load;
using device::store;

template <typename T>
__global__ void reduce_partials_kernel(const T* x, long long n, bool squares) {
  device::partial_sums(n, [&](long long i) {
    const double v = load(x, i);
    return squares ? v * v : v;
  });
}

template <typename T>
__global__ void sum_leading_partials_kernel(const T* x, double* partial, long long rows, long long cols,
                                            ColumnSplit split) {
  column_partials<1>(rows, cols, split, partial,
                     [&](long long r, long long c, double* s) { s[0] += load(x, r * cols + c); });
}

template <typename O>
__global__ void sum_leading_total_kernel(const double* partial, O* out, long long partials, long long cols,
                                         bool accumulate) {
  const long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const double t = column_total<1>(partial, partials, cols, c, 0);
  store(out, c, (accumulate ? load(out, c) : 0.f) + float(t));
}

__global__ void total_to_kernel(float* out) {
  const double t = device::total_of_partials();
  if (threadIdx.x == 0) out[0] = float(t);
}

}  // namespace

void reduce_all(ReduceOp op, const Tensor& x, const Tensor& out) {
  dispatch_float(x.dtype(), "reduce", [&](auto tag) {
    using T = decltype(tag);
    launch_kernel(dim3(device::kPartials), dim3(device::kPartialThreads), 0, reduce_partials_kernel<T>, x.data<T>(),
                  x.numel(), op == ReduceOp::SumSquares);
  });
  launch_kernel(dim3(1), dim3(device::kPartials), 0, total_to_kernel, out.data<float>());
}

void sum_leading(const Tensor& x, const Tensor& out, Accumulate accumulate, const Tensor& workspace) {
  const int64_t cols = out.size(0), rows = cols ? x.numel() / cols : 0;
  if (cols == 0) return;
  const ColumnSplit split = column_split(rows, cols);
  HR_CHECK(workspace.nbytes() >= column_sums_workspace_bytes(rows, cols, 1),
           "[sum_leading] the workspace is smaller than its sizing rule");
  double* partial = static_cast<double*>(workspace.data_ptr());
  dispatch_float(x.dtype(), "sum_leading", [&](auto tag) {
    using T = decltype(tag);
    launch_kernel(column_partials_grid("sum_leading", split), column_partials_block(), 0,
                  sum_leading_partials_kernel<T>, x.data<T>(), partial, rows, cols, split);
  });
  dispatch_float(out.dtype(), "sum_leading", [&](auto otag) {
    using O = decltype(otag);
    launch_elements("sum_leading", cols, sum_leading_total_kernel<O>, partial, out.data<O>(), split.partials, cols,
                    accumulate == Accumulate::Yes);
  });
}

}  // namespace hr::cuda
