// CUDA GEMM through cublasGemmStridedBatchedEx with f32 compute. Row-major C = A B is computed as the
// column-major C^T = B^T A^T; a transposed view is an op flag, never a copy. Operands of two different
// dtypes are widened to f32 in the workspace; cuBLAS works in the scratchpad it is given (both sized in
// sizing.cpp), so it never allocates on its own.
#include <mutex>

#include "core/backend/cuda/cuda_common.h"
#include "core/backend/cuda/cuda_kernels.h"

namespace hr::cuda {

namespace {

constexpr std::size_t kCublasWorkspace = std::size_t(4) << 20;  // must match sizing.cpp

cublasHandle_t handle() {
  static std::once_flag once;
  static cublasHandle_t h;
  std::call_once(once, [] { HR_CUBLAS_CHECK(cublasCreate(&h)); });
  return h;
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: throw Error(str("[gemm] unsupported dtype ", core::dtype_name(t), " on CUDA"));
  }
}

// A row-major (rows, cols) operand as cuBLAS sees it: op flag and leading dimension.
struct Operand {
  cublasOperation_t op;
  long long ld;
};

Operand as_operand(const int64_t strides[3], int64_t rows, int64_t cols, const char* name) {
  if (strides[2] == 1 || cols == 1) return {CUBLAS_OP_N, std::max<long long>(strides[1], cols)};
  if (strides[1] == 1 || rows == 1) return {CUBLAS_OP_T, std::max<long long>(strides[2], rows)};
  throw Error(str("[gemm] operand ", name, " has no unit stride; make it contiguous first"));
}

}  // namespace

void create_library_handles() { handle(); }

void gemm(const GemmArgs& g) {
  const GemmDesc& d = g.desc;
  HR_CHECK(g.scratchpad.defined() && g.scratchpad.nbytes() >= kCublasWorkspace, "[gemm] cuBLAS needs a ",
           kCublasWorkspace, "-byte scratchpad");
  HR_CUBLAS_CHECK(cublasSetWorkspace(handle(), g.scratchpad.data_ptr(), kCublasWorkspace));
  char* ws = g.workspace.defined() ? static_cast<char*>(g.workspace.data_ptr()) : nullptr;
  HR_CUBLAS_CHECK(cublasSetStream(handle(), stream()));
  Tensor a = g.a, b = g.b;
  int64_t as[3] = {d.a_strides[0], d.a_strides[1], d.a_strides[2]};
  int64_t bs[3] = {d.b_strides[0], d.b_strides[1], d.b_strides[2]};
  std::size_t at = 0;
  auto widen = [&](Tensor& t, int64_t* st) {
    const int64_t batch = st[0] ? t.size(0) : 1;
    Tensor view = st[0] ? t : t.slice(0, 0, 1);
    Tensor w = Tensor::wrap(ws + at, view.shape(), DType::F32, t.device(), nullptr);
    copy(w, view);
    at += (std::size_t(batch * view.size(1) * view.size(2)) * 4 + 255) / 256 * 256;
    st[0] = st[0] ? view.size(1) * view.size(2) : 0;
    st[1] = view.size(2);
    st[2] = 1;
    t = w;
  };
  if (d.a_dtype != d.b_dtype) {
    if (d.a_dtype != DType::F32) widen(a, as);
    if (d.b_dtype != DType::F32) widen(b, bs);
  }
  // Column-major: C^T (n x m) = B^T (n x k) * A^T (k x m).
  Operand ob = as_operand(bs, d.k, d.n, "b"), oa = as_operand(as, d.m, d.k, "a");
  const float alpha = d.alpha, beta = d.beta;
  HR_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle(), ob.op, oa.op, int(d.n), int(d.m), int(d.k), &alpha, b.data_ptr(), cuda_type(b.dtype()), ob.ld, bs[0],
      a.data_ptr(), cuda_type(a.dtype()), oa.ld, as[0], &beta, g.c.data_ptr(), cuda_type(d.c_dtype), d.n, d.m * d.n,
      int(d.batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace hr::cuda
