// cuDNN 9's fused scaled-dot-product attention (its flash kernels) through the C++ frontend's graph API, for the
// shapes core/backend/cuda/attention_path.h admits. The contract is the own kernel's (attention.cu): q, o
// (batch, q_len, q_heads, head_dim) and k, v (batch, kv_len, kv_heads, head_dim) as strides of cuDNN's
// (batch, heads, seq, head_dim); the saved statistics are the natural log-sum-exp of the scaled scores,
// (batch, q_heads, q_len) f32, exactly cuDNN's `Stats` output, so either backward can follow either forward.
// A causal mask is aligned to the bottom right (query i sees keys j <= i + kv_len - q_len). Grouped-query
// heads are cuDNN's own (kv_heads < q_heads). The backward is cuDNN's default, which accumulates dQ in f32 with
// atomics (not bit-repeatable): its deterministic variant keeps a (q_len x kv_len) dP workspace per head on
// cuDNN < 9.25, the O(L^2) memory this path exists to avoid. HR_CUDNN_ATTENTION=0 gives the own kernel's
// repeatable bits.
//
// Each shape's graph is built once (the first call, or the sizing query that comes before it) and kept (the 256
// most recently used); a graph that does not build on this GPU makes the shape take the own kernel, for the sizing
// and the kernel alike. Graphs are built as dynamic-shape graphs sharing one kernel cache per direction (cuDNN
// 9.4+), so a new sequence length reuses the kernels compiled for the last one instead of compiling (NVRTC) again;
// where dynamic shapes are refused the graph is built for its shape alone. HR_CUDNN_ATTENTION=0 sends every shape
// to the own kernel. A cuDNN that cannot start (cudnnCreate fails) turns the fused path off with one warning.
#include "core/backend/cuda/cudnn_attention.h"

#include <cudnn.h>
#include <cudnn_frontend.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/backend/cuda/attention_path.h"
#include "core/backend/cuda/cuda_check.h"
#include "core/backend/cuda/cuda_kernels.h"
#include "core/backend/cuda/cuda_libraries.h"
#include "core/lru_map.h"

namespace hr::cuda {

namespace {

namespace fe = cudnn_frontend;

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> on = [] {
    const char* v = std::getenv("HR_CUDNN_ATTENTION");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}
// The handle, made by start_cudnn; null until then, and where cuDNN could not start.
struct CudnnStart {
  std::mutex mu;
  cudnnHandle_t handle = nullptr;
};
CudnnStart& cudnn_start() {
  static CudnnStart s;
  return s;
}

cudnnHandle_t cudnn_handle() {
  CudnnStart& s = cudnn_start();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.handle;
}

bool enabled() {
  return enabled_flag().load() && cudnn_handle() != nullptr;
}

// One kernel cache per graph topology (direction, dtype, head dim, head grouping, mask and its alignment), shared
// by the graphs of every sequence length and batch: a cache serves "same-topology operation graphs" only. Called
// with graph_for's lock held.
std::shared_ptr<fe::KernelCache> kernel_cache(const AttentionDesc& d, AttentionPass pass) {
  using Topology = std::tuple<bool, int, int64_t, int64_t, int, bool>;
  static std::map<Topology, std::shared_ptr<fe::KernelCache>> caches;
  std::shared_ptr<fe::KernelCache>& c = caches[Topology{pass == AttentionPass::Backward, int(d.dtype), d.head_dim,
                                                        d.q_heads / d.kv_heads, int(d.mask), d.q_len == d.kv_len}];
  if (!c) c = std::make_shared<fe::KernelCache>();
  return c;
}

// Whether cuDNN refused a dynamic-shape graph once: then every shape is built for itself alone (no second try).
bool g_static_only = false;

// (batch, seq, heads, dim) contiguous, as cuDNN's (batch, heads, seq, dim).
std::vector<int64_t> bshd_dims(int64_t b, int64_t s, int64_t h, int64_t d) {
  return {b, h, s, d};
}
std::vector<int64_t> bshd_strides(int64_t, int64_t s, int64_t h, int64_t d) {
  return {s * h * d, d, h * d, 1};
}

struct Graph {
  std::shared_ptr<fe::graph::Graph> graph;
  std::size_t workspace = 0;
  bool built = false;
};

using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, bool, float>;

Key key_of(const AttentionDesc& d, AttentionPass pass, float scale) {
  return {d.batch,      d.q_len,     d.kv_len,
          d.q_heads,    d.kv_heads,  d.head_dim,
          int(d.dtype), int(d.mask), pass == AttentionPass::Backward,
          scale};
}

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// A (batch, seq, heads, head_dim) tensor of the graph, as cuDNN's (batch, heads, seq, head_dim).
TensorPtr bshd(fe::graph::Graph& g, const AttentionDesc& d, const char* name, Uid uid, int64_t seq, int64_t heads) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim(bshd_dims(d.batch, seq, heads, d.head_dim))
                      .set_stride(bshd_strides(d.batch, seq, heads, d.head_dim)));
}

// An output of the graph, laid out as `bshd` lays out its inputs.
void bshd_output(const TensorPtr& t, const AttentionDesc& d, Uid uid, int64_t seq, int64_t heads) {
  t->set_output(true)
      .set_uid(uid)
      .set_dim(bshd_dims(d.batch, seq, heads, d.head_dim))
      .set_stride(bshd_strides(d.batch, seq, heads, d.head_dim));
}

// The saved statistics: (batch, q_heads, q_len, 1) f32, the log-sum-exp of the scaled scores.
std::vector<int64_t> stats_dims(const AttentionDesc& d) {
  return {d.batch, d.q_heads, d.q_len, 1};
}
std::vector<int64_t> stats_strides(const AttentionDesc& d) {
  return {d.q_heads * d.q_len, d.q_len, 1, 1};
}

// The causal mask aligned to the bottom right (query i sees keys j <= i + kv_len - q_len), as the contract says.
template <typename Options>
void set_mask(Options& options, const AttentionDesc& d) {
  if (d.mask != Mask::Causal) return;
  if (d.q_len == d.kv_len)
    options.set_causal_mask(true);
  else
    options.set_causal_mask_bottom_right(true);
}

void add_forward(fe::graph::Graph& g, const AttentionDesc& d, float scale) {
  auto options = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(true).set_attn_scale(scale);
  set_mask(options, d);
  auto [o, stats] = g.sdpa(bshd(g, d, "Q", kQ, d.q_len, d.q_heads), bshd(g, d, "K", kK, d.kv_len, d.kv_heads),
                           bshd(g, d, "V", kV, d.kv_len, d.kv_heads), options);
  bshd_output(o, d, kO, d.q_len, d.q_heads);
  stats->set_output(true)
      .set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim(stats_dims(d))
      .set_stride(stats_strides(d));
}

void add_backward(fe::graph::Graph& g, const AttentionDesc& d, float scale) {
  auto stats = g.tensor(fe::graph::Tensor_attributes()
                            .set_name("Stats")
                            .set_uid(kStats)
                            .set_data_type(fe::DataType_t::FLOAT)
                            .set_dim(stats_dims(d))
                            .set_stride(stats_strides(d)));
  auto options = fe::graph::SDPA_backward_attributes().set_name("attention_backward").set_attn_scale(scale);
  set_mask(options, d);
  auto [dq, dk, dv] =
      g.sdpa_backward(bshd(g, d, "Q", kQ, d.q_len, d.q_heads), bshd(g, d, "K", kK, d.kv_len, d.kv_heads),
                      bshd(g, d, "V", kV, d.kv_len, d.kv_heads), bshd(g, d, "O", kO, d.q_len, d.q_heads),
                      bshd(g, d, "dO", kDO, d.q_len, d.q_heads), stats, options);
  bshd_output(dq, d, kDQ, d.q_len, d.q_heads);
  bshd_output(dk, d, kDK, d.kv_len, d.kv_heads);
  bshd_output(dv, d, kDV, d.kv_len, d.kv_heads);
}

// Dynamic shapes: one graph (and kernel cache) serves every sequence length and batch of its topology.
enum class Shapes : uint8_t { Dynamic, Fixed };

Graph build_graph(const AttentionDesc& d, AttentionPass pass, float scale, Shapes shapes) {
  Graph out;
  out.graph = std::make_shared<fe::graph::Graph>();
  fe::graph::Graph& g = *out.graph;
  g.set_io_data_type(d.dtype == DType::BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  if (shapes == Shapes::Dynamic) g.set_dynamic_shape_enabled(true).set_kernel_cache(kernel_cache(d, pass));
  if (pass == AttentionPass::Backward)
    add_backward(g, d, scale);
  else
    add_forward(g, d, scale);
  cudnnHandle_t h = cudnn_handle();
  if (!g.validate().is_good() || !g.build_operation_graph(h).is_good() ||
      !g.create_execution_plans({fe::HeurMode_t::A}).is_good() || !g.check_support(h).is_good() ||
      !g.build_plans(h).is_good())
    return out;
  int64_t workspace = 0;
  if (!g.get_workspace_size(workspace).is_good() || workspace < 0) return out;
  out.workspace = std::size_t(workspace);
  out.built = true;
  return out;
}

// A graph the frontend refuses by throwing (no engine for the shape) is one that did not build. Dynamic shapes
// (and the shared kernel cache) first; the shape alone where they are refused.
Graph build(const AttentionDesc& d, AttentionPass pass, float scale) {
  for (Shapes shapes : {Shapes::Dynamic, Shapes::Fixed}) {
    if (shapes == Shapes::Dynamic && g_static_only) continue;
    try {
      Graph g = build_graph(d, pass, scale, shapes);
      if (g.built) return g;
    } catch (const std::exception&) {
    }
    if (shapes == Shapes::Dynamic) g_static_only = true;
  }
  return Graph{};
}

// The graph of a shape, built on first use (a copy of the cached entry, which an eviction cannot take away);
// not built when cuDNN does not take the shape.
struct Graphs {
  std::mutex mu;
  core::LruMap<Key, Graph> map{256};
};
Graphs& graphs() {
  static Graphs g;
  return g;
}

Graph graph_for(const AttentionDesc& d, AttentionPass pass, float scale) {
  if (!enabled() || !core::cudnn_attention_admits(d, pass)) return Graph{};
  Graphs& g = graphs();
  std::lock_guard<std::mutex> lock(g.mu);
  return g.map.get(key_of(d, pass, scale), [&] { return build(d, pass, scale); });
}

// The sizing query (attention_path.h). The op sizes before it knows nothing but the shape; the graphs are
// keyed by scale too, and every caller in headroom uses 1/sqrt(head_dim), so the query builds that one.
bool query(const AttentionDesc& d, AttentionPass pass, std::size_t* workspace) {
  const Graph g = graph_for(d, pass, 1.f / std::sqrt(float(d.head_dim)));
  if (!g.built) return false;
  *workspace = g.workspace;
  return true;
}

// cuDNN's execute() wants every operand 16-byte aligned: a view that is not takes the own kernel.
bool aligned(const AttentionArgs& a, AttentionPass pass) {
  std::vector<const Tensor*> ts = {&a.q, &a.k, &a.v, &a.out, &a.lse};
  if (pass == AttentionPass::Backward) ts.insert(ts.end(), {&a.dout, &a.dq, &a.dk, &a.dv});
  for (const Tensor* t : ts)
    if (reinterpret_cast<uintptr_t>(t->data_ptr()) % 16) return false;
  return true;
}

bool run(const AttentionArgs& a, AttentionPass pass) {
  const bool backward = pass == AttentionPass::Backward;
  const Graph g = graph_for(a.desc, pass, a.scale);
  if (!g.built || !aligned(a, pass) ||
      (g.workspace > 0 && (!a.workspace.defined() || a.workspace.nbytes() < g.workspace)))
    return false;
  HR_CHECK(cudnnSetStream(cudnn_handle(), stream()) == CUDNN_STATUS_SUCCESS, "[cudnn] cudnnSetStream failed");
  std::unordered_map<int64_t, void*> pack = {{kQ, a.q.data_ptr()},
                                             {kK, a.k.data_ptr()},
                                             {kV, a.v.data_ptr()},
                                             {kO, a.out.data_ptr()},
                                             {kStats, a.lse.data_ptr()}};
  if (backward) {
    pack[kDO] = a.dout.data_ptr();
    pack[kDQ] = a.dq.data_ptr();
    pack[kDK] = a.dk.data_ptr();
    pack[kDV] = a.dv.data_ptr();
  }
  void* workspace = g.workspace > 0 ? a.workspace.data_ptr() : nullptr;
  auto status = g.graph->execute(cudnn_handle(), pack, workspace);
  HR_CHECK(status.is_good(), "[", backward ? "attention_backward" : "attention",
           "] cuDNN's fused attention failed: ", status.get_message());
  core::note_attention_kernel(core::AttentionKernel::Cudnn);
  return true;
}

}  // namespace

bool start_cudnn(CudnnCreate create) {
  CudnnStart& s = cudnn_start();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.handle) return true;
  void* h = nullptr;
  std::string why;
  if (!create(&h, &why)) {
    std::fprintf(stderr,
                 "headroom: warning: [cudnn] cuDNN could not start (%s): fused attention is off, every attention runs "
                 "headroom's own kernels\n",
                 why.c_str());
    core::set_cudnn_attention_query(nullptr);
    return false;
  }
  s.handle = static_cast<cudnnHandle_t>(h);
  core::set_cudnn_attention_query(query);
  return true;
}

void stop_cudnn() {
  {  // the graphs' plans were made with the handle that goes
    Graphs& g = graphs();
    std::lock_guard<std::mutex> lock(g.mu);
    g.map.clear();
  }
  CudnnStart& s = cudnn_start();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.handle) cudnnDestroy(s.handle);
  s.handle = nullptr;
  core::set_cudnn_attention_query(nullptr);
}

void create_cudnn_handle() {
  start_cudnn([](void** handle, std::string* why) {
    // cuDNN's runtime-compiled engines load NVRTC by name on their own: opened here first, where headroom looks
    // for its libraries, so that cuDNN reuses it and a missing NVRTC is named before any graph is built.
    try {
      library(Library::Nvrtc);
    } catch (const Error& e) {
      *why = e.what();
      return false;
    }
    cudnnHandle_t h = nullptr;
    const cudnnStatus_t st = cudnnCreate(&h);
    *handle = h;
    if (st != CUDNN_STATUS_SUCCESS) *why = str("cudnnCreate: ", cudnnGetErrorString(st));
    return st == CUDNN_STATUS_SUCCESS;
  });
}

void set_cudnn_attention_enabled(bool on) {
  enabled_flag().store(on);
}

bool cudnn_attention_forward(const AttentionArgs& a) {
  return !a.past.defined() && run(a, AttentionPass::Forward);
}
bool cudnn_attention_backward(const AttentionArgs& a) {
  return run(a, AttentionPass::Backward);
}
const char* cudnn_attention_version() {
  static const std::string v = str("cuDNN ", cudnnGetVersion() / 10000, ".", cudnnGetVersion() / 100 % 100, ".",
                                   cudnnGetVersion() % 100, ", frontend ", CUDNN_FRONTEND_MAJOR_VERSION, ".",
                                   CUDNN_FRONTEND_MINOR_VERSION, ".", CUDNN_FRONTEND_PATCH_VERSION);
  return v.c_str();
}

}  // namespace hr::cuda
