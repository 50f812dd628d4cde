// CUDA reductions: whole-tensor sum / sum of squares and sums over leading dims, the twins of
// backend/cpu/reduce.cpp, in a fixed order (double accumulators; no atomics). A whole-tensor sum runs as a fixed
// grid whose block sums land in a buffer of this file's own (device/partials.cuh), then one block adds them.
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

template <typename T, typename O>
__global__ void sum_leading_kernel(const T* x, O* out, long long rows, long long cols, bool accumulate) {
  const long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  double s = 0.0;
  for (long long r = 0; r < rows; ++r) s += load(x, r * cols + c);
  store(out, c, (accumulate ? load(out, c) : 0.f) + float(s));
}

__global__ void total_to_kernel(float* out) {
  const double t = device::total_of_partials();
  if (threadIdx.x == 0) out[0] = float(t);
}

}  // namespace

void reduce_all(ReduceOp op, const Tensor& x, const Tensor& out) {
  dispatch_float(x.dtype(), "reduce", [&](auto tag) {
    using T = decltype(tag);
    reduce_partials_kernel<<<device::kPartials, device::kPartialThreads, 0, stream()>>>(x.data<T>(), x.numel(),
                                                                                        op == ReduceOp::SumSquares);
  });
  total_to_kernel<<<1, device::kPartials, 0, stream()>>>(out.data<float>());
  HR_CUDA_CHECK(cudaGetLastError());
}

void sum_leading(const Tensor& x, const Tensor& out, bool accumulate) {
  const int64_t cols = out.size(0), rows = cols ? x.numel() / cols : 0;
  if (cols == 0) return;
  dispatch_float(x.dtype(), "sum_leading", [&](auto tag) {
    using T = decltype(tag);
    dispatch_float(out.dtype(), "sum_leading", [&](auto otag) {
      using O = decltype(otag);
      sum_leading_kernel<<<blocks_for(cols), kThreads, 0, stream()>>>(x.data<T>(), out.data<O>(), rows, cols,
                                                                      accumulate);
    });
  });
  HR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hr::cuda
