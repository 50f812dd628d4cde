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

// How one GEMM is cut: C tiles of mc x nc computed with the whole of k at once (every output element is
// summed over k in one register, so the order never depends on threads, and a bf16/f16 output is rounded
// once). Each thread packs the A block (mc x k) and B block (k x nc) of its tiles into its scratchpad slot.
struct PackedGemmBlocking {
  int64_t mc = 0, nc = 0;                  // tile rows and columns (multiples of the microkernel's 6 x 16)
  int64_t tiles = 0;                       // batch x row tiles x column tiles
  int threads = 1;                         // threads that get tiles
  std::size_t a_floats = 0, b_floats = 0;  // one thread's packed A and B blocks
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
