// headroom's own blocked GEMM for CPUs where oneDNN has no brgemm kernel (AVX2 and below). oneDNN 2.6's
// other fast path there (gemm:jit) packs its operands into buffers it mallocs on every call, out of the
// caching allocator's sight; this one packs into the scratchpad the op hands it, sized by the same blocking
// the kernel runs with.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/ops/params.h"

namespace hr::cpu {

using core::GemmArgs;
using core::GemmDesc;

enum class Microkernel : uint8_t { Auto, Avx2Fma, Portable };

// How one GEMM is cut: C tiles of mc x nc, each computed by one thread over k blocks of kc, in order (every
// output element is one multiply-add chain over k, carried from block to block in f32, so the order never
// depends on threads or blocks, and a bf16/f16 output is rounded once). Each thread packs into its scratchpad
// slot the B block (k x nc, kept while its tiles share those columns) and, per k block, the A block (mc x kc);
// the kernel's B panel (kc x 16) then stays in L1 and the A block in L2 however deep k is. Where every tile
// shares one B block (one column tile, B not batched) of 64 KiB or more, the threads pack it together, each a
// share of its panels, into one block they all read (`shared_b`): otherwise each would pack the whole of it (a
// weight gradient's activations, k = tokens deep) for itself.
struct PackedGemmBlocking {
  int64_t mc = 0, nc = 0;                  // tile rows and columns (multiples of the microkernel's 6 x 16)
  int64_t kc = 0;                          // k block depth
  int64_t tiles = 0;                       // batch x row tiles x column tiles
  int threads = 1;                         // threads that get tiles
  std::size_t a_floats = 0, b_floats = 0;  // one thread's packed A block (mc x kc) and B block (k x nc)
  std::size_t p_floats = 0;                // its partial sums of a tile (mc x nc) where k has several blocks
  bool shared_b = false;                   // one B block for all threads, packed by all of them
  std::size_t scratchpad_bytes() const;
};

PackedGemmBlocking packed_gemm_blocking(const GemmDesc& d, int threads);

constexpr int kMaxGemmThreads = 64;  // threads one GEMM spreads over (each needs its own scratchpad slot)

// Which thread computes which tile. Tiles start in one contiguous range per thread, in order (a thread's
// tiles share column blocks, so it packs each B block once); a thread that has finished its own takes tiles
// one at a time from the back of whichever range has the most left. Tiles differ in size at the edges and
// threads in speed, so a static split alone left one thread waiting on the other. Every tile is computed
// whole by one thread, so the bits never depend on who takes it.
class TileQueues {
 public:
  TileQueues(int64_t tiles, int threads);
  int64_t next(int thread);  // the next tile for `thread`; -1 when none is left

 private:
  struct alignas(64) Range {
    std::atomic<uint64_t> v{0};  // front << 32 | back: the tiles [front, back) not taken yet
  };
  static int64_t take(Range& r, bool front);
  Range ranges_[kMaxGemmThreads];
  int threads_;
};

// C = alpha A B + beta C with `blocking` (from packed_gemm_blocking for the same desc); the scratchpad must
// hold blocking.scratchpad_bytes().
void packed_gemm(const GemmArgs& g, const PackedGemmBlocking& blocking, Microkernel kernel = Microkernel::Auto);

}  // namespace hr::cpu
