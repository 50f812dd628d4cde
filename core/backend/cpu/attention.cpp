// CPU fused attention: FlashAttention-2 tiling with an online softmax. Memory is O(L): only per-thread tiles,
// the saved log-sum-exp and (backward) one f32 row statistic per query live beside the inputs and outputs.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>

#include "core/backend/cpu/attention_bf16.h"
#include "core/backend/cpu/attention_f32.h"
#include "core/backend/cpu/attention_f32x8.h"
#include "core/backend/cpu/cpu_common.h"
#include "core/backend/cpu/cpu_kernels.h"

namespace hr::cpu {

void bf16_tiles::rows_do_not_fit(int64_t cols, int64_t dst_ld) {
  assert_fail("cols <= 64 && dst_ld >= cols", __FILE__, __LINE__,
              str("bf16 rows of ", cols, " into a stride of ", dst_ld));
}

namespace {

constexpr int64_t kBlockQ = 64;  // query rows per tile
constexpr int64_t kBlockK = 64;  // key rows per tile
// The f32 backward holds a key tile's K^T (d x kBlockK) in the slot of the query tile's dQ (kBlockQ x d).
static_assert(kBlockK <= kBlockQ, "K^T must fit into the dQt slot");

using MapRow = Eigen::Map<Eigen::ArrayXf>;  // a score row: exponentials in Eigen's vectorized exp

// The f32 tile products, C[m x n] = alpha A B (+ C), with f32_tiles::dot's arguments: 16 floats wide where the CPU
// has AVX-512, 8 wide elsewhere.
void tile_dot(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col, const float* b,
              int64_t ldb, float* c, int64_t ldc, float alpha, bool accumulate) {
  if (avx512_tiles_present()) return f32_tiles::dot(m, n, k, a, a_row, a_col, b, ldb, c, ldc, alpha, accumulate);
  f32x8_tiles::dot(m, n, k, a, a_row, a_col, b, ldb, c, ldc, alpha, accumulate);
}

// dst[c * rows + r] = mul * x[r * stride + c] in 8 x 8 AVX2 blocks on every CPU (the forward transposes a key tile
// for every query tile it meets). On AVX-512 too: 16-lane gathers, one column of 16 rows at a time, took 3.6x as
// long per 64 x 32 tile on a Zen 4 (907 against 250 ns), whose gathers are slow.
void tile_transpose(const float* x, int64_t stride, int64_t rows, int64_t cols, float* dst, float mul = 1.f) {
  f32x8_tiles::transpose(x, stride, rows, cols, dst, mul);
}

std::size_t fwd_slot_bytes(int64_t d) {
  return WorkspaceCarver::bytes(kBlockQ * d) * 2 + WorkspaceCarver::bytes(kBlockK * d) * 2 +
         WorkspaceCarver::bytes(kBlockQ * kBlockK) + WorkspaceCarver::bytes(kBlockQ) * 2;
}
std::size_t bwd_slot_bytes(int64_t d) {
  return WorkspaceCarver::bytes(kBlockQ * d) * 3 + WorkspaceCarver::bytes(kBlockK * d) * 4 +
         WorkspaceCarver::bytes(kBlockQ * kBlockK) * 2;
}

// The row of head `head` at sequence position `pos` of the batch row starting at `batch_off` ([batch, seq, heads, d]:
// the next position's row is heads * d further on).
template <typename T>
T* head_row(T* base, int64_t batch_off, int64_t pos, int64_t heads, int64_t head, int64_t d) {
  return base + ((batch_off + pos) * heads + head) * d;
}

// Copies `rows` rows of head `head` starting at sequence position `start` into a dense f32 tile.
template <typename T>
void load_tile(const T* base, int64_t batch_off, int64_t start, int64_t rows, int64_t heads, int64_t head, int64_t d,
               float* tile, float mul = 1.f) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* src = head_row(base, batch_off, start + r, heads, head, d);
    for (int64_t c = 0; c < d; ++c) tile[r * d + c] = load(src, c) * mul;
  }
}

// The same rows transposed: tile[c * rows + r] (a d x rows tile), the B of a product A X^T.
template <typename T>
void load_tile_transposed(const T* base, int64_t batch_off, int64_t start, int64_t rows, int64_t heads, int64_t head,
                          int64_t d, float* tile) {
  if constexpr (std::is_same_v<T, float>)
    return tile_transpose(head_row(base, batch_off, start, heads, head, d), heads * d, rows, d, tile);
  for (int64_t r = 0; r < rows; ++r) {
    const T* src = head_row(base, batch_off, start + r, heads, head, d);
    for (int64_t c = 0; c < d; ++c) tile[c * rows + r] = load(src, c);
  }
}

template <typename T>
void store_tile(T* base, int64_t batch_off, int64_t start, int64_t rows, int64_t heads, int64_t head, int64_t d,
                const float* tile) {
  for (int64_t r = 0; r < rows; ++r) {
    T* dst = head_row(base, batch_off, start + r, heads, head, d);
    for (int64_t c = 0; c < d; ++c) store(dst, c, tile[r * d + c]);
  }
}

// The keys [first, last) of a tile starting at key j0 that the query at key position `pos` sees (first == last:
// none): all of them without a mask, those up to its own position under the causal one, and with a sliding window
// (window > 0) only the `window` positions up to its own.
struct Seen {
  int64_t first, last;
};
inline Seen seen_keys(bool causal, int64_t window, int64_t pos, int64_t j0, int64_t bk) {
  if (!causal) return {0, bk};
  const int64_t last = std::clamp<int64_t>(pos - j0 + 1, 0, bk);
  return {window > 0 ? std::clamp<int64_t>(pos - window - j0 + 1, 0, last) : 0, last};
}

// The larger of two scores, NaN if either is NaN.
inline float nan_max(float a, float b) {
  return std::isnan(a) || a > b ? a : b;
}

// One query's score row of a tile (bk keys, the `seen` ones visible) through the online softmax: the row becomes
// its exponentials (zeros outside `seen`), the running max m and sum l take the tile in, and the output row o
// (d values) is rescaled to the new max.
void online_softmax_row(float* sr, int64_t bk, Seen seen, float& m, float& l, float* o, int64_t d) {
  MapRow row(sr + seen.first, seen.last - seen.first);
  // NaN propagates, as in the reference softmax: std::max(-inf, NaN) is -inf, which would take a row of NaN
  // scores for a fully masked one (zeros) and hide the fault from the non-finite check.
  const float mx = seen.last > seen.first ? nan_max(m, row.maxCoeff<Eigen::PropagateNaN>()) : m;
  if (mx == -INFINITY) {
    std::fill(sr, sr + bk, 0.f);
    return;
  }
  const float alpha = std::exp(m - mx);
  row = (row - mx).exp();
  const float sum = row.sum();
  std::fill(sr, sr + seen.first, 0.f);
  std::fill(sr + seen.last, sr + bk, 0.f);
  l = l * alpha + sum;
  m = mx;
  for (int64_t c = 0; c < d; ++c) o[c] *= alpha;
}

}  // namespace

std::size_t attention_workspace_bytes(const AttentionDesc& a, AttentionPass pass) {
  const std::size_t slots = std::size_t(num_threads());
  if (pass != AttentionPass::Backward) return slots * fwd_slot_bytes(a.head_dim);
  std::size_t bytes = slots * bwd_slot_bytes(a.head_dim);
  bytes += WorkspaceCarver::bytes(std::size_t(a.batch * a.q_heads * a.q_len));  // delta = rowsum(dO * O)
  if (a.dtype != DType::F32)
    bytes += WorkspaceCarver::bytes(std::size_t(a.batch * a.q_len * a.q_heads * a.head_dim));  // f32 dQ
  return bytes;
}

namespace {

// head_row's rows as bf16 bits, for the bf16 tile products.
inline const uint16_t* bf16_rows(const bf16* base, int64_t batch_off, int64_t start, int64_t heads, int64_t head,
                                 int64_t d) {
  return reinterpret_cast<const uint16_t*>(head_row(base, batch_off, start, heads, head, d));
}

// Whether a bf16 attention of this shape runs its tile products in bf16 (attention_bf16.h): on a CPU with
// AVX512-BF16 that oneDNN may use too, for an even head size (the products reduce over pairs).
bool bf16_tiles_for(const AttentionDesc& s) {
  return s.dtype == DType::BF16 && s.head_dim % 2 == 0 && bf16_tiles_present();
}

// What a forward reads and writes.
template <typename T>
struct ForwardIo {
  const T *q, *k, *v;
  T* out;
  float* lse;
  explicit ForwardIo(const AttentionArgs& a)
      : q(a.q.data<T>()), k(a.k.data<T>()), v(a.v.data<T>()), out(a.out.data<T>()), lse(a.lse.data<float>()) {}
};

// One (batch, head, query tile) task of a forward: its queries i0 .. i0 + bq of head h (kv head kvh), query i at
// key position i + off, the keys [kbegin, kend) that any of them sees, and the thread's tiles (the slot's layout,
// fwd_slot_bytes; each forward decides what the Q, O and S tiles hold).
struct ForwardTask {
  int64_t b, h, kvh, i0, bq, off, kbegin, kend;
  float *Q, *O, *K, *V, *S, *m, *l;
};

// Runs fn(task) for every (batch, head, query tile), in parallel, each on its thread's slot of the workspace.
template <typename Fn>
void for_each_query_tile(const AttentionArgs& a, Fn&& fn) {
  const AttentionDesc& s = a.desc;
  const int64_t d = s.head_dim, group = s.q_heads / s.kv_heads, uniform_off = s.kv_len - s.q_len;
  const int64_t qblocks = (s.q_len + kBlockQ - 1) / kBlockQ;
  const bool causal = s.mask == Mask::Causal;
  const int64_t window = s.applied_window();
  const int64_t* past = a.past.defined() ? a.past.data<int64_t>() : nullptr;
  char* ws = static_cast<char*>(a.workspace.data_ptr());
#pragma omp parallel for schedule(dynamic)
  for (int64_t task = 0; task < s.batch * s.q_heads * qblocks; ++task) {
    ForwardTask t;
    t.b = task / (s.q_heads * qblocks);
    t.h = (task / qblocks) % s.q_heads;
    t.kvh = t.h / group;
    t.i0 = (task % qblocks) * kBlockQ;
    t.bq = std::min(kBlockQ, s.q_len - t.i0);
    t.off = past ? past[t.b] : uniform_off;
    t.kend = causal ? std::min(s.kv_len, t.i0 + t.bq + t.off) : s.kv_len;
    t.kbegin = window > 0 ? std::max<int64_t>(0, t.i0 + t.off - window + 1) : 0;  // the first query's first key
    WorkspaceCarver wc(ws + std::size_t(omp_get_thread_num()) * fwd_slot_bytes(d));
    t.Q = wc.floats(kBlockQ * d);
    t.O = wc.floats(kBlockQ * d);
    t.K = wc.floats(kBlockK * d);
    t.V = wc.floats(kBlockK * d);
    t.S = wc.floats(kBlockQ * kBlockK);
    t.m = wc.floats(kBlockQ);
    t.l = wc.floats(kBlockQ);
    fn(t);
  }
}

// The forward over every (batch, head, query tile), a row of scores per query; kBf16: the tile products in bf16,
// reading q, k and v in place and packing k and v into the f32 tiles' slots (half their size), the scores rounded
// to bf16 in place for P V; otherwise f32 products 8 floats wide (CPUs without AVX-512: forward_columns below has
// them).
template <typename T, bool kBf16>
void forward_tiles(const AttentionArgs& a) {
  const AttentionDesc& s = a.desc;
  const int64_t d = s.head_dim, window = s.applied_window();
  const bool causal = s.mask == Mask::Causal;
  const ForwardIo<T> io(a);
  for_each_query_tile(a, [&](const ForwardTask& t) {
    const int64_t b = t.b, h = t.h, kvh = t.kvh, i0 = t.i0, bq = t.bq, off = t.off;
    float *Q = t.Q, *O = t.O, *K = t.K, *V = t.V, *S = t.S, *m = t.m, *l = t.l;
    if constexpr (!kBf16) load_tile(io.q, b * s.q_len, i0, bq, s.q_heads, h, d, Q, a.scale);
    std::fill(O, O + bq * d, 0.f);
    std::fill(m, m + bq, -INFINITY);
    std::fill(l, l + bq, 0.f);
    for (int64_t j0 = t.kbegin; j0 < t.kend; j0 += kBlockK) {
      const int64_t bk = std::min(kBlockK, t.kend - j0);
      if constexpr (kBf16) {
        auto* Kt = reinterpret_cast<uint32_t*>(K);
        auto* Vp = reinterpret_cast<uint32_t*>(V);
        bf16_tiles::pack_transposed(bf16_rows(io.k, b * s.kv_len, j0, s.kv_heads, kvh, d), s.kv_heads * d, bk, d, Kt);
        bf16_tiles::pack_rows(bf16_rows(io.v, b * s.kv_len, j0, s.kv_heads, kvh, d), s.kv_heads * d, bk, d, Vp);
        bf16_tiles::dot(bq, bk, d / 2, bf16_rows(io.q, b * s.q_len, i0, s.q_heads, h, d), s.q_heads * d, Kt, S, bk,
                        a.scale, false);
      } else {  // K^T (d x bk) into K's tile: f32 K read in place, other dtypes through V's tile
        if constexpr (std::is_same_v<T, float>) {
          load_tile_transposed(io.k, b * s.kv_len, j0, bk, s.kv_heads, kvh, d, K);
        } else {
          load_tile(io.k, b * s.kv_len, j0, bk, s.kv_heads, kvh, d, V);
          tile_transpose(V, d, bk, d, K);
        }
        tile_dot(bq, bk, d, Q, d, 1, K, bk, S, bk, 1.f, false);
      }
      for (int64_t r = 0; r < bq; ++r) {
        const Seen seen = seen_keys(causal, window, i0 + r + off, j0, bk);
        if constexpr (kBf16)  // the bf16 tiles imply AVX-512
          f32_tiles::softmax_row(S + r * bk, bk, seen.first, seen.last, m[r], l[r], O + r * d, d);
        else
          online_softmax_row(S + r * bk, bk, seen, m[r], l[r], O + r * d, d);
      }
      if constexpr (kBf16) {
        const int64_t bke = bk + (bk & 1);  // P's rows padded to whole pairs
        auto* P = reinterpret_cast<uint16_t*>(S);
        bf16_tiles::round_rows(S, bk, bq, bk, P, bke);
        bf16_tiles::dot(bq, d, bke / 2, P, bke, reinterpret_cast<const uint32_t*>(V), O, d, 1.f, true);
      } else if constexpr (std::is_same_v<T, float>) {  // V read in place
        tile_dot(bq, d, bk, S, bk, 1, head_row(io.v, b * s.kv_len, j0, s.kv_heads, kvh, d), s.kv_heads * d, O, d, 1.f,
                 true);
      } else {
        load_tile(io.v, b * s.kv_len, j0, bk, s.kv_heads, kvh, d, V);
        tile_dot(bq, d, bk, S, bk, 1, V, d, O, d, 1.f, true);
      }
    }
    for (int64_t r = 0; r < bq; ++r) {  // l is 0 for a fully masked row only; NaN stays NaN
      const float inv = l[r] == 0.f ? 0.f : 1.f / l[r];
      for (int64_t c = 0; c < d; ++c) O[r * d + c] *= inv;
      io.lse[(b * s.q_heads + h) * s.q_len + i0 + r] = l[r] == 0.f ? -INFINITY : m[r] + std::log(l[r]);
    }
    store_tile(io.out, b * s.q_len, i0, bq, s.q_heads, h, d, O);
  });
}

// The forward on AVX-512 with the tiles held column-wise, in the same workspace: S^T = K Q^T per key tile, so that
// each query's softmax statistics run down a column, 16 queries to a vector (f32_tiles::softmax_columns), and
// O^T += V^T P^T takes P^T as S^T stands. Q^T is made once per query tile; f32 K and V are read in place, other
// dtypes convert them into the K and V tiles first.
template <typename T>
void forward_columns(const AttentionArgs& a) {
  const AttentionDesc& s = a.desc;
  const int64_t d = s.head_dim, window = s.applied_window();
  const bool causal = s.mask == Mask::Causal;
  const ForwardIo<T> io(a);
  constexpr bool kInPlace = std::is_same_v<T, float>;
  const int64_t kv_ld = kInPlace ? s.kv_heads * d : d;  // the row stride of the K and V rows the products read
  for_each_query_tile(a, [&](const ForwardTask& t) {
    const int64_t b = t.b, h = t.h, kvh = t.kvh, i0 = t.i0, bq = t.bq, off = t.off;
    float *Qt = t.Q, *Ot = t.O, *K = t.K, *V = t.V, *St = t.S, *m = t.m, *l = t.l;  // Q^T, O^T: d x bq; S^T: bk x bq
    if constexpr (kInPlace) {
      tile_transpose(head_row(io.q, b * s.q_len, i0, s.q_heads, h, d), s.q_heads * d, bq, d, Qt, a.scale);
    } else {
      load_tile(io.q, b * s.q_len, i0, bq, s.q_heads, h, d, K, a.scale);
      tile_transpose(K, d, bq, d, Qt);
    }
    std::fill(Ot, Ot + d * bq, 0.f);
    std::fill(m, m + bq, -INFINITY);
    std::fill(l, l + bq, 0.f);
    for (int64_t j0 = t.kbegin; j0 < t.kend; j0 += kBlockK) {
      const int64_t bk = std::min(kBlockK, t.kend - j0);
      const float* kr = K;
      const float* vr = V;
      if constexpr (kInPlace) {
        kr = head_row(io.k, b * s.kv_len, j0, s.kv_heads, kvh, d);
        vr = head_row(io.v, b * s.kv_len, j0, s.kv_heads, kvh, d);
      } else {
        load_tile(io.k, b * s.kv_len, j0, bk, s.kv_heads, kvh, d, K);
        load_tile(io.v, b * s.kv_len, j0, bk, s.kv_heads, kvh, d, V);
      }
      f32_tiles::dot(bk, bq, d, kr, kv_ld, 1, Qt, bq, St, bq, 1.f, false);
      // Key j0 + jj is visible to query r from r = j0 - i0 - off + jj on under the causal mask, to all without.
      const int64_t first_query = causal ? j0 - i0 - off : -kBlockK;
      f32_tiles::softmax_columns(St, bk, bq, first_query, window, m, l, Ot, d);
      f32_tiles::dot(d, bq, bk, vr, 1, kv_ld, St, bq, Ot, bq, 1.f, true);
    }
    float* row_lse = io.lse + (b * s.q_heads + h) * s.q_len + i0;
    for (int64_t r = 0; r < bq; ++r) {  // l is 0 for a fully masked row only; NaN stays NaN
      row_lse[r] = l[r] == 0.f ? -INFINITY : m[r] + std::log(l[r]);
      l[r] = l[r] == 0.f ? 0.f : 1.f / l[r];
    }
    f32_tiles::scale_columns(Ot, d, bq, bq, l);
    tile_transpose(Ot, bq, d, bq, K);  // O: bq x d
    store_tile(io.out, b * s.q_len, i0, bq, s.q_heads, h, d, K);
  });
}

}  // namespace

void attention_forward(const AttentionArgs& a) {
  dispatch_float(a.desc.dtype, "attention", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bf16>)
      if (bf16_tiles_for(a.desc)) return forward_tiles<T, true>(a);
    if (avx512_tiles_present()) return forward_columns<T>(a);
    forward_tiles<T, false>(a);
  });
}

namespace {

// delta[b, h, i] = sum_c dO[b, i, h, c] * O[b, i, h, c], and the same rows of the f32 dQ the tiles accumulate into
// zeroed in the same pass (on one thread, that fill was a serial memset of the whole dQ while the others waited).
template <typename T>
void row_deltas(const AttentionDesc& s, const T* dout, const T* o, float* delta, float* dq32) {
  const int64_t d = s.head_dim;
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < s.batch * s.q_len * s.q_heads; ++row) {
    const int64_t b = row / (s.q_len * s.q_heads), i = (row / s.q_heads) % s.q_len, h = row % s.q_heads;
    double acc = 0.0;
    for (int64_t c = 0; c < d; ++c) acc += double(load(dout, row * d + c)) * load(o, row * d + c);
    delta[(b * s.q_heads + h) * s.q_len + i] = float(acc);
    std::fill(dq32 + row * d, dq32 + (row + 1) * d, 0.f);
  }
}

// A thread's tiles, carved from its slot of the workspace (bwd_slot_bytes).
struct BackwardTiles {
  float *Q, *dO, *dQt, *K, *V, *dK, *dV, *P, *dP;
  BackwardTiles(WorkspaceCarver& wc, int64_t d)
      : Q(wc.floats(kBlockQ * d)),
        dO(wc.floats(kBlockQ * d)),
        dQt(wc.floats(kBlockQ * d)),
        K(wc.floats(kBlockK * d)),
        V(wc.floats(kBlockK * d)),
        dK(wc.floats(kBlockK * d)),
        dV(wc.floats(kBlockK * d)),
        P(wc.floats(kBlockQ * kBlockK)),
        dP(wc.floats(kBlockQ * kBlockK)) {}
};

// What a backward reads: the inputs, the forward's row statistics and the row deltas.
template <typename T>
struct BackwardInputs {
  const T *q, *dout;
  const float *lse, *delta;
  float* dq32;  // dQ accumulated in f32
};

// The pairs layouts of a bf16 backward's key tile, in the f32 tiles' slots (each half their size or less): K^T and
// V^T for the products with Q and dO, and K by key pairs for dQ = dS K.
struct Bf16KeyTile {
  uint32_t *Kt, *Kp, *Vt;
  Bf16KeyTile(BackwardTiles& t, int64_t d)
      : Kt(reinterpret_cast<uint32_t*>(t.K)), Kp(Kt + d / 2 * kBlockK), Vt(reinterpret_cast<uint32_t*>(t.V)) {}
};

// One query tile (rows i0.. of head h, batch b) against the key tile loaded at j0 (bk keys): P and dS recomputed
// from the forward's log-sum-exp, then this tile's share of dV and dK (accumulated in the tiles) and of dQ. kBf16:
// the products in bf16 (q and dO read in place and packed by row pairs into their f32 tiles' slots; P and dS rounded
// to bf16 in place, their transposes in the second half of the same slots).
template <typename T, bool kBf16>
void backward_tile(const AttentionArgs& a, const BackwardInputs<T>& in, BackwardTiles& t, int64_t b, int64_t h,
                   int64_t i0, int64_t j0, int64_t bk) {
  const AttentionDesc& s = a.desc;
  const int64_t d = s.head_dim, off = s.kv_len - s.q_len, bq = std::min(kBlockQ, s.q_len - i0);
  const bool causal = s.mask == Mask::Causal;
  const int64_t window = s.applied_window();
  // The f32 tile products read f32 q and dO in place (row stride q_ld) and accumulate dQ straight into dq32; other
  // dtypes convert q and dO into their tiles.
  const bool wide_rows = kBf16 || avx512_tiles_present();  // the bf16 tiles imply AVX-512: probs_and_grads_row
  const float* Q = t.Q;
  const float* dO = t.dO;
  int64_t q_ld = d;
  if constexpr (std::is_same_v<T, float>) {
    Q = head_row(in.q, b * s.q_len, i0, s.q_heads, h, d);
    dO = head_row(in.dout, b * s.q_len, i0, s.q_heads, h, d);
    q_ld = s.q_heads * d;
  }
  float* dq = in.dq32 + ((b * s.q_len + i0) * s.q_heads + h) * d;  // row r at r * q_heads * d
  if constexpr (kBf16) {
    const Bf16KeyTile kt(t, d);
    const int64_t ld = s.q_heads * d;
    const uint16_t* q = bf16_rows(in.q, b * s.q_len, i0, s.q_heads, h, d);
    const uint16_t* dout = bf16_rows(in.dout, b * s.q_len, i0, s.q_heads, h, d);
    bf16_tiles::dot(bq, bk, d / 2, q, ld, kt.Kt, t.P, bk, 1.f, false);
    bf16_tiles::dot(bq, bk, d / 2, dout, ld, kt.Vt, t.dP, bk, 1.f, false);
  } else {  // V is held as V^T (d x bk), and K^T in dQt's tile (dQ goes straight to dq32)
    if constexpr (!std::is_same_v<T, float>) {
      load_tile(in.q, b * s.q_len, i0, bq, s.q_heads, h, d, t.Q);
      load_tile(in.dout, b * s.q_len, i0, bq, s.q_heads, h, d, t.dO);
    }
    tile_dot(bq, bk, d, Q, q_ld, 1, t.dQt, bk, t.P, bk, 1.f, false);
    tile_dot(bq, bk, d, dO, q_ld, 1, t.V, bk, t.dP, bk, 1.f, false);
  }
  const float* lrow = in.lse + (b * s.q_heads + h) * s.q_len + i0;
  const float* drow = in.delta + (b * s.q_heads + h) * s.q_len + i0;
  for (int64_t r = 0; r < bq; ++r) {
    Seen seen = seen_keys(causal, window, i0 + r + off, j0, bk);
    if (lrow[r] == -INFINITY) seen.last = seen.first;  // a row that saw nothing
    if (wide_rows) {
      f32_tiles::probs_and_grads_row(t.P + r * bk, t.dP + r * bk, bk, seen.first, seen.last, a.scale, lrow[r], drow[r]);
      continue;
    }
    float* pr = t.P + r * bk;
    float* dpr = t.dP + r * bk;
    MapRow p(pr + seen.first, seen.last - seen.first), dp(dpr + seen.first, seen.last - seen.first);
    p = (p * a.scale - lrow[r]).exp();
    dp = p * (dp - drow[r]) * a.scale;  // dS, with the softmax scale folded in
    for (float* row : {pr, dpr}) {
      std::fill(row, row + seen.first, 0.f);
      std::fill(row + seen.last, row + bk, 0.f);
    }
  }
  if constexpr (kBf16) {
    const Bf16KeyTile kt(t, d);
    const int64_t ld = s.q_heads * d, bke = bk + (bk & 1), bqe = bq + (bq & 1);  // pairs: odd lengths padded
    auto* Qp = reinterpret_cast<uint32_t*>(t.Q);
    auto* dOp = reinterpret_cast<uint32_t*>(t.dO);
    bf16_tiles::pack_rows(bf16_rows(in.q, b * s.q_len, i0, s.q_heads, h, d), ld, bq, d, Qp);
    bf16_tiles::pack_rows(bf16_rows(in.dout, b * s.q_len, i0, s.q_heads, h, d), ld, bq, d, dOp);
    auto* P = reinterpret_cast<uint16_t*>(t.P);
    auto* dS = reinterpret_cast<uint16_t*>(t.dP);
    uint16_t* Pt = P + kBlockQ * kBlockK;  // the slot's second half
    uint16_t* dSt = dS + kBlockQ * kBlockK;
    bf16_tiles::round_rows(t.P, bk, bq, bk, P, bke);
    bf16_tiles::round_rows(t.dP, bk, bq, bk, dS, bke);
    bf16_tiles::transpose(P, bke, bq, bk, Pt, bqe);
    bf16_tiles::transpose(dS, bke, bq, bk, dSt, bqe);
    bf16_tiles::dot(bk, d, bqe / 2, Pt, bqe, dOp, t.dV, d, 1.f, true);
    bf16_tiles::dot(bk, d, bqe / 2, dSt, bqe, Qp, t.dK, d, 1.f, true);
    bf16_tiles::dot(bq, d, bke / 2, dS, bke, kt.Kp, t.dQt, d, 1.f, false);
  } else {  // P^T and dS^T read in place: element (j, r) at r * bk + j
    tile_dot(bk, d, bq, t.P, 1, bk, dO, q_ld, t.dV, d, 1.f, true);
    tile_dot(bk, d, bq, t.dP, 1, bk, Q, q_ld, t.dK, d, 1.f, true);
    tile_dot(bq, d, bk, t.dP, bk, 1, t.K, d, dq, s.q_heads * d, 1.f, true);
    return;
  }
  for (int64_t r = 0; r < bq; ++r)
    for (int64_t c = 0; c < d; ++c) dq[r * s.q_heads * d + c] += t.dQt[r * d + c];
}

// The backward over every (batch, kv head) and its key tiles, accumulating dQ in f32 into `in.dq32`.
template <typename T, bool kBf16>
void backward_tiles(const AttentionArgs& a, const BackwardInputs<T>& in, char* ws) {
  const AttentionDesc& s = a.desc;
  const int64_t d = s.head_dim, group = s.q_heads / s.kv_heads, off = s.kv_len - s.q_len;
  const bool causal = s.mask == Mask::Causal;
  const int64_t window = s.applied_window();
  const T* k = a.k.data<T>();
  const T* v = a.v.data<T>();
#pragma omp parallel for schedule(dynamic)
  for (int64_t unit = 0; unit < s.batch * s.kv_heads; ++unit) {
    const int64_t b = unit / s.kv_heads, kvh = unit % s.kv_heads;
    WorkspaceCarver wc(ws + std::size_t(omp_get_thread_num()) * bwd_slot_bytes(d));
    BackwardTiles t(wc, d);
    for (int64_t j0 = 0; j0 < s.kv_len; j0 += kBlockK) {
      const int64_t bk = std::min(kBlockK, s.kv_len - j0);
      if constexpr (kBf16) {
        const Bf16KeyTile kt(t, d);
        const uint16_t* krows = bf16_rows(k, b * s.kv_len, j0, s.kv_heads, kvh, d);
        bf16_tiles::pack_transposed(krows, s.kv_heads * d, bk, d, kt.Kt);
        bf16_tiles::pack_rows(krows, s.kv_heads * d, bk, d, kt.Kp);
        bf16_tiles::pack_transposed(bf16_rows(v, b * s.kv_len, j0, s.kv_heads, kvh, d), s.kv_heads * d, bk, d, kt.Vt);
      } else {
        load_tile(k, b * s.kv_len, j0, bk, s.kv_heads, kvh, d, t.K);
        load_tile_transposed(v, b * s.kv_len, j0, bk, s.kv_heads, kvh, d, t.V);  // V^T: d x bk
        tile_transpose(t.K, d, bk, d, t.dQt);                                    // K^T, once per key tile
      }
      std::fill(t.dK, t.dK + bk * d, 0.f);
      std::fill(t.dV, t.dV + bk * d, 0.f);
      // With the causal mask, query rows before j0 - off see none of these keys; with a window, neither do the
      // rows from j0 + bk - 1 + window - off on.
      const int64_t ifirst = causal ? std::max<int64_t>(0, j0 - off) / kBlockQ * kBlockQ : 0;
      const int64_t iend = window > 0 ? std::clamp<int64_t>(j0 + bk - 1 + window - off, 0, s.q_len) : s.q_len;
      for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h)
        for (int64_t i0 = ifirst; i0 < iend; i0 += kBlockQ) backward_tile<T, kBf16>(a, in, t, b, h, i0, j0, bk);
      store_tile(a.dk.data<T>(), b * s.kv_len, j0, bk, s.kv_heads, kvh, d, t.dK);
      store_tile(a.dv.data<T>(), b * s.kv_len, j0, bk, s.kv_heads, kvh, d, t.dV);
    }
  }
}

}  // namespace

void attention_backward(const AttentionArgs& a) {
  const AttentionDesc& s = a.desc;
  const int64_t d = s.head_dim;
  const int64_t slots = num_threads();
  char* ws = static_cast<char*>(a.workspace.data_ptr());
  WorkspaceCarver shared(ws + std::size_t(slots) * bwd_slot_bytes(d));
  float* delta = shared.floats(std::size_t(s.batch * s.q_heads * s.q_len));
  dispatch_float(s.dtype, "attention_backward", [&](auto tag) {
    using T = decltype(tag);
    const int64_t dq_n = s.batch * s.q_len * s.q_heads * d;
    float* dq32 =
        std::is_same_v<T, float> ? reinterpret_cast<float*>(a.dq.data_ptr()) : shared.floats(std::size_t(dq_n));
    row_deltas(s, a.dout.data<T>(), a.out.data<T>(), delta, dq32);
    const BackwardInputs<T> in{a.q.data<T>(), a.dout.data<T>(), a.lse.data<float>(), delta, dq32};
    if constexpr (std::is_same_v<T, bf16>) {
      if (bf16_tiles_for(s))
        backward_tiles<T, true>(a, in, ws);
      else
        backward_tiles<T, false>(a, in, ws);
    } else {
      backward_tiles<T, false>(a, in, ws);
    }
    if constexpr (!std::is_same_v<T, float>) {
      T* dq = a.dq.data<T>();
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < dq_n; ++i) store(dq, i, dq32[i]);
    }
  });
}

}  // namespace hr::cpu
