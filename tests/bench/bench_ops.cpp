// Kernel throughput: GEMM (f32, bf16) and fused attention on the CPU back-end, in FLOP/s. The largest
// square f32 GEMM is the machine's ceiling; compare the other rows to it. BM_Linear runs headroom's linear
// layer (on the 19.2M and 5.2M bench models' shapes among others) and BM_OneDnnLinear the same product as a plain
// oneDNN matmul with whatever kernel oneDNN picks and its own scratchpad handling: under ONEDNN_MAX_CPU_ISA=avx2 that
// is gemm:jit (which mallocs its packing buffers) against headroom's packed GEMM, on the same machine in the same run.
// BM_Optimizer: AdamW and 8-bit AdamW updates of one f32 parameter (elements per second), each step's moments as a real
// run leaves them. The fused kernels (model.fused_kernels) beside their unfused ops, on the 19.2M bench model's decoder
// shapes (8 x 256 tokens, 6 heads of 64, hidden 384, intermediate 1024), with bytes of activations read and written per
// second where one kernel's traffic is clear: BM_Rope a layer's four rotations (q and k, forward and backward) from
// positions or from the step's table (BM_RopeTable: making the table, once a step for every layer), BM_AddNorm a
// block's residual add and RMS norm, forward and backward, as two ops or one, BM_Swiglu SwiGLU forward and
// backward, BM_Unary an activation forward and backward on the tower's MLP, and BM_SumLeading the gradient of its
// bias. BM_CrossEntropy: the fused lm_head + loss, forward and backward, on the same model's 2,040 positions (vocab
// 8,000) in chunks of range(0) rows (0: the back-end's default), with range(1) of them labelled (at the front, as
// llava.forward packs them): the chunks past them run no GEMM, and the one they end in runs its labelled rows, their
// count rounded up to a multiple of 64. BM_AttentionBatch: one micro-batch's attention forward and backward on the
// 5.2M model's decoder and tower shapes (compare torch.nn.functional.scaled_dot_product_attention on the same shapes).
// BM_GradNorm: the gradient norm's sum of squares over one f32 gradient, in bytes read per second: from the caches
// (16 MiB) and from memory (128 MiB).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <oneapi/dnnl/dnnl.hpp>

#include "core/ops/attention.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/elementwise.h"
#include "core/ops/linear.h"
#include "core/ops/norm.h"
#include "core/ops/optimizer.h"
#include "core/ops/reduce.h"
#include "core/ops/softmax.h"

using namespace hr::core;

namespace {

void set_flops(benchmark::State& state, double flops_per_iter) {
  state.counters["FLOPS"] =
      benchmark::Counter(flops_per_iter, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

void BM_Gemm(benchmark::State& state, DType dt) {
  const int64_t n = state.range(0);
  Tensor a = Tensor::full({1, n, n}, 0.5f, dt, Device::cpu()), b = Tensor::full({1, n, n}, 0.25f, dt, Device::cpu());
  Tensor c = Tensor::empty({1, n, n}, dt, Device::cpu());
  for (auto _ : state) gemm(a, b, c);
  set_flops(state, 2.0 * double(n) * double(n) * double(n));
}

// The weight-gradient shape of a linear layer: dW = dy^T x, with a transposed (strided) operand.
void BM_LinearWeightGrad(benchmark::State& state, DType dt) {
  const int64_t tokens = state.range(0), in = state.range(1), out = state.range(2);
  Tensor x = Tensor::full({tokens, in}, 0.5f, dt, Device::cpu()),
         dy = Tensor::full({tokens, out}, 0.25f, dt, Device::cpu());
  Tensor w = Tensor::full({out, in}, 0.1f, dt, Device::cpu());
  for (auto _ : state) {
    LinearBackwardOptions o;
    o.need_dx = false;
    benchmark::DoNotOptimize(linear_backward(dy, x, w, Bias::No, o));
  }
  set_flops(state, 2.0 * double(tokens) * double(in) * double(out));
}

// A linear layer's forward, y = x W^T, through headroom.
void BM_Linear(benchmark::State& state, DType dt) {
  const int64_t tokens = state.range(0), in = state.range(1), out = state.range(2);
  Tensor x = Tensor::full({tokens, in}, 0.5f, dt, Device::cpu()), w = Tensor::full({out, in}, 0.1f, dt, Device::cpu());
  for (auto _ : state) benchmark::DoNotOptimize(linear_forward(x, w, Tensor()));
  set_flops(state, 2.0 * double(tokens) * double(in) * double(out));
}

// The same product as a plain oneDNN matmul (library-managed scratchpad, oneDNN's own kernel choice).
void BM_OneDnnLinear(benchmark::State& state, DType dt) {
  using dnnl::memory;
  const int64_t tokens = state.range(0), in = state.range(1), out = state.range(2);
  const auto t = dt == DType::F32 ? memory::data_type::f32 : memory::data_type::bf16;
  dnnl::engine e(dnnl::engine::kind::cpu, 0);
  dnnl::stream st(e);
  memory::desc xd({tokens, in}, t, memory::dims{in, 1}), wd({in, out}, t, memory::dims{1, in});
  memory::desc yd({tokens, out}, t, memory::dims{out, 1});
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(xd, wd, yd), e);
  } catch (const dnnl::error&) {
    state.SkipWithError("oneDNN has no matmul for this dtype at this ISA level");
    return;
  }
  dnnl::matmul prim(pd);
  memory xm(xd, e), wm(wd, e), ym(yd, e);
  for (auto _ : state) {
    prim.execute(st, {{DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, ym}});
    st.wait();
  }
  state.SetLabel(pd.impl_info_str());
  set_flops(state, 2.0 * double(tokens) * double(in) * double(out));
}

// The weight gradient dW = dy^T x as a plain oneDNN matmul (dy^T a transposed view).
void BM_OneDnnWeightGrad(benchmark::State& state, DType dt) {
  using dnnl::memory;
  const int64_t tokens = state.range(0), in = state.range(1), out = state.range(2);
  const auto t = dt == DType::F32 ? memory::data_type::f32 : memory::data_type::bf16;
  dnnl::engine e(dnnl::engine::kind::cpu, 0);
  dnnl::stream st(e);
  memory::desc ad({out, tokens}, t, memory::dims{1, out}), bd({tokens, in}, t, memory::dims{in, 1});
  memory::desc cd({out, in}, t, memory::dims{in, 1});
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, cd), e);
  } catch (const dnnl::error&) {
    state.SkipWithError("oneDNN has no matmul for this dtype at this ISA level");
    return;
  }
  dnnl::matmul prim(pd);
  memory am(ad, e), bm(bd, e), cm(cd, e);
  for (auto _ : state) {
    prim.execute(st, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    st.wait();
  }
  state.SetLabel(pd.impl_info_str());
  set_flops(state, 2.0 * double(tokens) * double(in) * double(out));
}

// Causal attention over L positions (range 0), through a sliding window of W keys when range 1 is W > 0.
void BM_Attention(benchmark::State& state, DType dt, bool backward) {
  const int64_t L = state.range(0), W = state.range(1), H = 8, D = 64;
  Tensor q = Tensor::full({1, L, H, D}, 0.01f, dt, Device::cpu());
  Tensor k = Tensor::full({1, L, H, D}, 0.02f, dt, Device::cpu());
  Tensor v = Tensor::full({1, L, H, D}, 0.03f, dt, Device::cpu());
  const float scale = 1.f / std::sqrt(float(D));
  AttentionOut o = attention_forward(q, k, v, Mask::Causal, scale, W);
  for (auto _ : state) {
    if (backward)
      benchmark::DoNotOptimize(attention_backward(q, q, k, v, o, Mask::Causal, scale, W));
    else
      benchmark::DoNotOptimize(attention_forward(q, k, v, Mask::Causal, scale, W));
  }
  // The 2 (fwd) or 5 (bwd, with recompute) matmuls over the visible scores: L (L + 1) / 2 causal, fewer in a window.
  const double matmuls = backward ? 5.0 : 2.0;
  const int64_t w = W > 0 ? std::min(W, L) : L;
  const double scores = double(w) * double(w + 1) / 2 + double(L - w) * double(w);
  set_flops(state, matmuls * double(H) * scores * double(D));
}

// One attention forward and backward of a whole micro-batch, as a training step runs it: batch x length, query and
// key/value heads, head size, causal or not. The 5.2M model's (16 sequences of 128 tokens, 8 heads over 4 of
// size 32, causal) and its tower's (16 images of 65 tokens, 4 heads of 48).
void BM_AttentionBatch(benchmark::State& state, DType dt) {
  const int64_t B = state.range(0), L = state.range(1), H = state.range(2), Hk = state.range(3), D = state.range(4);
  const Mask mask = state.range(5) ? Mask::Causal : Mask::None;
  auto random = [&](int64_t heads, float s) {
    std::vector<float> v(std::size_t(B * L * heads * D));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = s * std::sin(0.37f * float(i));
    return Tensor::from_floats(v, {B, L, heads, D}, dt, Device::cpu());
  };
  const Tensor q = random(H, 1.f), k = random(Hk, 0.7f), v = random(Hk, 0.5f), dout = random(H, 0.1f);
  const float scale = 1.f / std::sqrt(float(D));
  for (auto _ : state) {
    AttentionOut o = attention_forward(q, k, v, mask, scale);
    benchmark::DoNotOptimize(attention_backward(dout, q, k, v, o, mask, scale));
  }
  const double scores = mask == Mask::Causal ? double(L) * double(L + 1) / 2 : double(L) * double(L);
  set_flops(state, 7.0 * 2.0 * double(B) * double(H) * scores * double(D));  // 2 matmuls forward, 5 backward
}

void BM_CrossEntropy(benchmark::State& state, DType dt) {
  const int64_t tokens = 8 * 255, d = 384, vocab = 8000, labelled = state.range(1);
  std::vector<float> hv(std::size_t(tokens * d)), wv(std::size_t(vocab * d));
  for (std::size_t i = 0; i < hv.size(); ++i) hv[i] = std::sin(0.1f * float(i));
  for (std::size_t i = 0; i < wv.size(); ++i) wv[i] = 0.05f * std::cos(0.3f * float(i));
  std::vector<int64_t> lv(std::size_t(tokens), -100);
  for (int64_t i = 0; i < labelled; ++i) lv[std::size_t(i)] = (i * 37) % vocab;
  const Tensor h = Tensor::from_floats(hv, {tokens, d}, dt, Device::cpu());
  const Tensor w = Tensor::from_floats(wv, {vocab, d}, dt, Device::cpu());
  const Tensor labels = Tensor::from_ints(lv, {tokens}, DType::I64, Device::cpu());
  const Tensor dloss = Tensor::full({}, 1.f, DType::F32, Device::cpu());
  CrossEntropyOptions o;
  o.chunk_rows = state.range(0);
  o.labelled_rows = labelled;
  o.normalizer = float(std::max<int64_t>(labelled, 1));
  for (auto _ : state) {
    const CrossEntropyOut out = cross_entropy_forward(h, w, labels, o);
    benchmark::DoNotOptimize(cross_entropy_backward(dloss, h, w, labels, out, o));
  }
  state.SetLabel(hr::str(labelled, " of ", tokens, " rows labelled"));
}

constexpr int64_t kTokensB = 8, kTokensL = 256, kHeads = 6, kHeadDim = 64, kHidden = 384, kInter = 1024;

void set_bytes(benchmark::State& state, double bytes_per_iter) {
  state.counters["bytes/s"] =
      benchmark::Counter(bytes_per_iter, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1024);
}

Tensor positions() {
  std::vector<int64_t> p(std::size_t(kTokensB * kTokensL));
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = int64_t(i) % kTokensL;
  return Tensor::from_ints(p, {kTokensB, kTokensL}, DType::I64, Device::cpu());
}

void BM_Rope(benchmark::State& state, DType dt, bool table) {
  Tensor x = Tensor::full({kTokensB, kTokensL, kHeads, kHeadDim}, 0.5f, dt, Device::cpu());
  const Tensor pos = positions(), t = rope_table(pos, kHeadDim, 10000.f);
  for (auto _ : state)
    for (int i = 0; i < 2; ++i) {
      benchmark::DoNotOptimize(table ? rope_forward(x, t) : rope_forward(x, pos, 10000.f));
      benchmark::DoNotOptimize(table ? rope_backward(x, t) : rope_backward(x, pos, 10000.f));
    }
  set_bytes(state, 4.0 * 2.0 * double(x.nbytes()));
}

void BM_RopeTable(benchmark::State& state) {
  const Tensor pos = positions();
  for (auto _ : state) benchmark::DoNotOptimize(rope_table(pos, kHeadDim, 10000.f));
  set_bytes(state, double(kTokensB * kTokensL * kHeadDim * 4));
}

// Each iteration first copies the branch's output (both ways: the fused forward adds into it in place).
void BM_AddNorm(benchmark::State& state, DType dt, bool fused) {
  const int64_t n = kTokensB * kTokensL;
  Tensor x = Tensor::full({n, kHidden}, 0.5f, dt, Device::cpu()), w = Tensor::full({kHidden}, 1.f, dt, Device::cpu());
  Tensor branch = Tensor::full({n, kHidden}, 0.25f, dt, Device::cpu());
  Tensor dy = Tensor::full({n, kHidden}, 0.1f, dt, Device::cpu()), dw = Tensor::zeros({kHidden}, dt, Device::cpu());
  NormBackwardOptions o;
  o.accumulate = Accumulate::Yes;
  o.dweight_into = dw;
  for (auto _ : state) {
    Tensor h = axpby(1.f, branch, 0.f, branch);
    if (!fused) add_(h, x);
    NormOut y = rmsnorm_forward(h, w, 1e-6f, fused ? x : Tensor());
    o.add_to_dx = fused ? dy : Tensor();
    NormGrads g = rmsnorm_backward(y.y, h, w, y.saved, o);
    if (!fused) add_(g.dx, dy);
    benchmark::DoNotOptimize(g.dx);
  }
}

void BM_Swiglu(benchmark::State& state, DType dt) {
  const int64_t n = kTokensB * kTokensL;
  Tensor g = Tensor::full({n, kInter}, 0.5f, dt, Device::cpu()),
         u = Tensor::full({n, kInter}, -0.25f, dt, Device::cpu());
  for (auto _ : state) {
    Tensor y = swiglu_forward(g, u);
    benchmark::DoNotOptimize(swiglu_backward(g, u, y));
  }
  set_bytes(state, 8.0 * double(g.nbytes()));  // forward: 2 in, 1 out; backward: 3 in, 2 out
}

// An activation forward and backward on the 19.2M model's tower MLP (8 images of 65 tokens, intermediate 1024):
// quick GELU is CLIP's, tanh GELU SigLIP's, exact GELU the projector's.
void BM_Unary(benchmark::State& state, UnaryOp op, DType dt) {
  const Tensor x = Tensor::full({8 * 65, 1024}, 0.5f, dt, Device::cpu());
  for (auto _ : state) {
    Tensor y = unary_forward(op, x);
    benchmark::DoNotOptimize(unary_backward(op, x, y));
  }
  set_bytes(state, 5.0 * double(x.nbytes()));  // forward: 1 in, 1 out; backward: 2 in, 1 out
}

// A linear layer's bias add and the activation after it, forward: two passes (add_rows_, then the activation) or one
// (fused_kernels: auto). Rows x columns: the 19.2M model's tower MLP (8 images of 65 tokens, intermediate 1024) and
// CLIP ViT-L/14-336's (4 images of 577 tokens, intermediate 4096); quick GELU, CLIP's. The bias is zero, so the
// in-place add leaves the same values every iteration.
void BM_BiasUnary(benchmark::State& state, DType dt, bool fused) {
  const Tensor x = Tensor::full({state.range(0), state.range(1)}, 0.5f, dt, Device::cpu());
  const Tensor b = Tensor::full({state.range(1)}, 0.f, dt, Device::cpu());
  for (auto _ : state) {
    if (!fused) add_rows_(x, b);
    benchmark::DoNotOptimize(unary_forward(UnaryOp::QuickGelu, x, fused ? b : Tensor()));
  }
  // fused: x in and out, y out; unfused: the add reads and writes x, the activation reads x and writes y
  set_bytes(state, (fused ? 3.0 : 4.0) * double(x.nbytes()));
}

// A bias's gradient: the sum over the leading dims of the tower MLP's fc1 output gradient (8 images of 65 tokens,
// intermediate 1024), into an f32 gradient.
void BM_SumLeading(benchmark::State& state, DType dt) {
  const Tensor dy = Tensor::full({8 * 65, 1024}, 0.5f, dt, Device::cpu());
  const Tensor db = Tensor::full({1024}, 0.f, DType::F32, Device::cpu());
  for (auto _ : state) sum_leading(dy, db, Accumulate::Yes);
  set_bytes(state, double(dy.nbytes()));
}

// The gradient norm's sum of squares over one f32 gradient of n elements (global_norm over one tensor), in the
// fixed chunks and lanes that keep its bits on every thread count.
void BM_GradNorm(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<float> gv(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) gv[std::size_t(i)] = std::sin(0.37f * float(i)) * 1e-2f;
  const Tensor g = Tensor::from_floats(gv, {n}, DType::F32, Device::cpu());
  for (auto _ : state) benchmark::DoNotOptimize(global_norm({g}));
  set_bytes(state, double(g.nbytes()));
}

}  // namespace

void BM_Optimizer(benchmark::State& state, bool eight_bit) {
  const int64_t n = state.range(0), blocks = adam8bit_blocks(n);
  std::vector<float> gv(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) gv[std::size_t(i)] = std::sin(0.37f * float(i)) * 1e-2f;
  Tensor p = Tensor::full({n}, 0.1f, DType::F32, Device::cpu()),
         g = Tensor::from_floats(gv, {n}, DType::F32, Device::cpu());
  Tensor m = Tensor::zeros({n}, eight_bit ? DType::U8 : DType::F32, Device::cpu());
  Tensor v = Tensor::zeros({n}, eight_bit ? DType::U8 : DType::F32, Device::cpu());
  Tensor ma = Tensor::zeros({blocks}, DType::F32, Device::cpu()),
         va = Tensor::zeros({blocks}, DType::F32, Device::cpu());
  AdamWHyper h;
  h.lr = 1e-4f, h.weight_decay = 0.01f;
  for (auto _ : state) {
    if (eight_bit)
      adamw8bit_update(p, g, Tensor(), m, ma, v, va, h);
    else
      adamw_update(p, g, Tensor(), m, v, h);
    ++h.step;
  }
  state.counters["elements/s"] =
      benchmark::Counter(double(n), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

BENCHMARK_CAPTURE(BM_Gemm, f32, DType::F32)->Arg(256)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Gemm, bf16, DType::BF16)->Arg(256)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LinearWeightGrad, f32, DType::F32)
    ->Args({768, 192, 512})
    ->Args({2048, 384, 384})   // the 19.2M model's attention projections: 384 columns, two column tiles
    ->Args({2048, 384, 1024})  // and its MLP's up projection
    ->Args({2048, 1024, 1024})
    ->Args({2048, 256, 688})  // the 5.2M model's MLP
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_OneDnnWeightGrad, f32, DType::F32)
    ->Args({768, 192, 512})
    ->Args({2048, 1024, 1024})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LinearWeightGrad, bf16, DType::BF16)->Args({2048, 1024, 1024})->Unit(benchmark::kMillisecond);
#define HR_LINEAR_SHAPES         \
  Args({768, 192, 192})          \
      ->Args({768, 192, 512})    \
      ->Args({768, 512, 192})    \
      ->Args({512, 128, 128})    \
      ->Args({2048, 384, 384})   \
      ->Args({2048, 384, 1024})  \
      ->Args({2048, 1024, 384})  \
      ->Args({4096, 1024, 1024}) \
      ->Args({2048, 256, 688})   \
      ->Args({2048, 688, 256})   \
      ->Args({2048, 256, 256})   \
      ->Args({1040, 192, 192})
BENCHMARK_CAPTURE(BM_Linear, f32, DType::F32)->HR_LINEAR_SHAPES->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_OneDnnLinear, f32, DType::F32)->HR_LINEAR_SHAPES->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Linear, bf16, DType::BF16)->HR_LINEAR_SHAPES->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_OneDnnLinear, bf16, DType::BF16)->HR_LINEAR_SHAPES->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Attention, fwd_f32, DType::F32, false)
    ->Args({512, 0})
    ->Args({2048, 0})
    ->Args({2048, 256})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Attention, bwd_f32, DType::F32, true)
    ->Args({512, 0})
    ->Args({2048, 0})
    ->Args({2048, 256})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Attention, fwd_bf16, DType::BF16, false)
    ->Args({512, 0})
    ->Args({2048, 0})
    ->Args({2048, 256})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Attention, bwd_bf16, DType::BF16, true)
    ->Args({512, 0})
    ->Args({2048, 0})
    ->Args({2048, 256})
    ->Unit(benchmark::kMillisecond);

BENCHMARK_CAPTURE(BM_AttentionBatch, f32, DType::F32)
    ->Args({16, 128, 8, 4, 32, 1})
    ->Args({16, 65, 4, 4, 48, 0})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_AttentionBatch, bf16, DType::BF16)
    ->Args({16, 128, 8, 4, 32, 1})
    ->Args({16, 65, 4, 4, 48, 0})
    ->Unit(benchmark::kMillisecond);

BENCHMARK(BM_GradNorm)->Arg(1 << 16)->Arg(1 << 22)->Arg(1 << 25)->Unit(benchmark::kMillisecond);

BENCHMARK_CAPTURE(BM_Rope, per_call_bf16, DType::BF16, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Rope, table_bf16, DType::BF16, true)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RopeTable)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_AddNorm, unfused_bf16, DType::BF16, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_AddNorm, fused_bf16, DType::BF16, true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_AddNorm, unfused_f32, DType::F32, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_AddNorm, fused_f32, DType::F32, true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Swiglu, bf16, DType::BF16)->Unit(benchmark::kMillisecond);
#define HR_TOWER_MLP_SHAPES Args({8 * 65, 1024})->Args({4 * 577, 4096})
BENCHMARK_CAPTURE(BM_BiasUnary, unfused_bf16, DType::BF16, false)->HR_TOWER_MLP_SHAPES->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_BiasUnary, fused_bf16, DType::BF16, true)->HR_TOWER_MLP_SHAPES->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_BiasUnary, unfused_f32, DType::F32, false)->HR_TOWER_MLP_SHAPES->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_BiasUnary, fused_f32, DType::F32, true)->HR_TOWER_MLP_SHAPES->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Swiglu, f32, DType::F32)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Unary, quick_gelu_bf16, UnaryOp::QuickGelu, DType::BF16)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Unary, quick_gelu_f32, UnaryOp::QuickGelu, DType::F32)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Unary, gelu_tanh_bf16, UnaryOp::GeluTanh, DType::BF16)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Unary, gelu_bf16, UnaryOp::Gelu, DType::BF16)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_SumLeading, bf16, DType::BF16)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_SumLeading, f32, DType::F32)->Unit(benchmark::kMillisecond);
// The bench's labels (~6 a sequence) and every position labelled, at the default chunk and at 128-1024 rows.
#define HR_CE_SHAPES ArgsProduct({{0, 128, 256, 512, 1024}, {48, 8 * 255}})
BENCHMARK_CAPTURE(BM_CrossEntropy, f32, DType::F32)->HR_CE_SHAPES->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CrossEntropy, bf16, DType::BF16)->HR_CE_SHAPES->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Optimizer, adamw, false)->Arg(1 << 22)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Optimizer, adamw_8bit, true)->Arg(1 << 22)->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
