// headroom's blocked GEMM (for CPUs where oneDNN has no brgemm): pack, 6 x 16 microkernel, write back.
#include "core/backend/cpu/packed_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/backend/cpu/cpu_common.h"
#include "core/backend/cpu/transpose8.h"

namespace hr::cpu {

namespace {

constexpr int64_t kMR = 6, kNR = 16;                   // microkernel tile: 12 AVX2 accumulators
constexpr std::size_t kBBlockBytes = 2 * 1024 * 1024;  // one thread's packed B block
constexpr int64_t kMaxMc = 144, kMaxNc = 512;
constexpr int64_t kMaxKc = 256;  // k block: a 6 x 16 kernel's B panel (16 KiB) stays in L1, A's block in L2
constexpr std::size_t kSlotAlignment = 64;
constexpr std::size_t kSharedBBytes = 64 * 1024;  // the smallest B block the threads pack together

int64_t round_up(int64_t x, int64_t to) {
  return (x + to - 1) / to * to;
}
int64_t ceil_div(int64_t x, int64_t y) {
  return (x + y - 1) / y;
}
std::size_t aligned_bytes(std::size_t floats) {
  return (floats * sizeof(float) + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment;
}

// Largest multiple of `step` within budget / (4 k), at least `step`, at most `cap`.
int64_t fit(std::size_t budget, int64_t k, int64_t step, int64_t cap) {
  const int64_t n = int64_t(budget / (sizeof(float) * std::size_t(k))) / step * step;
  return std::clamp<int64_t>(n, step, cap);
}

// The tile size for `n` lanes in tiles of at most `most`: as many tiles as that needs, of equal size up to a
// multiple of `step` (at least `step`).
int64_t even_cut(int64_t n, int64_t most, int64_t step) {
  const int64_t tiles = ceil_div(std::max<int64_t>(n, 1), most);
  return std::min(most, round_up(ceil_div(std::max<int64_t>(n, 1), tiles), step));
}

// out (6 x 16, row-major) = init + A panel (k x 6) times B panel (k x 16), init zero where null. Every element is
// one multiply-add chain in k order, so a product cut into k blocks, each carried into the next through out/init,
// has the bits of the product done at once.
__attribute__((target("avx2,fma"))) void microkernel_avx2(int64_t k, const float* a, const float* b, const float* init,
                                                          float* out) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  if (init) {
    c00 = _mm256_loadu_ps(init + 0), c01 = _mm256_loadu_ps(init + 8);
    c10 = _mm256_loadu_ps(init + 16), c11 = _mm256_loadu_ps(init + 24);
    c20 = _mm256_loadu_ps(init + 32), c21 = _mm256_loadu_ps(init + 40);
    c30 = _mm256_loadu_ps(init + 48), c31 = _mm256_loadu_ps(init + 56);
    c40 = _mm256_loadu_ps(init + 64), c41 = _mm256_loadu_ps(init + 72);
    c50 = _mm256_loadu_ps(init + 80), c51 = _mm256_loadu_ps(init + 88);
  }
#pragma GCC unroll 4
  for (int64_t p = 0; p < k; ++p, a += kMR, b += kNR) {
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
    __m256 x = _mm256_broadcast_ss(a + 0);
    c00 = _mm256_fmadd_ps(x, b0, c00), c01 = _mm256_fmadd_ps(x, b1, c01);
    x = _mm256_broadcast_ss(a + 1);
    c10 = _mm256_fmadd_ps(x, b0, c10), c11 = _mm256_fmadd_ps(x, b1, c11);
    x = _mm256_broadcast_ss(a + 2);
    c20 = _mm256_fmadd_ps(x, b0, c20), c21 = _mm256_fmadd_ps(x, b1, c21);
    x = _mm256_broadcast_ss(a + 3);
    c30 = _mm256_fmadd_ps(x, b0, c30), c31 = _mm256_fmadd_ps(x, b1, c31);
    x = _mm256_broadcast_ss(a + 4);
    c40 = _mm256_fmadd_ps(x, b0, c40), c41 = _mm256_fmadd_ps(x, b1, c41);
    x = _mm256_broadcast_ss(a + 5);
    c50 = _mm256_fmadd_ps(x, b0, c50), c51 = _mm256_fmadd_ps(x, b1, c51);
  }
  const __m256 rows[kMR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
  for (int64_t r = 0; r < kMR; ++r) {
    _mm256_storeu_ps(out + r * kNR, rows[r][0]);
    _mm256_storeu_ps(out + r * kNR + 8, rows[r][1]);
  }
}

// The same product in portable C++ (any x86-64; and the twin the AVX2 kernel is tested against), with the same
// chains, so both give the same bits.
void microkernel_portable(int64_t k, const float* a, const float* b, const float* init, float* out) {
  float acc[kMR * kNR];
  for (int64_t i = 0; i < kMR * kNR; ++i) acc[i] = init ? init[i] : 0.f;
  for (int64_t p = 0; p < k; ++p, a += kMR, b += kNR)
    for (int64_t r = 0; r < kMR; ++r)
      for (int64_t j = 0; j < kNR; ++j) acc[r * kNR + j] = std::fma(a[r], b[j], acc[r * kNR + j]);
  std::copy(acc, acc + kMR * kNR, out);
}

using MicrokernelFn = void (*)(int64_t, const float*, const float*, const float*, float*);

MicrokernelFn choose(Microkernel m) {
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (m == Microkernel::Portable || (m == Microkernel::Auto && !avx2)) return microkernel_portable;
  HR_CHECK(avx2, "[gemm] the AVX2 microkernel needs a CPU with AVX2 and FMA");
  return microkernel_avx2;
}

#if defined(__AVX2__)  // the baseline build (x86-64-v3) has it; an x86-64 build packs with the scalar loops
// One whole W-lane panel of f32 lanes that are each contiguous in k (lane stride `lane`, k stride 1): eight k at a
// time, W lanes are read as vectors and turned by 8 x 8 transposes into eight panel rows; the k past the last whole
// eight one by one. Returns how many k it packed (a multiple of 8); the caller packs the rest.
template <int64_t W>
int64_t pack_transposed_f32(const float* src, int64_t lane, int64_t k, float* o) {
  static_assert(W == kMR || W == kNR);
  int64_t kk = 0;
  for (; kk + 8 <= k; kk += 8, o += 8 * W) {
    if constexpr (W == kNR) {
      for (int64_t h = 0; h < W; h += 8) {
        __m256 r[8];
        for (int64_t i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + (h + i) * lane + kk);
        transpose8(r);
        for (int64_t i = 0; i < 8; ++i) _mm256_storeu_ps(o + i * W + h, r[i]);
      }
    } else {  // six lanes: two rows of zeros, and each panel row written as four floats and two
      __m256 r[8];
      for (int64_t i = 0; i < W; ++i) r[i] = _mm256_loadu_ps(src + i * lane + kk);
      r[6] = r[7] = _mm256_setzero_ps();
      transpose8(r);
      for (int64_t i = 0; i < 8; ++i) {
        _mm_storeu_ps(o + i * W, _mm256_castps256_ps128(r[i]));
        _mm_storel_pi(reinterpret_cast<__m64*>(o + i * W + 4), _mm256_extractf128_ps(r[i], 1));
      }
    }
  }
  return kk;
}
#endif

// Packing walks k in chunks and fills every panel for one chunk before the next: where k is strided, chunks of
// kPackChunk, so that the lines a chunk reads stay in L1 while all panels take from them; where k is contiguous
// and the lanes are not, one chunk of the whole k, so that each panel's W lanes are read as W sequential streams
// the hardware prefetcher follows, not a few lines from every lane of the block in turn.
constexpr int64_t kPackChunk = 32;

// `n` lanes (rows of A, columns of B) from lane l0, k deep, as W-lane panels, each k x W, zero-padded to
// whole panels. `lane` and `depth` are the operand's strides along its lane index and along k. `Lanes1`: the
// lanes are contiguous (lane == 1), so each k's W values are one copy.
template <int64_t W, bool Lanes1, typename T>
void pack_chunks(const T* x, int64_t lane, int64_t depth, int64_t l0, int64_t n, int64_t k, int64_t chunk, float* out) {
  if constexpr (Lanes1) lane = 1;
  for (int64_t k0 = 0; k0 < k; k0 += chunk) {
    const int64_t k1 = std::min(k, k0 + chunk);
    for (int64_t p = 0; p < n; p += W) {
      float* o = out + (p * k + k0 * W);
      const T* src = x + (l0 + p) * lane;
      if (p + W <= n) {  // a whole panel: no edge test per element
        if constexpr (Lanes1 && std::is_same_v<T, float>) {
          for (int64_t kk = k0; kk < k1; ++kk, o += W) std::memcpy(o, src + kk * depth, W * sizeof(float));
        } else {
          int64_t kk = k0;
#if defined(__AVX2__)
          if constexpr (!Lanes1 && std::is_same_v<T, float>)
            if (depth == 1) {  // k contiguous: transposed eight k at a time
              const int64_t done = pack_transposed_f32<W>(src + k0, lane, k1 - k0, o);
              kk += done, o += done * W;
            }
#endif
          for (; kk < k1; ++kk, o += W)
            for (int64_t r = 0; r < W; ++r) o[r] = load(src, r * lane + kk * depth);
        }
      } else {
        for (int64_t kk = k0; kk < k1; ++kk, o += W)
          for (int64_t r = 0; r < W; ++r) o[r] = p + r < n ? load(src, r * lane + kk * depth) : 0.f;
      }
    }
  }
}

template <int64_t W, typename T>
void pack_panels(const T* x, int64_t lane, int64_t depth, int64_t l0, int64_t n, int64_t k, float* out) {
  if (lane == 1)
    pack_chunks<W, true>(x, lane, depth, l0, n, k, kPackChunk, out);
  else
    pack_chunks<W, false>(x, lane, depth, l0, n, k, depth == 1 ? std::max<int64_t>(k, 1) : kPackChunk, out);
}

// C tile (rows x cols of the 6 x 16 accumulator) = alpha acc + beta C.
template <typename T>
void write_tile(T* c, int64_t ldc, const float* acc, int64_t rows, int64_t cols, float alpha, float beta) {
#if defined(__AVX2__)
  if constexpr (std::is_same_v<T, float>)
    if (rows == kMR && cols == kNR && alpha == 1.f && (beta == 0.f || beta == 1.f)) {  // C = acc or C + acc, whole
      for (int64_t r = 0; r < kMR; ++r)
        for (int64_t j = 0; j < kNR; j += 8) {
          __m256 v = _mm256_loadu_ps(acc + r * kNR + j);
          if (beta != 0.f) v = _mm256_add_ps(v, _mm256_loadu_ps(c + r * ldc + j));
          _mm256_storeu_ps(c + r * ldc + j, v);
        }
      return;
    }
#endif
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      float v = alpha * acc[r * kNR + j];
      if (beta != 0.f) v += beta * load(c, r * ldc + j);
      store(c, r * ldc + j, v);
    }
}

template <typename TA, typename TB, typename TC>
void run(const GemmArgs& g, const PackedGemmBlocking& bl, MicrokernelFn kernel) {
  const GemmDesc& d = g.desc;
  const TA* a = g.a.data<TA>();
  const TB* b = g.b.data<TB>();
  TC* c = g.c.data<TC>();
  char* scratch = g.scratchpad.defined() ? static_cast<char*>(g.scratchpad.data_ptr()) : nullptr;
  // The scratchpad: the shared B block where there is one, then each thread's slot (A block, its own B block
  // where B is not shared, partial sums).
  const std::size_t a_slot = aligned_bytes(bl.a_floats), b_slot = aligned_bytes(bl.b_floats);
  const std::size_t shared = bl.shared_b ? b_slot : 0, own_b = bl.shared_b ? 0 : b_slot;
  const std::size_t slot = a_slot + own_b + aligned_bytes(bl.p_floats);
  const int64_t row_tiles = ceil_div(d.m, bl.mc), col_tiles = ceil_div(d.n, bl.nc);
  const int64_t k_blocks = std::max<int64_t>(1, ceil_div(d.k, bl.kc));
  TileQueues queues(bl.tiles, bl.threads);
#pragma omp parallel num_threads(bl.threads)
  {
    const int t = omp_get_thread_num();
    char* mine = scratch + shared + std::size_t(t) * slot;
    float* ap = reinterpret_cast<float*>(mine);
    float* bp = reinterpret_cast<float*>(bl.shared_b ? scratch : mine + a_slot);
    float* partials = reinterpret_cast<float*>(mine + a_slot + own_b);
    alignas(64) float acc[kMR * kNR];
    int64_t packed_b = -1;  // which (batch, column tile) bp holds
    // B's lanes [l0, l0 + lanes) of every k block into bp, a block `width` lanes wide, from its lane `at`.
    const auto pack_b = [&](const TB* bt, int64_t l0, int64_t lanes, int64_t width, int64_t at) {
      for (int64_t kb = 0; kb < k_blocks; ++kb) {
        const int64_t k0 = kb * bl.kc, kc = std::min(bl.kc, d.k - k0);
        pack_panels<kNR>(bt + k0 * d.b_strides[1], d.b_strides[2], d.b_strides[1], l0, lanes, kc,
                         bp + k0 * width + at * kc);
      }
    };
    if (bl.shared_b) {  // the one B block (all columns): this thread's share of its panels
      const int64_t panels = ceil_div(d.n, kNR);
      // shares over the team OpenMP gave, which can be smaller than bl.threads (a GEMM inside another parallel
      // region runs on one thread): every panel is packed by someone
      const int team = omp_get_num_threads();
      const int64_t l0 = panels * t / team * kNR, lanes = std::min(d.n, panels * (t + 1) / team * kNR) - l0;
      if (lanes > 0) pack_b(b, l0, lanes, panels * kNR, l0);
      packed_b = 0;
#pragma omp barrier
    }
    for (int64_t tile = queues.next(t); tile >= 0; tile = queues.next(t)) {
      const int64_t batch = tile / (row_tiles * col_tiles), jt = tile / row_tiles % col_tiles, it = tile % row_tiles;
      const int64_t i0 = it * bl.mc, j0 = jt * bl.nc;
      const int64_t rows = std::min(bl.mc, d.m - i0), cols = std::min(bl.nc, d.n - j0);
      const int64_t cols_padded = round_up(cols, kNR);
      const int64_t b_key = (d.b_strides[0] ? batch : 0) * col_tiles + jt;
      const TB* bt = b + batch * d.b_strides[0];
      const TA* at = a + batch * d.a_strides[0];
      HR_ASSERT(!bl.shared_b || b_key == packed_b, "packed gemm: a tile outside the shared B block");
      if (b_key != packed_b) {  // B's columns of the tile, every k block, each its own panels
        pack_b(bt, j0, cols, cols_padded, 0);
        packed_b = b_key;
      }
      TC* ct = c + batch * d.m * d.n + i0 * d.n + j0;
      for (int64_t kb = 0; kb < k_blocks; ++kb) {
        const int64_t k0 = kb * bl.kc, kc = std::min(bl.kc, d.k - k0);
        pack_panels<kMR>(at + k0 * d.a_strides[2], d.a_strides[1], d.a_strides[2], i0, rows, kc, ap);
        const float* bk = bp + k0 * cols_padded;
        const bool first = kb == 0, last = kb == k_blocks - 1;
        const int64_t row_panels = ceil_div(rows, kMR);
        for (int64_t jr = 0; jr < cols; jr += kNR)
          for (int64_t ir = 0; ir < rows; ir += kMR) {
            // this 6 x 16 tile's sums over the k blocks so far (a slot only where k has several blocks)
            float* part = k_blocks > 1 ? partials + (jr / kNR * row_panels + ir / kMR) * kMR * kNR : nullptr;
            kernel(kc, ap + ir * kc, bk + jr * kc, first ? nullptr : part, last ? acc : part);
            if (last)
              write_tile(ct + ir * d.n + jr, d.n, acc, std::min(kMR, rows - ir), std::min(kNR, cols - jr), d.alpha,
                         d.beta);
          }
      }
    }
  }
}

}  // namespace

TileQueues::TileQueues(int64_t tiles, int threads) : threads_(threads) {
  HR_ASSERT(threads >= 1 && threads <= kMaxGemmThreads && tiles >= 0 && tiles < (int64_t(1) << 32),
            "tile queues: ", tiles, " tiles over ", threads, " threads");
  for (int t = 0; t < threads; ++t)
    ranges_[t].v.store(uint64_t(tiles * t / threads) << 32 | uint64_t(tiles * (t + 1) / threads),
                       std::memory_order_relaxed);
}

int64_t TileQueues::next(int thread) {
  if (int64_t tile = take(ranges_[thread], true); tile >= 0) return tile;
  for (;;) {  // its own range is done: the back of whichever range has the most left
    int victim = -1;
    uint64_t most = 0;
    for (int t = 0; t < threads_; ++t) {
      const uint64_t v = ranges_[t].v.load(std::memory_order_relaxed),
                     left = (v & 0xffffffffu) - std::min(v >> 32, v & 0xffffffffu);
      if (left > most) most = left, victim = t;
    }
    if (victim < 0) return -1;
    if (int64_t tile = take(ranges_[victim], false); tile >= 0) return tile;
  }
}

int64_t TileQueues::take(Range& r, bool front) {
  uint64_t v = r.v.load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t f = v >> 32, b = v & 0xffffffffu;
    if (f >= b) return -1;
    const uint64_t taken = front ? v + (uint64_t(1) << 32) : v - 1;
    if (r.v.compare_exchange_weak(v, taken, std::memory_order_relaxed)) return int64_t(front ? f : b - 1);
  }
}

std::size_t PackedGemmBlocking::scratchpad_bytes() const {
  return std::size_t(shared_b ? 1 : threads) * aligned_bytes(b_floats) +
         std::size_t(threads) * (aligned_bytes(a_floats) + aligned_bytes(p_floats));
}

namespace {

// The most work (elements of C) any thread's first range of tiles holds, with tiles of mc x nc.
int64_t heaviest_range(const GemmDesc& d, int64_t mc, int64_t nc, int threads) {
  const int64_t row_tiles = ceil_div(d.m, mc), col_tiles = ceil_div(d.n, nc), tiles = d.batch * row_tiles * col_tiles;
  int64_t most = 0;
  for (int t = 0; t < threads; ++t) {
    int64_t work = 0;
    for (int64_t tile = tiles * t / threads; tile < tiles * (t + 1) / threads; ++tile)
      work += std::min(mc, d.m - tile % row_tiles * mc) * std::min(nc, d.n - tile / row_tiles % col_tiles * nc);
    most = std::max(most, work);
  }
  return most;
}

}  // namespace

PackedGemmBlocking packed_gemm_blocking(const GemmDesc& d, int threads) {
  PackedGemmBlocking bl;
  // No C (no batch, rows or columns): no tiles, no scratch, nothing for any thread to do.
  if (d.batch <= 0 || d.m <= 0 || d.n <= 0) return bl;
  const int64_t k = std::max<int64_t>(d.k, 1);
  // As few tiles as the blocks allow, cut evenly: 384 columns in blocks of at most 256 are two tiles of
  // 192, not 256 and 128 (whose threads would otherwise wait on the wider one's).
  bl.nc = even_cut(d.n, fit(kBBlockBytes, k, kNR, kMaxNc), kNR);
  bl.mc = even_cut(d.m, kMaxMc, kMR);
  bl.kc = even_cut(k, kMaxKc, 1);
  const int64_t col_tiles = ceil_div(d.n, bl.nc);
  // Too few tiles for the threads: cut the rows finer (down to one microkernel panel).
  const int64_t wanted_row_tiles = ceil_div(threads, d.batch * col_tiles);
  if (ceil_div(d.m, bl.mc) < wanted_row_tiles) bl.mc = std::max(kMR, round_up(ceil_div(d.m, wanted_row_tiles), kMR));
  // Few tiles that the threads' ranges would split unevenly (five over two threads: three against two, the
  // stealing cannot help, the tiles are taken whole): up to threads - 1 more row tiles, where that lightens the
  // heaviest range.
  const int team = std::min(threads, kMaxGemmThreads);  // the most TileQueues splits tiles over
  if (team > 1 && d.m > 0 && d.batch * ceil_div(d.m, bl.mc) * col_tiles < 64 * int64_t(team)) {
    int64_t most = heaviest_range(d, bl.mc, bl.nc, team);
    const int64_t row_tiles = ceil_div(d.m, bl.mc);
    for (int64_t more = 1; more < team && row_tiles + more <= ceil_div(d.m, kMR); ++more) {
      const int64_t mc = round_up(ceil_div(d.m, row_tiles + more), kMR), work = heaviest_range(d, mc, bl.nc, team);
      if (work < most) most = work, bl.mc = mc;
    }
  }
  bl.tiles = d.batch * ceil_div(d.m, bl.mc) * col_tiles;
  bl.threads = int(std::clamp<int64_t>(std::min<int64_t>(threads, bl.tiles), 1, kMaxGemmThreads));
  HR_CHECK(bl.tiles < (int64_t(1) << 32), "[gemm] ", d.batch, " x ", d.m, " x ", d.n, " cuts into ", bl.tiles,
           " tiles: more than the tile queues count");
  bl.a_floats = std::size_t(bl.mc * bl.kc);
  bl.b_floats = std::size_t(d.k * bl.nc);
  bl.p_floats = d.k > bl.kc ? std::size_t(bl.mc * bl.nc) : 0;
  // Shared only where the block is large: a small one (under 64 KiB) is packed in microseconds, about what
  // the threads' meeting after the shared packing costs.
  bl.shared_b = bl.threads > 1 && col_tiles == 1 && (d.batch == 1 || d.b_strides[0] == 0) &&
                bl.b_floats * sizeof(float) >= kSharedBBytes;
  return bl;
}

void packed_gemm(const GemmArgs& g, const PackedGemmBlocking& bl, Microkernel m) {
  if (bl.tiles == 0) return;  // no C
  const GemmDesc& d = g.desc;
  HR_ASSERT(!bl.scratchpad_bytes() || g.scratchpad.nbytes() >= bl.scratchpad_bytes(),
            "packed gemm scratchpad too small");
  const MicrokernelFn kernel = choose(m);
  dispatch_float(d.a_dtype, "gemm", [&](auto ta) {
    dispatch_float(d.b_dtype, "gemm", [&](auto tb) {
      dispatch_float(d.c_dtype, "gemm", [&](auto tc) { run<decltype(ta), decltype(tb), decltype(tc)>(g, bl, kernel); });
    });
  });
}

}  // namespace hr::cpu
