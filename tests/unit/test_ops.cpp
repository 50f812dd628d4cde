// The table-driven op test, on every backend of the build (this binary: HR_OPS_BACKEND, "cpu" or "cuda"): for
// every case, forward vs a naive double reference, backward vs central finite differences of that reference,
// in f32 and bf16 (and f16 for the fused kernels and their neighbours); on a backend other than the CPU also forward
// and backward vs the CPU twin; and the meta device, mirroring the backend's workspace sizes, allocates exactly what
// the backend allocates. A kernel a backend lacks is reported at the end, not failed: adding one is the kernel file, a
// registration line, and this table.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>

#include "core/backend/cpu/cpu_kernels.h"
#include "core/backend/cuda/attention_path.h"
#include "core/backend/device_info.h"
#include "core/backend/kernels.h"
#include "core/memory/device_memory.h"
#include "core/ops/attention.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/elementwise.h"
#include "core/ops/reduce.h"
#include "op_cases.h"

using namespace hr;
using namespace hr::core;
using hr::test::OpCase;

namespace hr::core {
void PrintTo(DType t, std::ostream* os) {
  *os << dtype_name(t);
}
}  // namespace hr::core
using hr::test::make_tensors;
using hr::test::round_to;
using hr::test::rounded_inputs;
using hr::test::Values;

namespace {

// The backend this binary tests and whose kernels it reports missing.
const Device kBackend = std::string(HR_OPS_BACKEND) == "cuda" ? Device::cuda() : Device::cpu();
const Backend kBackendKind = kBackend.type == DeviceType::CUDA ? Backend::CUDA : Backend::CPU;

std::vector<std::string>& missing() {
  static std::vector<std::string> m;
  return m;
}

// Which attention kernel each attention case ran on a GPU ("attention_mha bf16 forward: cuDNN").
std::vector<std::string>& attention_paths() {
  static std::vector<std::string> p;
  return p;
}

// On a GPU: the kernel the case's last attention call ran, noted for the report and held to what the shape must
// take: cuDNN where cuDNN admits the shape and its graph builds here (unless HR_CUDNN_ATTENTION=0), the own tiled
// kernels for other training shapes, the own per-row kernel for a KV cache.
void check_attention_kernel(const hr::test::OpCase& c, DType dt, AttentionPass pass) {
  if (kBackend.type != DeviceType::CUDA || !c.attention || c.empty) return;
  AttentionDesc d = *c.attention;
  d.dtype = dt;
  const char* off = std::getenv("HR_CUDNN_ATTENTION");
  const bool on = !(off && std::strcmp(off, "0") == 0);
  std::size_t workspace = 0;
  const CudnnAttentionQuery query = cudnn_attention_query();
  const AttentionPass taken = c.kv_cache ? AttentionPass::Cached : pass;  // a KV cache's queries
  const bool cudnn = on && cudnn_attention_admits(d, taken) && query && query(d, taken, &workspace);
  const AttentionKernel want = cudnn        ? AttentionKernel::Cudnn
                               : c.kv_cache ? AttentionKernel::Rows
                                            : AttentionKernel::Tiled;
  const AttentionKernel got = last_attention_kernel();
  const char* what = pass == AttentionPass::Backward ? "backward" : "forward";
  attention_paths().push_back(str(c.name, " ", dtype_name(dt), " ", what, ": ", attention_kernel_name(got)));
  EXPECT_EQ(attention_kernel_name(got), std::string(attention_kernel_name(want)))
      << c.name << " " << dtype_name(dt) << " " << what << " ran another attention kernel than its shape takes";
}

// Runs `body`; an op the backend has no kernel for is noted ("[op] has no X implementation") and ends the
// test quietly. Anything else propagates.
template <typename F>
bool runs(const std::string& what, F&& body) {
  try {
    body();
    return true;
  } catch (const Error& e) {
    const std::string m = e.what();
    if (m.find(" implementation") == std::string::npos || m.find("] has no ") == std::string::npos) throw;
    missing().push_back(what + ": " + m.substr(0, m.find(" implementation") + 15));
    return false;
  }
}

// On the backend, from host values; and back on the host for comparing.
std::vector<Tensor> on_backend(const std::vector<Tensor>& t) {
  std::vector<Tensor> out;
  for (const Tensor& x : t) out.push_back(x.device() == kBackend ? x : x.to(kBackend));
  return out;
}
std::vector<float> host_floats(const Tensor& t) {
  return t.device() == Device::cpu() ? t.to_floats() : t.to(Device::cpu()).to_floats();
}

// Which backends this build runs the table on, said once per run.
class Report : public testing::Environment {
 public:
  void SetUp() override {
    std::printf("op table: backend %s in this binary; %s\n", HR_OPS_BACKEND,
                have_cuda_build() ? "the CUDA back-end is built: test_ops_cuda (ctest -L gpu) runs the table on a GPU"
                                  : "no CUDA back-end in this build: the table ran on the CPU only");
    if (kBackend.type == DeviceType::CPU) return;
    try {  // one clear failure, not one per case, where the machine has no usable GPU
      // The context and the library handles, as a run starts them: cuDNN registers its sizing query here, so
      // that the table's attention cases take cuDNN where a run would.
      cuda_memory_after_start(0);
      Tensor::zeros({1}, DType::F32, kBackend);
    } catch (const Error& e) {
      FAIL() << "the op table on " << HR_OPS_BACKEND << " needs a usable device: " << e.what();
    }
  }
  void TearDown() override {
    std::printf("op table on %s: %zu case(s) reached a missing kernel\n", HR_OPS_BACKEND, missing().size());
    for (const std::string& m : missing()) std::printf("  %s\n", m.c_str());
    if (!attention_paths().empty()) std::printf("attention kernels on %s:\n", HR_OPS_BACKEND);
    for (const std::string& p : attention_paths()) std::printf("  %s\n", p.c_str());
  }
  static bool have_cuda_build() {
    try {
      cuda_kernels();
      return true;
    } catch (const Error&) {
      return false;
    }
  }
};
const auto* const kReport = testing::AddGlobalTestEnvironment(new Report);

const std::vector<OpCase>& cases() {
  static const std::vector<OpCase> c = hr::test::op_cases();
  return c;
}

const OpCase& find(const std::string& name) {
  for (const OpCase& c : cases())
    if (c.name == name) return c;
  throw Error("no case " + name);
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double e : v) m = std::max(m, std::fabs(e));
  return m;
}

std::string name_of(const testing::TestParamInfo<std::tuple<std::string, DType>>& p) {
  return std::get<0>(p.param) + "_" + dtype_name(std::get<1>(p.param));
}

std::vector<std::string> case_names() {
  std::vector<std::string> n;
  for (const OpCase& c : hr::test::op_cases()) n.push_back(c.name);
  return n;
}

class OpTest : public testing::TestWithParam<std::tuple<std::string, DType>> {};

}  // namespace

TEST_P(OpTest, ForwardMatchesReference) {
  const OpCase& c = find(std::get<0>(GetParam()));
  const DType dt = std::get<1>(GetParam());
  Values v = rounded_inputs(c, dt);
  std::vector<float> got;
  if (!runs(c.name, [&] { got = host_floats(c.forward(on_backend(make_tensors(c, v, dt, Device::cpu())))); })) return;
  check_attention_kernel(c, dt, AttentionPass::Forward);
  std::vector<double> ref = c.reference(v);
  ASSERT_EQ(got.size(), ref.size()) << c.name;
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    double e = std::fabs(double(got[i]) - ref[i]);
    if (e > worst) worst = e, at = i;
  }
  const double tol = dt == DType::F32 ? c.tol_f32 : c.tol_bf16_fwd;
  EXPECT_LE(worst, tol * std::max(max_abs(ref), 1e-6))
      << c.name << ": worst element " << at << " got " << got[at] << " want " << ref[at];
}

namespace {
// An upstream gradient for `out`: seeded values in [-1, 1] rounded to its dtype. Not a constant: under a
// constant one the gradients of softmax and the norms cancel to rounding noise and compare nothing.
std::vector<double> upstream_values(const Tensor& out) {
  std::mt19937 rng(99);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> r(std::size_t(out.numel()));
  for (double& e : r) e = round_to(u(rng), out.dtype());
  return r;
}
Tensor upstream(const Tensor& out, const std::vector<double>& r) {
  return Tensor::from_floats(std::vector<float>(r.begin(), r.end()), out.shape(), out.dtype(), Device::cpu());
}
}  // namespace

TEST_P(OpTest, BackwardMatchesFiniteDifferences) {
  const OpCase& c = find(std::get<0>(GetParam()));
  if (!c.backward) return;  // forward only
  const DType dt = std::get<1>(GetParam());
  Values v = rounded_inputs(c, dt);
  std::vector<Tensor> grads;
  std::vector<double> r;
  if (!runs(c.name, [&] {
        std::vector<Tensor> t = on_backend(make_tensors(c, v, dt, Device::cpu()));
        Tensor out = c.forward(t);
        // Upstream gradient R, rounded to the output dtype; the loss is sum(out * R).
        r = upstream_values(out);
        grads = c.backward(t, upstream(out, r).to(kBackend));
      }))
    return;
  check_attention_kernel(c, dt, AttentionPass::Backward);

  auto loss = [&](const Values& x) {
    std::vector<double> y = c.reference(x);
    double s = 0;
    for (std::size_t i = 0; i < y.size(); ++i) s += y[i] * r[i];
    return s;
  };
  std::size_t g = 0;
  for (std::size_t k = 0; k < c.inputs.size(); ++k) {
    if (!c.inputs[k].differentiable) continue;
    ASSERT_LT(g, grads.size()) << c.name << ": backward returned too few gradients";
    const Tensor& grad = grads[g++];
    ASSERT_EQ(grad.shape(), c.inputs[k].shape) << c.name << " gradient " << k;
    std::vector<float> an = host_floats(grad);
    const int64_t n = int64_t(v[k].size());
    const int64_t step = std::max<int64_t>(1, n / 64);
    std::vector<double> fd, got;
    std::vector<int64_t> where;
    for (int64_t e = (step > 1 ? 7 % step : 0); e < n; e += step) {
      const double h = 1e-5 * std::max(1.0, std::fabs(v[k][e]));
      Values p = v, m = v;
      p[k][e] += h;
      m[k][e] -= h;
      fd.push_back((loss(p) - loss(m)) / (2 * h));
      got.push_back(an[e]);
      where.push_back(e);
    }
    double worst = 0;
    std::size_t at = 0;
    for (std::size_t i = 0; i < fd.size(); ++i) {
      double err = std::fabs(got[i] - fd[i]);
      if (err > worst) worst = err, at = i;
    }
    const double tol = dt == DType::F32 ? c.tol_f32 : c.tol_bf16_bwd;
    EXPECT_LE(worst, tol * std::max(max_abs(fd), 1e-6))
        << c.name << " d(input " << k << ")[" << where[at] << "]: got " << got[at] << ", finite difference " << fd[at];
  }
  EXPECT_EQ(g, grads.size()) << c.name << ": backward returned extra gradients";
}

namespace {
struct Event {
  TraceEvent::Kind kind;
  std::size_t size, requested;
  Category category;
  bool operator==(const Event& o) const {
    return kind == o.kind && size == o.size && requested == o.requested && category == o.category;
  }
};

struct TracedRun {
  std::vector<Event> events;
  int64_t peak_allocated, peak_reserved;
};

TracedRun traced_run(const OpCase& c, DType dt, Device dev) {
  configure_device(dev, {0, kBackendKind});  // a meta device mirrors the backend under test
  auto alloc = allocator_for(dev);
  TracedRun run;
  alloc->set_trace([&](const TraceEvent& e) { run.events.push_back({e.kind, e.size, e.requested, e.category}); });
  {
    Values v = rounded_inputs(c, dt);
    std::vector<Tensor> t = make_tensors(c, v, dt, dev.type == DeviceType::Meta ? dev : Device::cpu());
    if (dev.type != DeviceType::Meta) t = on_backend(t);
    Tensor out = c.forward(t);
    Tensor dy = Tensor::full(out.shape(), 0.5f, out.dtype(), dev);
    std::vector<Tensor> grads = c.backward ? c.backward(t, dy) : std::vector<Tensor>{};
  }
  alloc->set_trace({});
  MemoryStats s = alloc->stats();
  run.peak_allocated = s.allocated_bytes.peak;
  run.peak_reserved = s.reserved_bytes.peak;
  return run;
}
}  // namespace

TEST_P(OpTest, MetaAllocatesExactlyAsTheBackend) {
  const OpCase& c = find(std::get<0>(GetParam()));
  const DType dt = std::get<1>(GetParam());
  TracedRun real;
  if (!runs(c.name, [&] { real = traced_run(c, dt, kBackend); })) return;
  TracedRun meta = traced_run(c, dt, Device::meta());
  if (!c.empty) {
    ASSERT_FALSE(real.events.empty());
  }
  ASSERT_EQ(real.events.size(), meta.events.size()) << c.name;
  for (std::size_t i = 0; i < real.events.size(); ++i)
    ASSERT_TRUE(real.events[i] == meta.events[i])
        << c.name << ": event " << i << " differs: " << HR_OPS_BACKEND << " size " << real.events[i].size
        << " meta size " << meta.events[i].size;
  EXPECT_EQ(real.peak_allocated, meta.peak_allocated);
  EXPECT_EQ(real.peak_reserved, meta.peak_reserved);
}

// A backend other than the CPU against its CPU twin on the same inputs: the output and every gradient.
TEST_P(OpTest, MatchesTheCpuTwin) {
  if (kBackend == Device::cpu()) return;  // the CPU is the twin; the reference checks above are its test
  const OpCase& c = find(std::get<0>(GetParam()));
  const DType dt = std::get<1>(GetParam());
  const Values v = rounded_inputs(c, dt);
  std::vector<Tensor> on_cpu = make_tensors(c, v, dt, Device::cpu());
  Tensor cpu_out = c.forward(on_cpu);
  const Tensor dy = upstream(cpu_out, upstream_values(cpu_out));
  std::vector<Tensor> cpu_grads = c.backward ? c.backward(on_cpu, dy) : std::vector<Tensor>{};
  std::vector<float> out;
  std::vector<std::vector<float>> grads;
  if (!runs(c.name, [&] {
        std::vector<Tensor> t = on_backend(on_cpu);
        out = host_floats(c.forward(t));
        if (c.backward)
          for (const Tensor& g : c.backward(t, dy.to(kBackend))) grads.push_back(host_floats(g));
      }))
    return;
  auto close = [&](const std::vector<float>& got, const std::vector<float>& want, double tol, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double worst = 0, scale = 1e-6;
    for (std::size_t i = 0; i < got.size(); ++i)
      worst = std::max(worst, double(std::fabs(got[i] - want[i]))), scale = std::max(scale, double(std::fabs(want[i])));
    EXPECT_LE(worst, tol * scale) << what;
  };
  close(out, cpu_out.to_floats(), dt == DType::F32 ? c.tol_f32 : c.tol_bf16_fwd, c.name + " forward");
  ASSERT_EQ(grads.size(), cpu_grads.size()) << c.name;
  for (std::size_t i = 0; i < grads.size(); ++i)
    close(grads[i], cpu_grads[i].to_floats(), dt == DType::F32 ? c.tol_f32 : c.tol_bf16_bwd,
          str(c.name, " gradient ", i));
}

INSTANTIATE_TEST_SUITE_P(Ops, OpTest,
                         testing::Combine(testing::ValuesIn(case_names()), testing::Values(DType::F32, DType::BF16)),
                         name_of);

// f16 for the fused kernels and the element-wise passes beside them (RoPE from its table and per call, the residual
// norms and the plain ones, SwiGLU, the activations with and without the bias add, the fused cross-entropy with and
// without skipped chunks, the attention with its masks, grouped heads and KV cache), under the bf16 tolerances:
// f16's wider mantissa meets them.
namespace {
std::vector<std::string> f16_case_names() {
  return {"rope_table",
          "rope",
          "rmsnorm_residual",
          "layernorm_residual",
          "rmsnorm_residual_wide",
          "layernorm_residual_wide",
          "rmsnorm_residual_cols21",
          "layernorm_residual_8192",
          "rmsnorm_wide",
          "layernorm_wide",
          "rmsnorm",
          "layernorm",
          "rmsnorm_cols21",
          "layernorm_cols21",
          "attention_mha",
          "attention_causal_gqa",
          "attention_window_gqa",
          "attention_cached",
          "attention_d40_gqa",
          "swiglu",
          "silu",
          "gelu",
          "gelu_tanh",
          "quick_gelu",
          "gelu_bias",
          "gelu_tanh_bias",
          "quick_gelu_bias",
          "silu_bias",
          "add_broadcast",
          "mul_broadcast",
          "cross_entropy",
          "cross_entropy_labelled_first"};
}
}  // namespace
INSTANTIATE_TEST_SUITE_P(OpsF16, OpTest,
                         testing::Combine(testing::ValuesIn(f16_case_names()), testing::Values(DType::F16)), name_of);

namespace {
// What f throws, or "no error".
template <typename F>
std::string error(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return "no error";
}

// n values of a normal distribution (mean 0, deviation 2) drawn from `seed`.
std::vector<float> normals(int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& e : v) e = nd(rng);
  return v;
}
}  // namespace

// Element-wise ops refuse tensors of different dtypes, naming them (every kernel reads all of them as the first's).
TEST(Elementwise, MixedDtypesAreRefusedByName) {
  const Tensor a = Tensor::full({4, 3}, 1.f, DType::F32, Device::cpu());
  const Tensor b = Tensor::full({4, 3}, 1.f, DType::BF16, Device::cpu());
  EXPECT_NE(error([&] { mul(a, b); }).find("[mul] dtypes differ"), std::string::npos);
  EXPECT_NE(error([&] { add_(a, b, 1.f); }).find("[add_] dtypes differ"), std::string::npos);
  EXPECT_NE(error([&] { swiglu_forward(a, b); }).find("[swiglu] dtypes differ"), std::string::npos);
  EXPECT_NE(error([&] { unary_backward(UnaryOp::Silu, a, b); }).find("[silu] dtypes differ"), std::string::npos);
  EXPECT_EQ(mul(a, a).dtype(), DType::F32);
}

// The bias add fused into the activation's pass gives the unfused ops' bits: the pre-activation it leaves in x is
// add_rows_'s, and y the activation of that, in every dtype, on the back-end under test. 37 rows of 1,001: the
// CPU's stretches and the GPU's packs cross the rows' ends, and 37,037 elements run on every thread. A bias of
// another length, dtype or a strided x is refused by name.
TEST(Elementwise, BiasInTheActivationsPassGivesTheUnfusedBits) {
  const int64_t rows = 37, cols = 1001;
  const std::vector<float> xv = normals(rows * cols, 5), bv = normals(cols, 15);
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (UnaryOp op : {UnaryOp::Gelu, UnaryOp::GeluTanh, UnaryOp::QuickGelu, UnaryOp::Silu}) {
      const Tensor b = Tensor::from_floats(bv, {cols}, dt, Device::cpu()).to(kBackend);
      const Tensor h1 = Tensor::from_floats(xv, {rows, cols}, dt, Device::cpu()).to(kBackend);
      const Tensor h2 = Tensor::from_floats(xv, {rows, cols}, dt, Device::cpu()).to(kBackend);
      add_rows_(h1, b);
      const Tensor y1 = unary_forward(op, h1), y2 = unary_forward(op, h2, b);
      const std::string what = str(unary_name(op), " ", dtype_name(dt));
      ASSERT_EQ(host_floats(h1), host_floats(h2)) << what << " pre-activation";
      ASSERT_EQ(host_floats(y1), host_floats(y2)) << what;
    }
  const Tensor x = Tensor::full({4, 6}, 1.f, DType::F32, kBackend);
  EXPECT_NE(
      error([&] { unary_forward(UnaryOp::Gelu, x, Tensor::full({4}, 1.f, DType::F32, kBackend)); }).find("[gelu] bias"),
      std::string::npos);
  EXPECT_NE(error([&] {
              unary_forward(UnaryOp::Gelu, x, Tensor::full({6}, 1.f, DType::BF16, kBackend));
            }).find("[gelu] dtypes differ"),
            std::string::npos);
  EXPECT_NE(error([&] {
              unary_forward(UnaryOp::Gelu, x.transpose(0, 1), Tensor::full({4}, 1.f, DType::F32, kBackend));
            }).find("must be contiguous"),
            std::string::npos);
}

// The CPU's scalar activations (elementwise.cpp, for a CPU without AVX2 + FMA, where the kernel table does not pick
// vector_math.cpp's) take the bias the same way: the pre-activation is add_rows_'s and the output the scalar
// activation of it, bit for bit; the vector kernels leave the same pre-activation and an output as close as their
// exp, tanh and erf are (GELU far below zero cancels: within 1e-5 (1 + |y|) in f32). The CPU kernels on host
// tensors, whichever back-end this binary tests.
TEST(Elementwise, TheScalarActivationsTakeTheBiasAsTheVectorOnesDo) {
  const int64_t rows = 5, cols = 999;
  const std::vector<float> xv = normals(rows * cols, 6), bv = normals(cols, 16);
  for (DType dt : {DType::F32, DType::BF16})
    for (UnaryOp op : {UnaryOp::Gelu, UnaryOp::GeluTanh, UnaryOp::QuickGelu, UnaryOp::Silu}) {
      const Tensor b = Tensor::from_floats(bv, {cols}, dt, Device::cpu());
      auto fresh = [&] { return Tensor::from_floats(xv, {rows, cols}, dt, Device::cpu()); };
      const Tensor h0 = fresh(), h1 = fresh(), h2 = fresh();
      const Tensor y0 = Tensor::empty({rows, cols}, dt, Device::cpu()), y1 = y0.clone(), y2 = y0.clone();
      add_rows_(h0, b);
      cpu::unary_forward(op, h0, Tensor(), y0);
      cpu::unary_forward(op, h1, b, y1);
      const std::string what = str(unary_name(op), " ", dtype_name(dt));
      ASSERT_EQ(h0.to_floats(), h1.to_floats()) << what << " pre-activation";
      ASSERT_EQ(y0.to_floats(), y1.to_floats()) << what;
      if (!cpu::attention_isa_present()) continue;
      cpu::unary_forward_avx2(op, h2, b, y2);
      ASSERT_EQ(h0.to_floats(), h2.to_floats()) << what << " pre-activation (vector kernel)";
      const std::vector<float> want = y0.to_floats(), got = y2.to_floats();
      for (std::size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(got[i], want[i], (dt == DType::F32 ? 1e-5 : 1e-2) * (std::fabs(want[i]) + 1.0)) << what << " " << i;
    }
}

// The fused cross-entropy's forward and backward on the back-end under test, with the allocator's requests (alloc
// or free, size) in order. Requests only: a segment is reserved by whichever call first needs it (on a GPU, the
// first of a pair), as the cache left it, which no plan depends on. The block dhidden will take from the cache holds
// NaN, so rows the backward does not write show.
struct CrossEntropyRun {
  std::vector<float> loss, dhidden, dweight;
  std::vector<std::pair<std::size_t, std::size_t>> requests;
};
CrossEntropyRun run_cross_entropy(const Tensor& h, const Tensor& w, const Tensor& labels, const CrossEntropyOptions& o,
                                  const CrossEntropyBackwardOptions& bo) {
  CrossEntropyRun out;
  auto alloc = allocator_for(kBackend);
  alloc->set_trace([&](const TraceEvent& e) {
    if (e.kind == TraceEvent::Kind::Alloc || e.kind == TraceEvent::Kind::Free)
      out.requests.emplace_back(std::size_t(e.kind), e.size);
  });
  {
    const CrossEntropyOut saved = cross_entropy_forward(h, w, labels, o);
    const Tensor dloss = Tensor::full({}, 1.f, DType::F32, kBackend);
    Tensor::full(h.shape(), std::nanf(""), h.dtype(), kBackend);
    const CrossEntropyGrads g = cross_entropy_backward(dloss, h, w, labels, saved, o, bo);
    out.loss = host_floats(saved.loss);
    out.dhidden = host_floats(g.dhidden);
    if (bo.weight_grads) out.dweight = host_floats(g.dweight);
  }
  alloc->set_trace({});
  return out;
}

// The fused loss's chunks past the labelled rows (CrossEntropyOptions::labelled_rows) run no product: the loss and
// both gradients are those of running every chunk, bit for bit, and the allocator sees the same requests, so that
// a planned step's layout holds whatever its labels cover. 9 of 40 rows labelled, chunks of 4: three chunks run
// (the third in part), seven are skipped; a weight gradient written fresh and one added into; f32 and bf16, on
// the back-end under test. With no row labelled, a fresh weight gradient is zeros and an added-into one stays.
TEST(CrossEntropy, ChunksWithoutLabelsRunNoProductAndChangeNoBitNorAllocation) {
  const int64_t tokens = 40, d = 16, vocab = 29, labelled = 9;
  std::vector<int64_t> lv(std::size_t(tokens), -100);
  for (int64_t r = 0; r < labelled; ++r) lv[std::size_t(r)] = (r * 7 + 3) % vocab;
  const std::vector<float> hv = normals(tokens * d, 7), wv = normals(vocab * d, 17), gv = normals(vocab * d, 27);
  using Out = CrossEntropyRun;
  auto run = [&](DType dt, int64_t rows, bool into, const std::vector<int64_t>& labels_v) {
    const Tensor h = Tensor::from_floats(hv, {tokens, d}, dt, Device::cpu()).to(kBackend);
    const Tensor w = Tensor::from_floats(wv, {vocab, d}, dt, Device::cpu()).to(kBackend);
    const Tensor labels = Tensor::from_ints(labels_v, {tokens}, DType::I64, kBackend);
    CrossEntropyOptions o;
    o.normalizer = float(labelled);
    o.chunk_rows = 4;
    o.labelled_rows = rows;
    CrossEntropyBackwardOptions bo;
    if (into) {
      bo.accumulate = Accumulate::Yes;
      bo.dweight_into = Tensor::from_floats(gv, {vocab, d}, dt, Device::cpu()).to(kBackend);
    }
    return run_cross_entropy(h, w, labels, o, bo);
  };
  for (DType dt : {DType::F32, DType::BF16})
    for (bool into : {false, true}) {
      const std::string what = str(dtype_name(dt), into ? ", added into a gradient" : ", a fresh gradient");
      const Out all = run(dt, -1, into, lv), skipped = run(dt, labelled, into, lv);
      EXPECT_EQ(all.loss, skipped.loss) << what;
      EXPECT_EQ(all.dhidden, skipped.dhidden) << what;
      EXPECT_EQ(all.dweight, skipped.dweight) << what;
      EXPECT_EQ(all.requests, skipped.requests) << what;
      EXPECT_NE(all.loss.at(0), 0.f) << what;

      const std::vector<int64_t> none(std::size_t(tokens), -100);
      const Out nothing = run(dt, 0, into, none), every = run(dt, -1, into, none);
      EXPECT_EQ(nothing.loss, std::vector<float>{0.f}) << what;
      EXPECT_EQ(nothing.dhidden, std::vector<float>(std::size_t(tokens * d), 0.f)) << what;
      const Tensor g0 = Tensor::from_floats(gv, {vocab, d}, dt, Device::cpu());
      EXPECT_EQ(nothing.dweight, into ? host_floats(g0) : std::vector<float>(std::size_t(vocab * d), 0.f)) << what;
      EXPECT_EQ(nothing.dweight, every.dweight) << what;
      EXPECT_EQ(nothing.requests, every.requests) << what;
    }
  const Tensor h = Tensor::full({4, 3}, 1.f, DType::F32, kBackend), w = Tensor::full({5, 3}, 1.f, DType::F32, kBackend);
  CrossEntropyOptions o;
  o.labelled_rows = 5;
  EXPECT_NE(error([&] {
              cross_entropy_forward(h, w, Tensor::from_ints({0, 1, 2, 3}, {4}, DType::I64, kBackend), o);
            }).find("[cross_entropy] labelled_rows 5 is outside [-1, 4]"),
            std::string::npos);
}

// The chunk the labelled rows end in runs its three products over those rows rounded up to the grain, in the whole
// chunk's allocations: the loss and gradients are those of every row run (to the GEMMs' rounding), and the rows past
// the part are never read. They are NaN here, which any product over them would carry into the weight gradient.
TEST(CrossEntropy, TheChunkTheLabelsEndInRunsItsProductsOverThemAlone) {
  const int64_t tokens = 40, d = 16, vocab = 29, chunk = 16;
  const std::vector<float> hv = normals(tokens * d, 5), wv = normals(vocab * d, 15), gv = normals(vocab * d, 25);
  using Out = CrossEntropyRun;
  auto run = [&](DType dt, int64_t labelled, int64_t grain, int64_t nan_from, bool into, bool weight_grads) {
    std::vector<int64_t> lv(std::size_t(tokens), -100);
    for (int64_t r = 0; r < labelled; ++r) lv[std::size_t(r)] = (r * 5 + 2) % vocab;
    std::vector<float> h = hv;
    for (int64_t i = nan_from * d; i < tokens * d; ++i) h[std::size_t(i)] = std::nanf("");
    const Tensor ht = Tensor::from_floats(h, {tokens, d}, dt, Device::cpu()).to(kBackend);
    const Tensor w = Tensor::from_floats(wv, {vocab, d}, dt, Device::cpu()).to(kBackend);
    const Tensor labels = Tensor::from_ints(lv, {tokens}, DType::I64, kBackend);
    CrossEntropyOptions o;
    o.normalizer = float(labelled);
    o.chunk_rows = chunk;
    o.labelled_rows = nan_from < tokens ? labelled : -1;
    o.row_grain = grain;
    CrossEntropyBackwardOptions bo;
    bo.weight_grads = weight_grads;
    if (into) {
      bo.accumulate = Accumulate::Yes;
      bo.dweight_into = Tensor::from_floats(gv, {vocab, d}, dt, Device::cpu()).to(kBackend);
    }
    return run_cross_entropy(ht, w, labels, o, bo);
  };
  auto expect_near = [](const std::vector<float>& got, const std::vector<float>& want, float tol,
                        const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    float scale = 0.f;
    for (float v : want) scale = std::max(scale, std::fabs(v));
    for (std::size_t i = 0; i < got.size(); ++i)
      ASSERT_LE(std::fabs(got[i] - want[i]), tol * scale) << what << " at " << i << ": " << got[i] << " vs " << want[i];
  };
  for (DType dt : {DType::F32, DType::BF16})
    for (bool into : {false, true})
      for (bool weight_grads : {true, false})
        for (int64_t labelled : {9, 16, 21})
          for (int64_t grain : {1, 4, 5, 64}) {
            if (into && !weight_grads) continue;
            // The part of the chunk the labels end in: whole chunks before it, then the labels rounded up to the
            // grain (the whole chunk where that reaches its end).
            const int64_t last = (labelled - 1) / chunk * chunk;
            const int64_t part = last + std::min(chunk, (labelled - last + grain - 1) / grain * grain);
            const std::string what =
                str(dtype_name(dt), into ? ", added into a gradient" : "", weight_grads ? "" : ", no weight gradient",
                    ", ", labelled, " labelled, grain ", grain, ": products over ", part, " rows");
            const Out all = run(dt, labelled, grain, tokens, into, weight_grads);
            const Out cut = run(dt, labelled, grain, part, into, weight_grads);
            const float tol = dt == DType::F32 ? 1e-5f : 1e-2f;
            expect_near(cut.loss, all.loss, 1e-5f, what);
            expect_near(cut.dhidden, all.dhidden, tol, what);
            expect_near(cut.dweight, all.dweight, tol, what);
            EXPECT_EQ(cut.requests, all.requests) << what;
            for (int64_t i = labelled * d; i < tokens * d; ++i)
              ASSERT_EQ(cut.dhidden[std::size_t(i)], 0.f) << what << " at " << i;
          }
}

// The CPU's sum over leading dims (a bias's gradient) sums each column down its rows in order, in double, then
// rounds once: the bits of a reference that does exactly that, on values whose magnitudes make the order show, over
// a width that is not whole blocks of the kernel's columns, from f32 and bf16, fresh and accumulated.
TEST(SumLeading, EachColumnSumsItsRowsInOrderInDouble) {
  const int64_t rows = 37, cols = 150;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(static_cast<std::size_t>(rows * cols)), start(static_cast<std::size_t>(cols));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = nd(rng) * std::pow(10.f, float(int(i % 9) - 4));
  for (float& x : start) x = nd(rng);
  for (DType dt : {DType::F32, DType::BF16}) {
    const Tensor x = Tensor::from_floats(v, {rows, cols}, dt, Device::cpu());
    const std::vector<float> xv = x.to_floats();
    for (Accumulate acc : {Accumulate::No, Accumulate::Yes}) {
      const Tensor out = Tensor::from_floats(start, {cols}, DType::F32, Device::cpu());
      sum_leading(x, out, acc);
      const std::vector<float> got = out.to_floats();
      for (int64_t c = 0; c < cols; ++c) {
        double s = 0.0;
        for (int64_t r = 0; r < rows; ++r) s += xv[std::size_t(r * cols + c)];
        const float want = (acc == Accumulate::Yes ? start[std::size_t(c)] : 0.f) + float(s);
        ASSERT_EQ(got[std::size_t(c)], want) << dtype_name(dt) << " column " << c;
      }
    }
  }
}

// The kernel list exists once (core/backend/kernel_list.h) and each back-end's table is generated from it: every
// entry is registered, on the CPU, in the CUDA back-end's sizing (which every build has) and, where the build has
// it, in the CUDA back-end itself (its table is built without touching a GPU).
TEST(KernelTable, EveryBackEndRegistersEveryListedKernel) {
  std::vector<const Kernels*> tables = {&cpu_kernels()};
  try {
    tables.push_back(&cuda_kernels());
  } catch (const Error&) {  // no CUDA back-end in this build: its sizing functions still are
  }
  for (const Kernels* k : tables)
    for (const auto& [name, present] : kernel_entries(*k)) EXPECT_TRUE(present) << k->backend << " lacks " << name;
  int sizing = 0;
  for (const auto& [name, present] : kernel_entries(cuda_sizing_kernels()))
    if (std::string(name).find("_bytes") != std::string::npos) {
      EXPECT_TRUE(present) << name;
      ++sizing;
    }
  EXPECT_EQ(sizing, 6);
  EXPECT_EQ(kernel_entries(cpu_kernels()).size(), 42u) << "6 sizing functions and 36 kernels";
}

// A NaN in a score row propagates as in the reference softmax (its max is NaN): the row's output and log-sum-exp are
// NaN, and so are the gradients through it. Taken for a fully masked row, it became zeros, and the non-finite check
// then blamed a later layer. Rows that never see the NaN stay finite.
TEST(Attention, NanScoresPropagateLikeTheReference) {
  const int64_t L = 70, H = 2, D = 8;  // two query tiles of the CPU kernel
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto random = [&] {
    std::vector<float> v(std::size_t(L * H * D));
    for (float& x : v) x = nd(rng);
    return v;
  };
  std::vector<float> qv = random(), kv = random(), vv = random();
  const int64_t bad_q = 3, bad_k = 66;  // query row 3 (head 0) is NaN; key 66 (head 1) is NaN
  for (int64_t c = 0; c < D; ++c) qv[std::size_t((bad_q * H + 0) * D + c)] = std::nanf("");
  kv[std::size_t((bad_k * H + 1) * D)] = std::nanf("");
  const Tensor q = Tensor::from_floats(qv, {1, L, H, D}, DType::F32, kBackend),
               k = Tensor::from_floats(kv, {1, L, H, D}, DType::F32, kBackend),
               v = Tensor::from_floats(vv, {1, L, H, D}, DType::F32, kBackend);
  const AttentionOut o = attention_forward(q, k, v, Mask::Causal, 0.35f);
  const std::vector<float> out = o.out.to(Device::cpu()).to_floats(), lse = o.lse.to(Device::cpu()).to_floats();
  for (int64_t i = 0; i < L; ++i)
    for (int64_t h = 0; h < H; ++h) {
      // Head 0: only row 3's scores are NaN. Head 1: rows that see key 66 (causal: i >= 66).
      const bool nan = h == 0 ? i == bad_q : i >= bad_k;
      EXPECT_EQ(std::isnan(lse[std::size_t(h * L + i)]), nan) << "lse of row " << i << " head " << h;
      for (int64_t c = 0; c < D; ++c)
        ASSERT_EQ(std::isnan(out[std::size_t((i * H + h) * D + c)]), nan) << "out row " << i << " head " << h;
    }
  const Tensor dout = Tensor::full({1, L, H, D}, 1.f, DType::F32, kBackend);
  const AttentionGrads g = attention_backward(dout, q, k, v, o, Mask::Causal, 0.35f);
  const std::vector<float> dq = g.dq.to(Device::cpu()).to_floats();
  EXPECT_TRUE(std::isnan(dq[std::size_t((bad_q * H + 0) * D)])) << "the NaN row's query gradient";
  EXPECT_TRUE(std::isfinite(dq[std::size_t((2 * H + 0) * D)])) << "a row before the NaN one";
  const std::vector<float> dk = g.dk.to(Device::cpu()).to_floats();
  EXPECT_TRUE(std::isnan(dk[std::size_t((0 * H + 0) * D)])) << "key 0 is seen by the NaN row 3 of head 0";
}

// On a CPU with AVX512-BF16, a bf16 attention's tile products run in bf16 (attention_bf16.h): P and dS are rounded
// to bf16 for the products that take them, everything else stays f32. Against the f32 kernel on the same values
// (bf16 inputs widened), the output and the three gradients stay within bf16's rounding: odd tile edges (69 keys:
// a last tile of 5), grouped heads, windows, key lengths past the queries and head sizes that are not a multiple of
// 16. Elsewhere (no AVX512-BF16, or ONEDNN_MAX_CPU_ISA below avx512_core_bf16) the f32 tiles run for bf16, and the
// bf16 output and lse are then the f32 kernel's, rounded. The CPU kernel, in either op-table binary.
TEST(Attention, Bf16TileProductsStayWithinBf16OfTheF32Kernel) {
  const Device cpu = Device::cpu();
  const bool tiles = cpu::bf16_tiles_present();
  struct Shape {
    int64_t B, Lq, Lk, Hq, Hk, D;
    Mask mask;
    int64_t window;
  };
  const Shape shapes[] = {{2, 69, 69, 4, 2, 64, Mask::Causal, 0},
                          {1, 70, 133, 2, 2, 40, Mask::None, 0},
                          {1, 150, 150, 2, 1, 96, Mask::Causal, 45},
                          {1, 5, 70, 2, 1, 8, Mask::Causal, 0},
                          {1, 130, 130, 1, 1, 128, Mask::Causal, 0}};
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const Shape& sh : shapes) {
    auto pair = [&](int64_t L, int64_t H) {  // the same values in bf16 and in f32
      std::vector<float> v(std::size_t(sh.B * L * H * sh.D));
      for (float& x : v) x = to_f32(to_bf16(nd(rng)));
      return std::pair{Tensor::from_floats(v, {sh.B, L, H, sh.D}, DType::BF16, cpu),
                       Tensor::from_floats(v, {sh.B, L, H, sh.D}, DType::F32, cpu)};
    };
    const auto q = pair(sh.Lq, sh.Hq), k = pair(sh.Lk, sh.Hk), v = pair(sh.Lk, sh.Hk), dout = pair(sh.Lq, sh.Hq);
    const float scale = 1.f / std::sqrt(float(sh.D));
    const AttentionOut o16 = attention_forward(q.first, k.first, v.first, sh.mask, scale, sh.window);
    const AttentionOut o32 = attention_forward(q.second, k.second, v.second, sh.mask, scale, sh.window);
    const AttentionGrads g16 =
        attention_backward(dout.first, q.first, k.first, v.first, o16, sh.mask, scale, sh.window);
    const AttentionGrads g32 =
        attention_backward(dout.second, q.second, k.second, v.second, o32, sh.mask, scale, sh.window);
    const std::string at = "shape " + std::to_string(sh.Lq) + "x" + std::to_string(sh.Lk) + " d" + std::to_string(sh.D);
    // Within 2% of the largest value; with the bf16 tiles not the f32 kernel's values rounded (what the f32 tiles give
    // for bf16), without them exactly those for the output (the gradients' row deltas read the rounded output).
    auto near = [&](const Tensor& got, const Tensor& want, const char* what) {
      const std::vector<float> a = got.to_floats(), b = want.to_floats();
      ASSERT_EQ(a.size(), b.size());
      float largest = 0.f, worst = 0.f;
      int64_t unrounded = 0;
      for (float x : b) largest = std::max(largest, std::fabs(x));
      for (std::size_t i = 0; i < a.size(); ++i) {
        ASSERT_TRUE(std::isfinite(a[i])) << at << " " << what << "[" << i << "]";
        worst = std::max(worst, std::fabs(a[i] - b[i]));
        unrounded += a[i] != to_f32(to_bf16(b[i]));
      }
      EXPECT_LE(worst, 2e-2f * largest) << at << " " << what << ": largest " << largest;
      if (tiles) {
        EXPECT_GT(unrounded, 0) << at << " " << what << ": the f32 kernel's values rounded (the f32 tiles ran)";
      } else if (std::string(what) == "out") {
        EXPECT_EQ(unrounded, 0) << at << " out: not the f32 kernel's values rounded, without bf16 tiles";
      }
    };
    near(o16.out, o32.out, "out");
    near(g16.dq, g32.dq, "dq");
    near(g16.dk, g32.dk, "dk");
    near(g16.dv, g32.dv, "dv");
    const std::vector<float> l16 = o16.lse.to_floats(), l32 = o32.lse.to_floats();
    ASSERT_EQ(l16.size(), l32.size());
    for (std::size_t i = 0; i < l32.size(); ++i) {
      ASSERT_NEAR(l16[i], l32[i], 1e-3f * std::max(1.f, std::fabs(l32[i]))) << at << " lse[" << i << "]";
      if (!tiles) {
        ASSERT_EQ(l16[i], l32[i]) << at << " lse[" << i << "]: the f32 tiles' own";
      }
    }
  }
}

// A sliding window of W keys: the query at position p sees p - W < j <= p (transformers' Mistral mask; its flash
// path once kept W + 1). So a window of L over L keys is plain causal attention, bit for bit, and one of L - 1 changes
// the last row alone, which loses key 0. A window needs the causal mask.
TEST(Attention, AWindowOfWKeysEndsAtTheQuerysOwnPosition) {
  const int64_t L = 70, H = 2, D = 8;
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto random = [&] {
    std::vector<float> v(std::size_t(L * H * D));
    for (float& x : v) x = nd(rng);
    return Tensor::from_floats(v, {1, L, H, D}, DType::F32, kBackend);
  };
  const Tensor q = random(), k = random(), v = random();
  auto out = [&](int64_t window) {
    return attention_forward(q, k, v, Mask::Causal, 0.35f, window).out.to(Device::cpu()).to_floats();
  };
  const std::vector<float> causal = out(0), full = out(L), cut = out(L - 1);
  EXPECT_EQ(full, causal) << "a window as long as the sequence";
  for (int64_t i = 0; i < L; ++i)
    for (int64_t c = 0; c < H * D; ++c) {
      const std::size_t at = std::size_t(i * H * D + c);
      if (i < L - 1)
        ASSERT_EQ(cut[at], causal[at]) << "row " << i << " sees all its keys in a window of " << L - 1;
      else
        EXPECT_NE(cut[at], causal[at]) << "the last row's element " << c << " still sees key 0";
    }
  try {
    attention_forward(q, k, v, Mask::None, 0.35f, 4);
    ADD_FAILURE() << "a window without the causal mask";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[attention] a sliding window (4) needs the causal mask"), std::string::npos)
        << e.what();
  }
}

// Packed (padding-free) sequences: attention_forward_packed / attention_backward_packed give each sequence exactly
// what attention_forward / attention_backward give it alone (the same kernels on views), and, within the bounds of
// a padded batch's other tile shapes, what that sequence's rows get in a right-padded causal batch: padding after a
// sequence changes none of its outputs and, with a zero output gradient there, none of its gradients. Odd lengths
// (1, 5, 33, 70: tile edges), grouped heads, a sliding window; f32 and bf16.
namespace {
// Normal values for `rows` positions of `heads` heads of d values each, from a seeded generator.
struct RandomHeads {
  std::mt19937 rng;
  int64_t d;
  std::vector<float> operator()(int64_t rows, int64_t heads) {
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> v(std::size_t(rows * heads * d));
    for (float& x : v) x = nd(rng);
    return v;
  }
};
}  // namespace

TEST(Attention, PackedSequencesGetWhatEachGetsAloneAndInARightPaddedBatch) {
  const std::vector<int64_t> lengths = {70, 5, 1, 33};
  const int64_t B = int64_t(lengths.size()), L = 70, H = 4, Hkv = 2, D = 16;
  int64_t total = 0;
  for (int64_t n : lengths) total += n;
  RandomHeads random{std::mt19937(11), D};
  // The padded batch's values (pad rows random too; dout zero there), and the packed copy of its sequences.
  const std::vector<float> qp = random(B * L, H), kp = random(B * L, Hkv), vp = random(B * L, Hkv);
  std::vector<float> dp = random(B * L, H);
  auto pack = [&](const std::vector<float>& padded, int64_t heads) {
    std::vector<float> out;
    for (int64_t b = 0; b < B; ++b)
      out.insert(out.end(), padded.begin() + b * L * heads * D,
                 padded.begin() + (b * L + lengths[std::size_t(b)]) * heads * D);
    return out;
  };
  for (int64_t b = 0; b < B; ++b)
    std::fill(dp.begin() + (b * L + lengths[std::size_t(b)]) * H * D, dp.begin() + (b + 1) * L * H * D, 0.f);
  for (DType dt : {DType::F32, DType::BF16})
    for (int64_t window : {int64_t(0), int64_t(9)}) {
      SCOPED_TRACE(str(dtype_name(dt), " window ", window));
      auto make = [&](const std::vector<float>& v, Shape s) { return Tensor::from_floats(v, s, dt, kBackend); };
      const Tensor q = make(pack(qp, H), {1, total, H, D}), k = make(pack(kp, Hkv), {1, total, Hkv, D}),
                   v = make(pack(vp, Hkv), {1, total, Hkv, D}), dout = make(pack(dp, H), {1, total, H, D});
      const float scale = 0.3f;
      const AttentionOut o = attention_forward_packed(q, k, v, lengths, Mask::Causal, scale, window);
      const AttentionGrads g = attention_backward_packed(dout, q, k, v, o, lengths, Mask::Causal, scale, window);
      const Tensor padded_q = make(qp, {B, L, H, D}), padded_k = make(kp, {B, L, Hkv, D}),
                   padded_v = make(vp, {B, L, Hkv, D});
      const AttentionOut po = attention_forward(padded_q, padded_k, padded_v, Mask::Causal, scale, window);
      const AttentionGrads pg =
          attention_backward(make(dp, {B, L, H, D}), padded_q, padded_k, padded_v, po, Mask::Causal, scale, window);
      auto floats = [](const Tensor& t) { return t.to(Device::cpu()).to_floats(); };
      const float tol = dt == DType::F32 ? 2e-5f : 2e-2f;
      int64_t at = 0;
      for (int64_t b = 0; b < B; ++b) {
        const int64_t n = lengths[std::size_t(b)];
        auto rows = [&](const Tensor& t) { return t.slice(1, at, at + n); };
        const Tensor sq = rows(q).contiguous(), sk = rows(k).contiguous(), sv = rows(v).contiguous();
        const AttentionOut alone = attention_forward(sq, sk, sv, Mask::Causal, scale, window);
        const AttentionGrads ga =
            attention_backward(rows(dout).contiguous(), sq, sk, sv, alone, Mask::Causal, scale, window);
        EXPECT_EQ(floats(rows(o.out)), floats(alone.out)) << "sequence " << b;
        EXPECT_EQ(floats(o.lse.slice(0, H * at, H * (at + n))), floats(alone.lse)) << "sequence " << b;
        EXPECT_EQ(floats(rows(g.dq)), floats(ga.dq)) << "sequence " << b;
        EXPECT_EQ(floats(rows(g.dk)), floats(ga.dk)) << "sequence " << b;
        EXPECT_EQ(floats(rows(g.dv)), floats(ga.dv)) << "sequence " << b;
        // Against the padded batch: row b's first n positions.
        auto near = [&](const Tensor& packed, const Tensor& padded, const char* what) {
          const std::vector<float> a = floats(rows(packed)), p = floats(padded.select(0, b).slice(0, 0, n));
          ASSERT_EQ(a.size(), p.size());
          for (std::size_t i = 0; i < a.size(); ++i)
            ASSERT_NEAR(a[i], p[i], tol * (1.f + std::abs(p[i]))) << what << " of sequence " << b << " at " << i;
        };
        near(o.out, po.out, "out");
        near(g.dq, pg.dq, "dq");
        near(g.dk, pg.dk, "dk");
        near(g.dv, pg.dv, "dv");
        at += n;
      }
    }
  EXPECT_THROW(attention_forward_packed(Tensor::zeros({1, 4, H, D}, DType::F32, kBackend),
                                        Tensor::zeros({1, 4, Hkv, D}, DType::F32, kBackend),
                                        Tensor::zeros({1, 4, Hkv, D}, DType::F32, kBackend), {3, 2}, Mask::Causal, 1.f),
               Error)
      << "lengths that do not add up to the packed rows";
}

// Queries at the sequences' ends (the last layer of a padding-free pass): attention_forward_packed with `queries`
// keeps each sequence's last queries[s] query rows and attends them to the whole sequence, as the same rows get when
// every query runs (causal mask aligned at the sequence's end, a sliding window counted back from each query); with
// a zero output gradient on the other queries, dk and dv are those of every query. Each sequence's launch is exactly
// attention_forward / attention_backward of its rows alone. Odd counts at tile edges, grouped heads; f32 and bf16.
TEST(Attention, PackedQueriesAtTheSequencesEndsGetTheirRowsOfEveryQuery) {
  const std::vector<int64_t> lengths = {70, 5, 1, 33}, queries = {3, 5, 1, 17};
  const int64_t H = 4, Hkv = 2, D = 16;
  int64_t total = 0, q_total = 0;
  for (std::size_t s = 0; s < lengths.size(); ++s) total += lengths[s], q_total += queries[s];
  RandomHeads random{std::mt19937(12), D};
  const std::vector<float> qa = random(total, H), ka = random(total, Hkv), va = random(total, Hkv);
  std::vector<float> da = random(total, H);
  // The rows of every query that are kept: each sequence's last ones.
  std::vector<int64_t> kept;
  for (int64_t s = 0, at = 0; s < int64_t(lengths.size()); at += lengths[std::size_t(s)], ++s)
    for (int64_t t = lengths[std::size_t(s)] - queries[std::size_t(s)]; t < lengths[std::size_t(s)]; ++t)
      kept.push_back(at + t);
  auto keep = [&](const std::vector<float>& all, int64_t heads) {
    std::vector<float> out;
    for (int64_t r : kept) out.insert(out.end(), all.begin() + r * heads * D, all.begin() + (r + 1) * heads * D);
    return out;
  };
  std::vector<float> dz(da.size(), 0.f);  // every query's output gradient, zero on the queries not kept
  for (int64_t r : kept) std::copy(da.begin() + r * H * D, da.begin() + (r + 1) * H * D, dz.begin() + r * H * D);
  for (DType dt : {DType::F32, DType::BF16})
    for (int64_t window : {int64_t(0), int64_t(9)}) {
      SCOPED_TRACE(str(dtype_name(dt), " window ", window));
      auto make = [&](const std::vector<float>& v, Shape s) { return Tensor::from_floats(v, s, dt, kBackend); };
      const Tensor q = make(keep(qa, H), {1, q_total, H, D}), dout = make(keep(da, H), {1, q_total, H, D});
      const Tensor k = make(ka, {1, total, Hkv, D}), v = make(va, {1, total, Hkv, D});
      const float scale = 0.3f;
      const AttentionOut o = attention_forward_packed(q, k, v, lengths, Mask::Causal, scale, window, queries);
      const AttentionGrads g =
          attention_backward_packed(dout, q, k, v, o, lengths, Mask::Causal, scale, window, queries);
      const Tensor all_q = make(qa, {1, total, H, D});
      const AttentionOut ao = attention_forward_packed(all_q, k, v, lengths, Mask::Causal, scale, window);
      const AttentionGrads ag =
          attention_backward_packed(make(dz, {1, total, H, D}), all_q, k, v, ao, lengths, Mask::Causal, scale, window);
      auto floats = [](const Tensor& t) { return t.to(Device::cpu()).to_floats(); };
      const float tol = dt == DType::F32 ? 2e-5f : 2e-2f;
      auto near = [&](const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
        ASSERT_EQ(got.size(), want.size()) << what;
        for (std::size_t i = 0; i < got.size(); ++i)
          ASSERT_NEAR(got[i], want[i], tol * (1.f + std::abs(want[i]))) << what << " at " << i;
      };
      near(floats(o.out), keep(floats(ao.out), H), "out");
      near(floats(g.dq), keep(floats(ag.dq), H), "dq");
      near(floats(g.dk), floats(ag.dk), "dk");
      near(floats(g.dv), floats(ag.dv), "dv");
      const std::vector<float> lse = floats(o.lse), all_lse = floats(ao.lse);
      for (int64_t s = 0, at = 0, q_at = 0; s < int64_t(lengths.size()); ++s) {
        const int64_t n = lengths[std::size_t(s)], nq = queries[std::size_t(s)];
        for (int64_t h = 0; h < H; ++h)  // sequence s's (heads, queries) block, against its last queries of every one
          near(std::vector<float>(lse.begin() + H * q_at + h * nq, lse.begin() + H * q_at + (h + 1) * nq),
               std::vector<float>(all_lse.begin() + H * at + h * n + (n - nq), all_lse.begin() + H * at + (h + 1) * n),
               str("lse of sequence ", s, " head ", h));
        // Alone: the same kernels on that sequence's rows.
        const Tensor sq = q.slice(1, q_at, q_at + nq).contiguous(), sk = k.slice(1, at, at + n).contiguous(),
                     sv = v.slice(1, at, at + n).contiguous();
        const AttentionOut alone = attention_forward(sq, sk, sv, Mask::Causal, scale, window);
        const AttentionGrads ga = attention_backward(dout.slice(1, q_at, q_at + nq).contiguous(), sq, sk, sv, alone,
                                                     Mask::Causal, scale, window);
        EXPECT_EQ(floats(o.out.slice(1, q_at, q_at + nq)), floats(alone.out)) << "sequence " << s;
        EXPECT_EQ(floats(g.dq.slice(1, q_at, q_at + nq)), floats(ga.dq)) << "sequence " << s;
        EXPECT_EQ(floats(g.dk.slice(1, at, at + n)), floats(ga.dk)) << "sequence " << s;
        EXPECT_EQ(floats(g.dv.slice(1, at, at + n)), floats(ga.dv)) << "sequence " << s;
        at += n;
        q_at += nq;
      }
    }
  auto zeros = [&](int64_t rows, int64_t heads) { return Tensor::zeros({1, rows, heads, D}, DType::F32, kBackend); };
  EXPECT_THROW(attention_forward_packed(zeros(3, H), zeros(5, Hkv), zeros(5, Hkv), {3, 2}, Mask::Causal, 1.f, 0, {2}),
               Error)
      << "a query count per sequence";
  EXPECT_THROW(
      attention_forward_packed(zeros(5, H), zeros(5, Hkv), zeros(5, Hkv), {3, 2}, Mask::Causal, 1.f, 0, {2, 3}), Error)
      << "more queries than positions";
  EXPECT_THROW(
      attention_forward_packed(zeros(4, H), zeros(5, Hkv), zeros(5, Hkv), {3, 2}, Mask::Causal, 1.f, 0, {2, 1}), Error)
      << "queries that do not add up to q's rows";
}
