// CPU GEMM through oneDNN matmul: strided (transposed) views, f32 accumulation, scratchpad from our allocator.
// Where oneDNN has only its slow reference kernel for a dtype (bf16/f16 on CPUs without native support),
// the operands are converted to f32 in the workspace and the fast f32 kernel runs instead.
#include <map>
#include <mutex>
#include <string>

#include <oneapi/dnnl/dnnl.hpp>

#include "core/backend/cpu/cpu_common.h"
#include "core/backend/cpu/cpu_kernels.h"

namespace hr::cpu {

namespace {

using dnnl::memory;

memory::data_type dnnl_type(DType t) {
  switch (t) {
    case DType::F32: return memory::data_type::f32;
    case DType::BF16: return memory::data_type::bf16;
    case DType::F16: return memory::data_type::f16;
    default: throw Error(str("[gemm] unsupported dtype ", core::dtype_name(t)));
  }
}

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// How one GEMM runs: either natively, or with f32 copies of the non-f32 operands in the workspace.
struct Plan {
  bool convert = false;
  std::size_t a_bytes = 0, b_bytes = 0, c_bytes = 0, scratch_bytes = 0;
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
  std::size_t total() const { return a_bytes + b_bytes + c_bytes + scratch_bytes; }
};

dnnl::matmul::primitive_desc make_pd(const GemmDesc& d, DType at, DType bt, DType ct, bool contiguous_ab) {
  const int64_t ab = d.a_strides[0] == 0 ? 1 : d.batch, bb = d.b_strides[0] == 0 ? 1 : d.batch;
  // A batch of one gets a non-zero batch stride: oneDNN 2.6 drops to its reference kernel on stride 0.
  memory::dims a_str = {ab == 1 ? d.m * d.k : d.a_strides[0], d.a_strides[1], d.a_strides[2]};
  memory::dims b_str = {bb == 1 ? d.k * d.n : d.b_strides[0], d.b_strides[1], d.b_strides[2]};
  if (contiguous_ab) {
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

bool is_reference(const dnnl::matmul::primitive_desc& pd) {
  return std::string(pd.impl_info_str()).find("ref") != std::string::npos;
}

std::string key_of(const GemmDesc& d) {
  return str(d.batch, ',', d.m, ',', d.n, ',', d.k, ',', int(d.a_dtype), int(d.b_dtype), int(d.c_dtype), ',',
             d.a_strides[0], ',', d.a_strides[1], ',', d.a_strides[2], ',', d.b_strides[0], ',', d.b_strides[1], ',',
             d.b_strides[2], ',', d.alpha, ',', d.beta);
}

Plan& plan_for(const GemmDesc& d) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<Plan>> cache;
  const std::string key = key_of(d);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;
  auto p = std::make_unique<Plan>();
  const bool all_f32 = d.a_dtype == DType::F32 && d.b_dtype == DType::F32 && d.c_dtype == DType::F32;
  bool native = false;
  if (all_f32 || d.a_dtype == d.b_dtype) {
    try {
      p->pd = make_pd(d, d.a_dtype, d.b_dtype, d.c_dtype, false);
      native = !is_reference(p->pd);
    } catch (const dnnl::error&) {
      native = false;
    }
  }
  if (!native) {
    p->convert = true;
    const int64_t ab = d.a_strides[0] == 0 ? 1 : d.batch, bb = d.b_strides[0] == 0 ? 1 : d.batch;
    p->a_bytes = WorkspaceCarver::bytes(std::size_t(ab * d.m * d.k));
    p->b_bytes = WorkspaceCarver::bytes(std::size_t(bb * d.k * d.n));
    p->c_bytes = d.c_dtype == DType::F32 ? 0 : WorkspaceCarver::bytes(std::size_t(d.batch * d.m * d.n));
    p->pd = make_pd(d, DType::F32, DType::F32, DType::F32, true);
  }
  p->scratch_bytes = p->pd.scratchpad_desc().get_size();
  p->prim = dnnl::matmul(p->pd);
  Plan& ref = *p;
  cache.emplace(key, std::move(p));
  return ref;
}

// Contiguous f32 copy of a strided 3-D operand into `dst`.
void to_f32(const Tensor& src, int64_t batch, float* dst) {
  Tensor view = src;
  if (view.size(0) != batch) view = src.slice(0, 0, 1);
  Tensor out = Tensor::wrap(dst, view.shape(), DType::F32, core::Device::host(), nullptr);
  copy(out, view);
}

}  // namespace

std::size_t gemm_workspace_bytes(const GemmDesc& d) {
  if (d.batch * d.m * d.n == 0) return 0;
  return plan_for(d).total();
}

void gemm(const GemmArgs& g) {
  const GemmDesc& d = g.desc;
  Plan& p = plan_for(d);
  char* ws = g.workspace.defined() ? static_cast<char*>(g.workspace.data_ptr()) : nullptr;
  HR_ASSERT(!p.total() || (ws && g.workspace.nbytes() >= p.total()), "gemm workspace too small");
  dnnl::stream stream(engine());
  const dnnl::engine& e = engine();
  void* a_ptr = g.a.data_ptr();
  void* b_ptr = g.b.data_ptr();
  void* c_ptr = g.c.data_ptr();
  float* c32 = nullptr;
  if (p.convert) {
    float* a32 = reinterpret_cast<float*>(ws);
    float* b32 = reinterpret_cast<float*>(ws + p.a_bytes);
    to_f32(g.a, d.a_strides[0] == 0 ? 1 : d.batch, a32);
    to_f32(g.b, d.b_strides[0] == 0 ? 1 : d.batch, b32);
    a_ptr = a32;
    b_ptr = b32;
    if (p.c_bytes) {
      c32 = reinterpret_cast<float*>(ws + p.a_bytes + p.b_bytes);
      if (d.beta != 0.f) copy(Tensor::wrap(c32, g.c.shape(), DType::F32, core::Device::host(), nullptr), g.c);
      c_ptr = c32;
    }
  }
  memory a_mem(p.pd.src_desc(), e, a_ptr);
  memory b_mem(p.pd.weights_desc(), e, b_ptr);
  memory c_mem(p.pd.dst_desc(), e, c_ptr);
  std::unordered_map<int, memory> io = {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}};
  if (p.scratch_bytes) io.insert({DNNL_ARG_SCRATCHPAD, memory(p.pd.scratchpad_desc(), e, ws + p.a_bytes + p.b_bytes + p.c_bytes)});
  p.prim.execute(stream, io);
  stream.wait();
  if (c32) copy(g.c, Tensor::wrap(c32, g.c.shape(), DType::F32, core::Device::host(), nullptr));
}

}  // namespace hr::cpu
