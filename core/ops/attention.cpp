// Fused attention: shape rules, allocation, dispatch.
#include "core/ops/attention.h"

#include <algorithm>

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

// What one pass over `d` adds to matmul_flops: 4 head_dim per query-key pair the mask lets through (S = QK^T and
// PV), 2.5 times that backward.
double attention_flops(const AttentionDesc& d, AttentionPass pass) {
  double pairs = 0;
  if (d.mask == Mask::None) {
    pairs = double(d.q_len) * double(d.kv_len);
  } else {
    for (int64_t i = 0; i < d.q_len; ++i) {
      const int64_t p = d.kv_len - d.q_len + i;  // query i's position: the queries are the keys' last
      pairs += double(d.windowed() ? std::min(p + 1, d.window) : p + 1);
    }
  }
  const double forward = 4.0 * pairs * double(d.head_dim) * double(d.batch) * double(d.q_heads);
  return pass == AttentionPass::Backward ? 2.5 * forward : forward;
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
  add_matmul_flops(q.device(), attention_flops(a.desc, AttentionPass::Forward));
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
  add_matmul_flops(q.device(), attention_flops(a.desc, AttentionPass::Backward));
  return g;
}

namespace {
// The packed tensors' sequences, each run as a batch of one on views of them: sequence s's keys and values are rows
// [at, at + lengths[s]) of k and v, its queries rows [q_at, q_at + queries[s]) of q, its last positions.
struct PackedSequences {
  const char* op;
  std::vector<int64_t> lengths, queries;
  int64_t total = 0, q_total = 0;

  PackedSequences(const char* op_name, const Tensor& q, const Tensor& k, const std::vector<int64_t>& seq_lengths,
                  const std::vector<int64_t>& seq_queries)
      : op(op_name), lengths(seq_lengths), queries(seq_queries.empty() ? seq_lengths : seq_queries) {
    HR_CHECK(q.dim() == 4 && q.size(0) == 1 && k.dim() == 4 && k.size(0) == 1, "[", op,
             "] packed q, k, v must be (1, total, heads, head_dim); got ", q.describe(), " and ", k.describe());
    HR_CHECK(queries.size() == lengths.size(), "[", op, "] ", queries.size(), " query counts for ", lengths.size(),
             " sequences");
    for (std::size_t s = 0; s < lengths.size(); ++s) {
      const int64_t n = lengths[s], nq = queries[s];
      HR_CHECK(n > 0, "[", op, "] a packed sequence has length ", n, "; every one needs at least one token");
      HR_CHECK(nq > 0 && nq <= n, "[", op, "] sequence ", s, " of ", n, " positions keeps ", nq,
               " queries; it needs between 1 and its length");
      total += n;
      q_total += nq;
    }
    HR_CHECK(!lengths.empty() && total == k.size(1) && q_total == q.size(1), "[", op, "] ", lengths.size(),
             " sequences of ", total, " tokens in all (", q_total, " queries) do not pack q ", shape_str(q.shape()),
             " and k ", shape_str(k.shape()));
  }
  // Rows [at, at + n) of a packed (1, total, heads, head_dim) tensor.
  static Tensor rows(const Tensor& t, int64_t at, int64_t n) { return t.slice(1, at, at + n); }
  // Queries at..at+n's (1, heads, n) block of a packed lse.
  static Tensor lse_rows(const Tensor& lse, int64_t heads, int64_t at, int64_t n) {
    return lse.slice(0, heads * at, heads * (at + n)).view({1, heads, n});
  }
  struct Span {
    int64_t at, n, q_at, q_n;  // the sequence's rows of k and v, and of q
  };
  // fn(args, span) for each sequence, its args holding the views of q, k and v, their description, the scale and
  // one workspace for every sequence, sized for the one needing most.
  template <typename Fn>
  void each(const Tensor& q, const Tensor& k, const Tensor& v, Mask mask, float scale, int64_t window,
            AttentionPass pass, Fn&& fn) const {
    auto args_of = [&](const Span& s) {
      AttentionArgs a;
      a.q = rows(q, s.q_at, s.q_n);
      a.k = rows(k, s.at, s.n);
      a.v = rows(v, s.at, s.n);
      a.desc = describe(op, a.q, a.k, a.v, mask, window);
      a.scale = scale;
      return a;
    };
    auto spans = [&](auto&& visit) {
      Span s{0, 0, 0, 0};
      for (std::size_t i = 0; i < lengths.size(); ++i) {
        s.n = lengths[i];
        s.q_n = queries[i];
        visit(s);
        s.at += s.n;
        s.q_at += s.q_n;
      }
    };
    std::size_t bytes = 0;
    spans([&](const Span& s) {
      bytes = std::max(bytes, sizing_kernels(q.device()).attention_workspace_bytes(args_of(s).desc, pass));
    });
    const Tensor workspace = allocate_workspace(bytes, q.device());
    spans([&](const Span& s) {
      AttentionArgs a = args_of(s);
      a.workspace = workspace;
      fn(a, s);
    });
  }
};
}  // namespace

AttentionOut attention_forward_packed(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const std::vector<int64_t>& lengths, Mask mask, float scale, int64_t window,
                                      const std::vector<int64_t>& queries) {
  const PackedSequences p("attention_forward_packed", q, k, lengths, queries);
  describe(p.op, q, k, v, mask, window);  // the whole tensors' checks
  const Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  AttentionOut out;
  out.out = Tensor::empty(q.shape(), q.dtype(), q.device());
  out.lse = Tensor::empty({q.size(2) * p.q_total}, DType::F32, q.device());
  p.each(qc, kc, vc, mask, scale, window, AttentionPass::Forward,
         [&](AttentionArgs& a, const PackedSequences::Span& s) {
           a.out = p.rows(out.out, s.q_at, s.q_n);
           a.lse = p.lse_rows(out.lse, a.desc.q_heads, s.q_at, s.q_n);
           launch("attention_forward_packed", q.device(), &Kernels::attention_forward, a);
           add_matmul_flops(q.device(), attention_flops(a.desc, AttentionPass::Forward));
         });
  return out;
}

AttentionGrads attention_backward_packed(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                         const AttentionOut& saved, const std::vector<int64_t>& lengths, Mask mask,
                                         float scale, int64_t window, const std::vector<int64_t>& queries) {
  const PackedSequences p("attention_backward_packed", q, k, lengths, queries);
  describe(p.op, q, k, v, mask, window);
  check_shape(p.op, "dout", dout, q.shape());
  check_shape(p.op, "out", saved.out, q.shape());
  check_shape(p.op, "lse", saved.lse, {q.size(2) * p.q_total});
  const Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous(), oc = saved.out.contiguous(),
               lc = saved.lse.contiguous(), dc = dout.contiguous();
  AttentionGrads g;
  g.dq = Tensor::empty(q.shape(), q.dtype(), q.device());
  g.dk = Tensor::empty(k.shape(), k.dtype(), k.device());
  g.dv = Tensor::empty(v.shape(), v.dtype(), v.device());
  p.each(qc, kc, vc, mask, scale, window, AttentionPass::Backward,
         [&](AttentionArgs& a, const PackedSequences::Span& s) {
           a.out = p.rows(oc, s.q_at, s.q_n);
           a.lse = p.lse_rows(lc, a.desc.q_heads, s.q_at, s.q_n);
           a.dout = p.rows(dc, s.q_at, s.q_n);
           a.dq = p.rows(g.dq, s.q_at, s.q_n);
           a.dk = p.rows(g.dk, s.at, s.n);
           a.dv = p.rows(g.dv, s.at, s.n);
           launch("attention_backward_packed", q.device(), &Kernels::attention_backward, a);
           add_matmul_flops(q.device(), attention_flops(a.desc, AttentionPass::Backward));
         });
  return g;
}

}  // namespace hr::core
