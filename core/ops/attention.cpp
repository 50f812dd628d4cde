// Fused attention: shape rules, allocation, dispatch.
#include "core/ops/attention.h"

#include "core/ops/dispatch.h"

namespace hr::core {

namespace {
AttentionDesc describe(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, Mask mask, int64_t window) {
  check_float(op, "q", q);
  HR_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "[", op,
           "] q, k, v must be (batch, seq, heads, head_dim); got ", q.describe(), ", ", k.describe(), ", ",
           v.describe());
  HR_CHECK(k.shape() == v.shape(), "[", op, "] k ", shape_str(k.shape()), " and v ", shape_str(v.shape()), " differ");
  HR_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), "[", op, "] q, k, v dtypes differ");
  check_same_device(op, q, k);
  check_same_device(op, q, v);
  AttentionDesc d;
  d.batch = q.size(0);
  d.q_len = q.size(1);
  d.q_heads = q.size(2);
  d.head_dim = q.size(3);
  d.kv_len = k.size(1);
  d.kv_heads = k.size(2);
  d.dtype = q.dtype();
  d.mask = mask;
  HR_CHECK(k.size(0) == d.batch && k.size(3) == d.head_dim, "[", op, "] k ", shape_str(k.shape()), " does not match q ",
           shape_str(q.shape()));
  HR_CHECK(d.kv_heads > 0 && d.q_heads % d.kv_heads == 0, "[", op, "] q_heads ", d.q_heads,
           " is not a multiple of kv_heads ", d.kv_heads);
  HR_CHECK(mask == Mask::None || d.kv_len >= d.q_len, "[", op, "] causal mask needs kv_len >= q_len; got ", d.kv_len,
           " < ", d.q_len);
  HR_CHECK(window >= 0 && (window == 0 || mask == Mask::Causal), "[", op, "] a sliding window (", window,
           ") needs the causal mask and at least one token");
  d.window = window;
  return d;
}
}  // namespace

AttentionOut attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Mask mask, float scale,
                               int64_t window) {
  AttentionArgs a;
  a.desc = describe("attention", q, k, v, mask, window);
  a.scale = scale;
  a.q = q.contiguous();
  a.k = k.contiguous();
  a.v = v.contiguous();
  AttentionOut out;
  a.out = out.out = Tensor::empty(q.shape(), q.dtype(), q.device());
  a.lse = out.lse = Tensor::empty({a.desc.batch, a.desc.q_heads, a.desc.q_len}, DType::F32, q.device());
  a.workspace = allocate_workspace(sizing_kernels(q.device()).attention_workspace_bytes(a.desc, AttentionPass::Forward),
                                   q.device());
  launch("attention", q.device(), &Kernels::attention_forward, a);
  return out;
}

AttentionOut attention_cached(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& past,
                              float scale, int64_t window) {
  AttentionArgs a;
  a.desc = describe("attention_cached", q, k_cache, v_cache, Mask::Causal, window);
  HR_CHECK(past.dtype() == DType::I64 && past.dim() == 1 && past.size(0) == a.desc.batch,
           "[attention_cached] past must be i64 (", a.desc.batch, "); got ", past.describe());
  check_same_device("attention_cached", q, past);
  a.scale = scale;
  a.q = q.contiguous();
  a.k = k_cache.contiguous();
  a.v = v_cache.contiguous();
  a.past = past.contiguous();
  AttentionOut out;
  a.out = out.out = Tensor::empty(q.shape(), q.dtype(), q.device());
  a.lse = out.lse = Tensor::empty({a.desc.batch, a.desc.q_heads, a.desc.q_len}, DType::F32, q.device());
  a.workspace = allocate_workspace(sizing_kernels(q.device()).attention_workspace_bytes(a.desc, AttentionPass::Cached),
                                   q.device());
  launch("attention_cached", q.device(), &Kernels::attention_cached, a);
  return out;
}

AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const AttentionOut& saved, Mask mask, float scale, int64_t window) {
  AttentionArgs a;
  a.desc = describe("attention_backward", q, k, v, mask, window);
  check_shape("attention_backward", "dout", dout, q.shape());
  check_shape("attention_backward", "out", saved.out, q.shape());
  check_shape("attention_backward", "lse", saved.lse, {a.desc.batch, a.desc.q_heads, a.desc.q_len});
  a.scale = scale;
  a.q = q.contiguous();
  a.k = k.contiguous();
  a.v = v.contiguous();
  a.out = saved.out.contiguous();
  a.lse = saved.lse.contiguous();
  a.dout = dout.contiguous();
  AttentionGrads g;
  a.dq = g.dq = Tensor::empty(q.shape(), q.dtype(), q.device());
  a.dk = g.dk = Tensor::empty(k.shape(), k.dtype(), k.device());
  a.dv = g.dv = Tensor::empty(v.shape(), v.dtype(), v.device());
  a.workspace = allocate_workspace(
      sizing_kernels(q.device()).attention_workspace_bytes(a.desc, AttentionPass::Backward), q.device());
  launch("attention_backward", q.device(), &Kernels::attention_backward, a);
  return g;
}

}  // namespace hr::core
