// CPU GEMM: oneDNN's brgemm matmul where the CPU has it, headroom's packed GEMM where it has not. Every
// byte either uses comes from the caching allocator: oneDNN runs with scratchpad_mode::user and is handed
// the scratchpad its primitive descriptor asks for; the packed GEMM is handed the one its blocking asks for.
// oneDNN's other fast path, gemm:jit, mallocs packing buffers of its own on every call and is never used.
//
// Which path runs, for one GEMM and one thread count (the primitive's scratchpad depends on both):
//   1. oneDNN has a brgemm kernel for these dtypes and strides        -> that kernel;
//   2. it has one for contiguous f32 only (bf16 without AVX512-BF16)  -> f32 copies of the operands in the
//      workspace, then that kernel (and the f32 result cast back when C is not f32);
//   3. it has none (AVX2 and below)                                   -> the packed GEMM, any dtypes.
#include <array>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <vector>

#include "core/backend/cpu/cpu_common.h"
#include "core/backend/cpu/cpu_kernels.h"
#include "core/backend/cpu/packed_gemm.h"
#include "core/lru_map.h"

namespace hr::cpu {

namespace {

using dnnl::memory;

memory::data_type dnnl_type(DType t) {
  switch (t) {
    case DType::F32:
      return memory::data_type::f32;
    case DType::BF16:
      return memory::data_type::bf16;
    case DType::F16:
      return memory::data_type::f16;
    default:
      throw Error(str("[gemm] unsupported dtype ", core::dtype_name(t)));
  }
}

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::stream& stream() {
  static dnnl::stream s(engine());
  return s;
}

enum class Path : uint8_t { Brgemm, ConvertThenBrgemm, Packed };

// How one GEMM runs, decided once per (desc, threads). The oneDNN memory objects and argument map are
// built here too, so a call only points them at its buffers: running a GEMM allocates nothing.
struct Plan {
  Path path = Path::Packed;
  std::size_t a_bytes = 0, b_bytes = 0, c_bytes = 0;  // f32 copies of A, B (and C when it is not f32)
  std::size_t scratchpad_bytes = 0;
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
  memory a_mem, b_mem, c_mem, s_mem;
  std::vector<dnnl_exec_arg_t> args;  // for dnnl_primitive_execute: no container is built per call
  PackedGemmBlocking blocking;
  std::size_t conversion_bytes() const { return a_bytes + b_bytes + c_bytes; }
};

int64_t operand_batch(int64_t stride0, int64_t batch) {
  return stride0 == 0 ? 1 : batch;
}

// A matmul primitive descriptor with the desc's strides, or contiguous operands when `contiguous`.
dnnl::matmul::primitive_desc make_pd(const GemmDesc& d, DType at, DType bt, DType ct, bool contiguous) {
  const int64_t ab = operand_batch(d.a_strides[0], d.batch), bb = operand_batch(d.b_strides[0], d.batch);
  // A batch of one gets a non-zero batch stride: oneDNN 2.6 drops to its reference kernel on stride 0.
  memory::dims a_str = {ab == 1 ? d.m * d.k : d.a_strides[0], d.a_strides[1], d.a_strides[2]};
  memory::dims b_str = {bb == 1 ? d.k * d.n : d.b_strides[0], d.b_strides[1], d.b_strides[2]};
  if (contiguous) {
    a_str = {d.m * d.k, d.k, 1};
    b_str = {d.k * d.n, d.n, 1};
  }
  memory::desc a_md({ab, d.m, d.k}, dnnl_type(at), a_str);
  memory::desc b_md({bb, d.k, d.n}, dnnl_type(bt), b_str);
  memory::desc c_md({d.batch, d.m, d.n}, dnnl_type(ct), memory::dims{d.m * d.n, d.n, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (d.alpha != 1.f) attr.set_output_scales(0, {d.alpha});
  if (d.beta != 0.f) {
    dnnl::post_ops po;
    po.append_sum(d.beta);
    attr.set_post_ops(po);
  }
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, engine());
}

// The brgemm primitive descriptor for these operands, if oneDNN has one (brgemm kernels take all their
// memory from the scratchpad; anything else it offers is gemm:jit, which mallocs, or its reference loops).
std::optional<dnnl::matmul::primitive_desc> brgemm_pd(const GemmDesc& d, DType at, DType bt, DType ct,
                                                      bool contiguous) {
  try {
    auto pd = make_pd(d, at, bt, ct, contiguous);
    if (std::string(pd.impl_info_str()).rfind("brg", 0) == 0) return pd;
  } catch (const dnnl::error&) {
  }
  return std::nullopt;
}

// A plan's identity: the desc and the thread count. A plain value, so looking a plan up allocates nothing.
struct Key {
  std::array<int64_t, 14> dims;  // batch, m, n, k, dtypes, strides
  float alpha, beta;
  int threads;
  auto operator<=>(const Key&) const = default;
};

Key key_of(const GemmDesc& d, int threads) {
  return {{d.batch, d.m, d.n, d.k, int64_t(d.a_dtype), int64_t(d.b_dtype), int64_t(d.c_dtype), d.a_strides[0],
           d.a_strides[1], d.a_strides[2], d.b_strides[0], d.b_strides[1], d.b_strides[2], 0},
          d.alpha,
          d.beta,
          threads};
}

void bind_onednn(Plan& p) {
  const dnnl::engine& e = engine();
  p.a_mem = memory(p.pd.src_desc(), e, DNNL_MEMORY_NONE);
  p.b_mem = memory(p.pd.weights_desc(), e, DNNL_MEMORY_NONE);
  p.c_mem = memory(p.pd.dst_desc(), e, DNNL_MEMORY_NONE);
  p.args = {{DNNL_ARG_SRC, p.a_mem.get()}, {DNNL_ARG_WEIGHTS, p.b_mem.get()}, {DNNL_ARG_DST, p.c_mem.get()}};
  if (p.scratchpad_bytes) {
    p.s_mem = memory(p.pd.scratchpad_desc(), e, DNNL_MEMORY_NONE);
    p.args.push_back({DNNL_ARG_SCRATCHPAD, p.s_mem.get()});
  }
  p.prim = dnnl::matmul(p.pd);
}

std::unique_ptr<Plan> make_plan(const GemmDesc& d, int threads) {
  auto p = std::make_unique<Plan>();
  const bool one_dtype = d.a_dtype == d.b_dtype;
  if (auto pd = one_dtype ? brgemm_pd(d, d.a_dtype, d.b_dtype, d.c_dtype, false) : std::nullopt) {
    p->path = Path::Brgemm;
    p->pd = *pd;
  } else if (auto pd32 = brgemm_pd(d, DType::F32, DType::F32, DType::F32, true)) {
    p->path = Path::ConvertThenBrgemm;
    p->pd = *pd32;
    p->a_bytes = WorkspaceCarver::bytes(std::size_t(operand_batch(d.a_strides[0], d.batch) * d.m * d.k));
    p->b_bytes = WorkspaceCarver::bytes(std::size_t(operand_batch(d.b_strides[0], d.batch) * d.k * d.n));
    p->c_bytes = d.c_dtype == DType::F32 ? 0 : WorkspaceCarver::bytes(std::size_t(d.batch * d.m * d.n));
  } else {
    p->path = Path::Packed;
    p->blocking = packed_gemm_blocking(d, threads);
    p->scratchpad_bytes = p->blocking.scratchpad_bytes();
    return p;
  }
  p->scratchpad_bytes = p->pd.scratchpad_desc().get_size();
  bind_onednn(*p);
  return p;
}

// Plans are made on the thread that runs the ops (oneDNN reads its thread count there) and the most recently
// used kPlanCapacity are kept. Shapes that change from batch to batch (sequence lengths) would otherwise keep a
// JIT-compiled primitive each for the life of the process: host memory that grows with every new length.
// oneDNN's own primitive cache is turned off, so that this is the one cache and evicting a plan frees it.
constexpr std::size_t kPlanCapacity = 256;

struct PlanCache {
  std::mutex mutex;
  LruMap<Key, std::shared_ptr<Plan>> plans{kPlanCapacity};
  PlanCache() { dnnl::set_primitive_cache_capacity(0); }
};
PlanCache& plan_cache() {
  static PlanCache c;
  return c;
}

std::shared_ptr<Plan> plan_for(const GemmDesc& d) {
  PlanCache& c = plan_cache();
  const int threads = num_threads();
  const Key key = key_of(d, threads);
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.plans.get(key, [&] { return std::shared_ptr<Plan>(make_plan(d, threads)); });
}

// Contiguous f32 copy of a strided (batch, rows, cols) operand. Raw loops: a kernel builds no tensors.
void to_f32(const Tensor& src, const int64_t* strides, int64_t batch, int64_t rows, int64_t cols, float* dst) {
  dispatch_float(src.dtype(), "gemm", [&](auto tag) {
    const auto* p = src.data<decltype(tag)>();
#pragma omp parallel for schedule(static) if (batch * rows * cols > (1 << 16))
    for (int64_t r = 0; r < batch * rows; ++r)
      for (int64_t j = 0; j < cols; ++j)
        dst[r * cols + j] = load(p, r / rows * strides[0] + r % rows * strides[1] + j * strides[2]);
  });
}

// The contiguous C between its dtype and the f32 copy.
void c_to_f32(const Tensor& c, float* dst) {
  dispatch_float(c.dtype(), "gemm", [&](auto tag) {
    const auto* p = c.data<decltype(tag)>();
    for (int64_t i = 0; i < c.numel(); ++i) dst[i] = load(p, i);
  });
}

void c_from_f32(const float* src, const Tensor& c) {
  dispatch_float(c.dtype(), "gemm", [&](auto tag) {
    auto* p = c.data<decltype(tag)>();
    for (int64_t i = 0; i < c.numel(); ++i) store(p, i, src[i]);
  });
}

void run_brgemm(Plan& p, const GemmArgs& g) {
  const GemmDesc& d = g.desc;
  void* a_ptr = g.a.data_ptr();
  void* b_ptr = g.b.data_ptr();
  void* c_ptr = g.c.data_ptr();
  float* c32 = nullptr;
  if (p.path == Path::ConvertThenBrgemm) {
    char* ws = static_cast<char*>(g.workspace.data_ptr());
    float* a32 = reinterpret_cast<float*>(ws);
    float* b32 = reinterpret_cast<float*>(ws + p.a_bytes);
    to_f32(g.a, d.a_strides, operand_batch(d.a_strides[0], d.batch), d.m, d.k, a32);
    to_f32(g.b, d.b_strides, operand_batch(d.b_strides[0], d.batch), d.k, d.n, b32);
    a_ptr = a32;
    b_ptr = b32;
    if (p.c_bytes) {
      c32 = reinterpret_cast<float*>(ws + p.a_bytes + p.b_bytes);
      if (d.beta != 0.f) c_to_f32(g.c, c32);
      c_ptr = c32;
    }
  }
  p.a_mem.set_data_handle(a_ptr);
  p.b_mem.set_data_handle(b_ptr);
  p.c_mem.set_data_handle(c_ptr);
  if (p.scratchpad_bytes) p.s_mem.set_data_handle(g.scratchpad.data_ptr());
  const dnnl_status_t st = dnnl_primitive_execute(p.prim.get(), stream().get(), int(p.args.size()), p.args.data());
  HR_CHECK(st == dnnl_success, "[gemm] oneDNN matmul failed with status ", int(st));
  stream().wait();
  if (c32) c_from_f32(c32, g.c);
}

}  // namespace

std::size_t gemm_workspace_bytes(const GemmDesc& d) {
  if (d.batch * d.m * d.n == 0) return 0;
  return plan_for(d)->conversion_bytes();
}

std::size_t gemm_scratchpad_bytes(const GemmDesc& d) {
  if (d.batch * d.m * d.n == 0) return 0;
  return plan_for(d)->scratchpad_bytes;
}

std::size_t gemm_plans_cached() {
  PlanCache& c = plan_cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.plans.size();
}

const char* gemm_path(const GemmDesc& d) {
  switch (plan_for(d)->path) {
    case Path::Brgemm:
      return "brgemm";
    case Path::ConvertThenBrgemm:
      return "f32 copies + brgemm";
    case Path::Packed:
      return "packed";
  }
  return "?";
}

void gemm(const GemmArgs& g) {
  if (g.desc.batch * g.desc.m * g.desc.n == 0) return;  // no C to write (the sizing functions ask for nothing)
  const std::shared_ptr<Plan> plan = plan_for(g.desc);
  Plan& p = *plan;
  // At least what the sizing functions asked (gemm_within hands a part of a product the whole's).
  HR_ASSERT(p.conversion_bytes() == 0 || (g.workspace.defined() && g.workspace.nbytes() >= p.conversion_bytes()),
            "gemm workspace is smaller than gemm_workspace_bytes sized");
  HR_ASSERT(p.scratchpad_bytes == 0 || (g.scratchpad.defined() && g.scratchpad.nbytes() >= p.scratchpad_bytes),
            "gemm scratchpad is smaller than gemm_scratchpad_bytes sized");
  if (p.path == Path::Packed)
    packed_gemm(g, p.blocking);
  else
    run_brgemm(p, g);
}

}  // namespace hr::cpu
