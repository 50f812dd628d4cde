// CUDA GEMM through cuBLASLt with f32 compute (bf16 and f16 inputs accumulate in f32). Row-major C = A B is
// computed as the column-major C^T = B^T A^T; a transposed view is an op flag, never a copy, and batches are
// strided layouts (a batch stride of 0 broadcasts). Operands of two different dtypes are staged in the workspace
// in one: f32 when C is f32, else C's 16-bit type (cuBLAS has no f32-input GEMM with a 16-bit output). cuBLASLt works
// in the scratchpad the op allocates from the caching allocator (both sized in sizing.cpp, the scratchpad by the
// GPU's architecture: sizing_rules.h) and is told its size, so it never allocates on its own. The chosen algorithm is
// cached per shape; a shape cuBLASLt's heuristic has no algorithm for goes through cublasGemmStridedBatchedEx in the
// same scratchpad.
#include <cublasLt.h>

#include <memory>
#include <mutex>
#include <tuple>

#include "core/backend/cuda/cuda_common.h"
#include "core/backend/cuda/cuda_kernels.h"
#include "core/backend/cuda/cudnn_attention.h"
#include "core/lru_map.h"

#define HR_CUBLASLT_CHECK(call) HR_CUBLAS_CHECK(call)

namespace hr::cuda {

namespace {

cublasHandle_t handle() {
  static std::once_flag once;
  static cublasHandle_t h;
  std::call_once(once, [] { HR_CUBLAS_CHECK(cublasCreate(&h)); });
  return h;
}

cublasLtHandle_t lt_handle() {
  static std::once_flag once;
  static cublasLtHandle_t h;
  std::call_once(once, [] { HR_CUBLASLT_CHECK(cublasLtCreate(&h)); });
  return h;
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32:
      return CUDA_R_32F;
    case DType::BF16:
      return CUDA_R_16BF;
    case DType::F16:
      return CUDA_R_16F;
    default:
      throw Error(str("[gemm] unsupported dtype ", core::dtype_name(t), " on CUDA"));
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

// One column-major cuBLASLt problem: D (n x m) = alpha op(B) op(A) + beta C, batched.
struct LtProblem {
  int op_b, op_a;
  long long n, m, k, ld_b, ld_a, stride_b, stride_a, batch;
  int type_b, type_a, type_c;
  bool accumulate;
  uint32_t align_b, align_a, align_c;  // the pointers' alignment: the heuristic assumes 256 bytes unless told
  std::size_t workspace;               // the scratchpad's bytes: the heuristic keeps to algorithms within it
  auto key() const {
    return std::make_tuple(op_b, op_a, n, m, k, ld_b, ld_a, stride_b, stride_a, batch, type_b, type_a, type_c,
                           accumulate, align_b, align_a, align_c, workspace);
  }
};

// The descriptors and algorithm of one shape, made once.
class LtPlan {
 public:
  explicit LtPlan(const LtProblem& p) {
    HR_CUBLASLT_CHECK(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = cublasOperation_t(p.op_b), tb = cublasOperation_t(p.op_a);
    HR_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    HR_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    // Column-major storage shapes: op(X) is rows x cols, so X is stored as (rows x cols) or its transpose.
    const bool tb_ = p.op_b == CUBLAS_OP_T, ta_ = p.op_a == CUBLAS_OP_T;
    layout(&b_, cudaDataType_t(p.type_b), tb_ ? p.k : p.n, tb_ ? p.n : p.k, p.ld_b, p.stride_b, p.batch);
    layout(&a_, cudaDataType_t(p.type_a), ta_ ? p.m : p.k, ta_ ? p.k : p.m, p.ld_a, p.stride_a, p.batch);
    layout(&c_, cudaDataType_t(p.type_c), p.n, p.m, p.n, p.n * p.m, p.batch);
    cublasLtMatmulPreference_t pref;
    HR_CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const std::size_t limit = p.workspace;
    HR_CUBLASLT_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &limit, sizeof(limit)));
    // cuBLASLt's A is our B (and the other way round); C and D are the same buffer.
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, p.align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, p.align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, p.align_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, p.align_c}};
    for (const auto& [attr, bytes] : aligns)
      HR_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &bytes, sizeof(bytes)));
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(lt_handle(), desc_, b_, a_, c_, c_, pref, 1, &heuristic_, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    usable_ = st == CUBLAS_STATUS_SUCCESS && found > 0 && heuristic_.workspaceSize <= p.workspace;
    workspace_ = p.workspace;
  }
  LtPlan(const LtPlan&) = delete;
  LtPlan& operator=(const LtPlan&) = delete;
  ~LtPlan() {
    if (a_) cublasLtMatrixLayoutDestroy(a_);
    if (b_) cublasLtMatrixLayoutDestroy(b_);
    if (c_) cublasLtMatrixLayoutDestroy(c_);
    if (desc_) cublasLtMatmulDescDestroy(desc_);
  }
  bool usable() const { return usable_; }
  void run(const float* alpha, const void* b, const void* a, const float* beta, void* c, void* workspace) const {
    HR_CUBLASLT_CHECK(cublasLtMatmul(lt_handle(), desc_, alpha, b, b_, a, a_, beta, c, c_, c, c_, &heuristic_.algo,
                                     workspace, workspace_, stream()));
  }

 private:
  static void layout(cublasLtMatrixLayout_t* out, cudaDataType_t type, long long rows, long long cols, long long ld,
                     long long batch_stride, long long batch) {
    HR_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(out, type, uint64_t(rows), uint64_t(cols), ld));
    const int32_t count = int32_t(batch);
    HR_CUBLASLT_CHECK(
        cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    HR_CUBLASLT_CHECK(cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride,
                                                       sizeof(batch_stride)));
  }

  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr;
  cublasLtMatmulHeuristicResult_t heuristic_{};
  std::size_t workspace_ = 0;
  bool usable_ = false;
};

uint32_t alignment(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t bytes = 256;
  while (bytes > 1 && address % bytes) bytes /= 2;
  return bytes;
}

std::shared_ptr<const LtPlan> plan_for(const LtProblem& p) {
  static std::mutex mu;
  static core::LruMap<decltype(p.key()), std::shared_ptr<const LtPlan>> plans(256);
  std::lock_guard<std::mutex> lock(mu);
  return plans.get(p.key(), [&] { return std::make_shared<const LtPlan>(p); });
}

}  // namespace

void create_library_handles() {
  handle();
  lt_handle();
  create_cudnn_handle();
  start_op_profile();
}

void gemm(const GemmArgs& g) {
  const GemmDesc& d = g.desc;
  HR_CHECK(g.scratchpad.defined() && g.scratchpad.nbytes() > 0, "[gemm] cuBLASLt needs a scratchpad (sizing.cpp)");
  const std::size_t scratch = g.scratchpad.nbytes();
  if (d.m == 0 || d.n == 0 || d.batch == 0) return;
  if (d.k == 0) {  // C = beta C: no product to run
    if (d.beta == 0.f)
      fill(g.c, 0.f);
    else
      axpby(g.c, d.beta, g.c, 0.f, g.c);
    return;
  }
  char* ws = g.workspace.defined() ? static_cast<char*>(g.workspace.data_ptr()) : nullptr;
  Tensor a = g.a, b = g.b;
  int64_t as[3] = {d.a_strides[0], d.a_strides[1], d.a_strides[2]};
  int64_t bs[3] = {d.b_strides[0], d.b_strides[1], d.b_strides[2]};
  std::size_t at = 0;
  auto stage = [&](Tensor& t, int64_t* st, DType to) {  // t as a contiguous `to` copy in the workspace
    const int64_t batch = st[0] ? t.size(0) : 1;
    Tensor view = st[0] ? t : t.slice(0, 0, 1);
    Tensor w = Tensor::wrap(ws + at, view.shape(), to, t.device(), nullptr);
    copy(w, view);
    at += (std::size_t(batch * view.size(1) * view.size(2)) * core::dtype_size(to) + 255) / 256 * 256;
    st[0] = st[0] ? view.size(1) * view.size(2) : 0;
    st[1] = view.size(2);
    st[2] = 1;
    t = w;
  };
  if (d.a_dtype != d.b_dtype) {  // the same rule as sizing.cpp's gemm_bytes
    const DType common = d.c_dtype;
    if (d.a_dtype != common) stage(a, as, common);
    if (d.b_dtype != common) stage(b, bs, common);
  }
  // Column-major: C^T (n x m) = B^T (n x k) * A^T (k x m).
  Operand ob = as_operand(bs, d.k, d.n, "b"), oa = as_operand(as, d.m, d.k, "a");
  const float alpha = d.alpha, beta = d.beta;
  const LtProblem p{int(ob.op),
                    int(oa.op),
                    d.n,
                    d.m,
                    d.k,
                    ob.ld,
                    oa.ld,
                    bs[0],
                    as[0],
                    d.batch,
                    int(cuda_type(b.dtype())),
                    int(cuda_type(a.dtype())),
                    int(cuda_type(d.c_dtype)),
                    beta != 0.f,
                    alignment(b.data_ptr()),
                    alignment(a.data_ptr()),
                    alignment(g.c.data_ptr()),
                    scratch};
  const std::shared_ptr<const LtPlan> plan = plan_for(p);
  if (plan->usable()) {
    plan->run(&alpha, b.data_ptr(), a.data_ptr(), &beta, g.c.data_ptr(), g.scratchpad.data_ptr());
    return;
  }
  // In this order: cublasSetStream puts cuBLAS back on its own workspace pool (cudaMalloc'd, outside the allocator).
  HR_CUBLAS_CHECK(cublasSetStream(handle(), stream()));
  HR_CUBLAS_CHECK(cublasSetWorkspace(handle(), g.scratchpad.data_ptr(), scratch));
  HR_CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle(), ob.op, oa.op, int(d.n), int(d.m), int(d.k), &alpha, b.data_ptr(),
                                             cuda_type(b.dtype()), ob.ld, bs[0], a.data_ptr(), cuda_type(a.dtype()),
                                             oa.ld, as[0], &beta, g.c.data_ptr(), cuda_type(d.c_dtype), d.n, d.m * d.n,
                                             int(d.batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace hr::cuda
