// Parameter and argument structs shared by ops and kernels: each op's shape rule lives in its ops/ file,
// the kernels see these fully-allocated argument packs.
#pragma once

#include <cstdint>

#include "core/quant.h"
#include "core/tensor.h"

namespace hr::core {

enum class UnaryOp : uint8_t { Gelu, GeluTanh, QuickGelu, Silu };
enum class ReduceOp : uint8_t { Sum, SumSquares };
enum class NormKind : uint8_t { LayerNorm, RMSNorm };
enum class Mask : uint8_t { None, Causal };
// Which attention a workspace is for: training's forward and backward, or a forward against a KV cache
// (generation), which GPUs run on the own kernel only.
enum class AttentionPass : uint8_t { Forward, Backward, Cached };
enum class Accumulate : uint8_t { No, Yes };
// Whether a layer (Linear, LayerNorm) has a bias, whose gradient its backward computes.
enum class Bias : uint8_t { No, Yes };
// patchify's direction: images to patch rows (the forward), or patch rows back into images (its backward).
enum class PatchDirection : uint8_t { ToPatches, ToImages };
// Whether a kernel still checks its labels (ids against the vocabulary), or the caller has checked all of them
// already (on the host, once per batch): a GPU check costs a synchronisation of the host each call.
enum class LabelCheck : uint8_t { InKernel, Done };

// C[b] = alpha * A[b] @ B[b] + beta * C[b]; A is (batch, m, k), B (batch, k, n), C (batch, m, n) contiguous.
// A and B may be any strided 3-D views (a transpose is just strides); batch stride 0 broadcasts.
struct GemmDesc {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  DType a_dtype = DType::F32, b_dtype = DType::F32, c_dtype = DType::F32;
  int64_t a_strides[3] = {0, 0, 0}, b_strides[3] = {0, 0, 0};
  float alpha = 1.f, beta = 0.f;
};

struct GemmArgs {
  GemmDesc desc;
  Tensor a, b, c;
  Tensor workspace;   // gemm_workspace_bytes(desc): operands staged in another dtype
  Tensor scratchpad;  // gemm_scratchpad_bytes(desc): the GEMM kernel's own scratch
};

// Layer norm: y = (x - mean) * rstd * weight + bias. RMS norm: y = x * rstd * weight.
// x, y, dy, dx are (rows, cols); mean and rstd are f32 (rows) saved for backward.
// The pre-norm blocks' residual add, fused: in the forward, where `residual` (rows, cols) is defined, x += residual
// first (x rounded to its dtype, as add_ leaves it) and y normalizes that sum; in the backward, where `dresidual`
// is defined, dx = the norm's dx (rounded) + dresidual. The same values as the add beside the norm, in one pass.
struct NormArgs {
  NormKind kind = NormKind::LayerNorm;
  float eps = 1e-5f;
  Tensor x, weight, bias, y, mean, rstd;
  Tensor dy, dx, dweight, dbias, workspace;
  Accumulate accumulate = Accumulate::No;  // add into dweight/dbias instead of overwriting
  Tensor residual, dresidual;
};

// A linear mix of rows (an AnyRes image's tokens from its crops' features, models/anyres.h): out[t] is the sum over
// k in [begin[t], begin[t + 1]) of weight[k] x (row[k] < 0 ? extra : src[row[k]]), in entry order, accumulated in
// f32. src (rows, dim), extra (dim) or undefined, begin (tokens + 1) and row (entries) i64, weight (entries) f32,
// out (tokens, dim) of src's dtype.
struct MixArgs {
  Tensor src, extra, begin, row, weight, out;
};

// Rotary embedding in the rotate-half layout of LLaMA: x is (batch, seq, heads, head_dim), positions (batch, seq).
// With `table` defined (f32 (batch, seq, 2, head_dim / 2): each token's cosines, then its sines; rope_table's) the
// angles are read from it and positions and theta are not used. rope_table itself fills `out` with that table from
// positions and theta (x unused).
struct RopeArgs {
  Tensor x, positions, out;
  float theta = 10000.f;
  bool inverse = false;  // rotate by -angle: the backward pass
  Tensor table;
};

// q is (batch, q_len, q_heads, head_dim), k and v (batch, kv_len, kv_heads, head_dim), q_heads % kv_heads == 0.
// lse is f32 (batch, q_heads, q_len). With Mask::Causal query i sits at key position p = i + kv_len - q_len and sees
// keys j <= p; with a sliding window (causal only; 0: none) only p - window < j <= p, the `window` keys up to its
// own (Mistral's and Qwen2's sliding_window, as transformers masks it).
struct AttentionDesc {
  int64_t batch = 0, q_len = 0, kv_len = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  DType dtype = DType::F32;
  Mask mask = Mask::None;
  int64_t window = 0;
  // Whether the window hides any key from any query: a window of at least kv_len is plain causal attention, and
  // a window is the causal mask's only (every kernel's loop bounds read this, not `window` itself).
  bool windowed() const { return mask == Mask::Causal && window > 0 && window < kv_len; }
  // The window the kernels apply: `window` where it hides keys, else 0 (none).
  int64_t applied_window() const { return windowed() ? window : 0; }
};

struct AttentionArgs {
  AttentionDesc desc;
  float scale = 1.f;
  Tensor q, k, v, out, lse;
  // Optional, forward only (a KV cache): i64 (batch) on q's device. Row b's query i sits at position
  // p = past[b] + i and sees keys j <= p (p - window < j <= p with a window); k and v are the cache, kv_len its
  // capacity.
  Tensor past;
  Tensor dout, dq, dk, dv;
  Tensor workspace;
};

// One chunk of the fused output-projection cross-entropy: logits (rows, vocab) f32 for `rows` tokens.
// Forward writes lse (rows) and adds sum(-log p[label]) * inv_normalizer over valid rows into `loss` (f32 scalar).
// Backward writes d(loss)/d(logits) = (softmax - onehot) * dloss * inv_normalizer (0 on ignored rows) over the
// logits and, where `dlogits` is defined (rows, vocab, contiguous, any float dtype: a GEMM operand type), cast
// into it as well, in the same pass.
struct CrossEntropyArgs {
  Tensor logits, labels, lse, loss, dloss;
  int64_t ignore_index = -100;
  float inv_normalizer = 1.f;
  Tensor dlogits;
  LabelCheck check = LabelCheck::InKernel;
};

// A tile of a quantized weight, dequantized: out (rows, cols) contiguous float <- the weight's elements
// [row0, row0 + rows) x [col0, col0 + cols). `blob` is the whole weight as core/quant.h lays it out (its header
// holds double quant's offset, which kernels read from the blob itself).
struct DequantArgs {
  Tensor blob;
  QuantLayout layout;
  int64_t row0 = 0, col0 = 0;
  Tensor out;
};

}  // namespace hr::core
