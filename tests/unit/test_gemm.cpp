// GEMM paths: f32 linear shapes never stage converted operands; which kernel runs follows the CPU (oneDNN's
// brgemm, or headroom's packed GEMM where oneDNN has none) and each takes exactly the scratch its own query
// or blocking names; the packed GEMM agrees with a reference on every edge; broadcast batches and
// transposed views give the same numbers as contiguous copies.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <cmath>
#include <oneapi/dnnl/dnnl.hpp>
#include <thread>

#include "core/backend/cpu/cpu_kernels.h"
#include "core/backend/cpu/packed_gemm.h"
#include "core/backend/kernels.h"
#include "core/memory/device_memory.h"
#include "core/ops/linear.h"

using namespace hr::core;

TEST(Gemm, F32LinearShapesNeedNoConversionWorkspace) {
  // A workspace here would mean oneDNN fell back to its reference kernel and we convert operands instead.
  Tensor x = Tensor::zeros({1, 300, 64}, DType::F32, Device::cpu()),
         w = Tensor::zeros({1, 32, 64}, DType::F32, Device::cpu());
  Tensor wt = w.transpose(1, 2);
  GemmDesc d;
  d.m = 300, d.n = 32, d.k = 64;
  for (int i = 0; i < 3; ++i) d.a_strides[i] = x.strides()[i], d.b_strides[i] = wt.strides()[i];
  d.a_strides[0] = d.b_strides[0] = 0;
  EXPECT_EQ(cpu_kernels().gemm_workspace_bytes(d), 0u);
}

TEST(Gemm, BroadcastBatchAndTransposedViews) {
  std::vector<float> av(2 * 3 * 4), bv(4 * 5);
  for (std::size_t i = 0; i < av.size(); ++i) av[i] = float(i % 7) - 3.f;
  for (std::size_t i = 0; i < bv.size(); ++i) bv[i] = float(i % 5) * 0.5f;
  Tensor a = Tensor::from_floats(av, {2, 3, 4}, DType::F32, Device::cpu());
  Tensor b = Tensor::from_floats(bv, {1, 4, 5}, DType::F32, Device::cpu());
  Tensor c = Tensor::empty({2, 3, 5}, DType::F32, Device::cpu());
  gemm(a, b, c);                                               // b broadcast over the batch
  Tensor bt = b.transpose(1, 2).contiguous().transpose(1, 2);  // same values, transposed storage
  Tensor c2 = Tensor::empty({2, 3, 5}, DType::F32, Device::cpu());
  gemm(a, bt, c2);
  std::vector<float> r1 = c.to_floats(), r2 = c2.to_floats();
  for (int bi = 0; bi < 2; ++bi)
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 5; ++j) {
        float want = 0;
        for (int k = 0; k < 4; ++k) want += av[(bi * 3 + i) * 4 + k] * bv[k * 5 + j];
        EXPECT_FLOAT_EQ(r1[(bi * 3 + i) * 5 + j], want);
        EXPECT_FLOAT_EQ(r2[(bi * 3 + i) * 5 + j], want);
      }
}

namespace {

GemmDesc linear_desc(DType dt) {  // x (300, 64) @ w^T with w (32, 64), as linear_forward builds it
  GemmDesc d;
  d.m = 300, d.n = 32, d.k = 64;
  d.a_dtype = d.b_dtype = d.c_dtype = dt;
  d.a_strides[1] = 64, d.a_strides[2] = 1;
  d.b_strides[1] = 1, d.b_strides[2] = 64;
  return d;
}

// oneDNN's own scratchpad query for the brgemm primitive of `d`, made here independently of the backend.
std::size_t onednn_scratchpad(const GemmDesc& d) {
  using dnnl::memory;
  dnnl::engine e(dnnl::engine::kind::cpu, 0);
  memory::desc a({1, d.m, d.k}, memory::data_type::f32, memory::dims{d.m * d.k, d.a_strides[1], d.a_strides[2]});
  memory::desc b({1, d.k, d.n}, memory::data_type::f32, memory::dims{d.k * d.n, d.b_strides[1], d.b_strides[2]});
  memory::desc c({1, d.m, d.n}, memory::data_type::f32, memory::dims{d.m * d.n, d.n, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, e).scratchpad_desc().get_size();
}

struct ThreadCount {  // sets the OpenMP threads for a scope
  int saved = omp_get_max_threads();
  explicit ThreadCount(int n) { omp_set_num_threads(n); }
  ~ThreadCount() { omp_set_num_threads(saved); }
};

}  // namespace

TEST(Gemm, EachCpuTakesItsPathAndEachPathItsOwnScratch) {
  const bool brgemm = dnnl::get_effective_cpu_isa() >= dnnl::cpu_isa::avx512_core;
  const bool native_bf16 = dnnl::get_effective_cpu_isa() >= dnnl::cpu_isa::avx512_core_bf16;
  for (int threads : {1, 2}) {
    ThreadCount t(threads);
    const GemmDesc f = linear_desc(DType::F32), h = linear_desc(DType::BF16);
    EXPECT_EQ(cpu_kernels().gemm_workspace_bytes(f), 0u);
    if (brgemm) {
      EXPECT_STREQ(hr::cpu::gemm_path(f), "brgemm");
      // The scratchpad is oneDNN's own answer for this primitive at this thread count.
      EXPECT_EQ(cpu_kernels().gemm_scratchpad_bytes(f), onednn_scratchpad(f)) << threads << " threads";
      if (native_bf16) {
        EXPECT_STREQ(hr::cpu::gemm_path(h), "brgemm");
      } else {
        EXPECT_STREQ(hr::cpu::gemm_path(h), "f32 copies + brgemm");
        // f32 copies of x, w and the output, each 64-byte aligned.
        EXPECT_EQ(cpu_kernels().gemm_workspace_bytes(h), std::size_t(300 * 64 + 64 * 32 + 300 * 32) * 4);
      }
    } else {
      for (const GemmDesc& d : {f, h}) {
        EXPECT_STREQ(hr::cpu::gemm_path(d), "packed");
        EXPECT_EQ(cpu_kernels().gemm_workspace_bytes(d), 0u);
        EXPECT_EQ(cpu_kernels().gemm_scratchpad_bytes(d), hr::cpu::packed_gemm_blocking(d, threads).scratchpad_bytes());
      }
    }
  }
}

namespace {

// C = alpha A B + beta C0 in double, for a desc over the given host data.
std::vector<double> reference(const GemmDesc& d, const std::vector<float>& a, const std::vector<float>& b,
                              const std::vector<float>& c0) {
  std::vector<double> c(std::size_t(d.batch * d.m * d.n));
  for (int64_t bi = 0; bi < d.batch; ++bi)
    for (int64_t i = 0; i < d.m; ++i)
      for (int64_t j = 0; j < d.n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < d.k; ++p)
          s += double(a[std::size_t(bi * d.a_strides[0] + i * d.a_strides[1] + p * d.a_strides[2])]) *
               b[std::size_t(bi * d.b_strides[0] + p * d.b_strides[1] + j * d.b_strides[2])];
        const std::size_t o = std::size_t((bi * d.m + i) * d.n + j);
        c[o] = d.alpha * s + (d.beta != 0.f ? d.beta * double(c0[o]) : 0.0);
      }
  return c;
}

struct PackedCase {
  int64_t batch, m, n, k;
  bool a_transposed, b_transposed, a_broadcast, b_broadcast;
  float alpha, beta;
  DType c_dtype;
  DType ab_dtype = DType::F32;  // both operands' (their values are exact in bf16 and f16)
};

// The case's descriptor and operands (small integers over powers of two: exact in every dtype).
struct PackedInputs {
  GemmDesc desc;
  std::vector<float> a, b, c;
};
PackedInputs inputs_of(const PackedCase& pc) {
  PackedInputs in;
  GemmDesc& d = in.desc;
  d.batch = pc.batch, d.m = pc.m, d.n = pc.n, d.k = pc.k, d.alpha = pc.alpha, d.beta = pc.beta, d.c_dtype = pc.c_dtype;
  d.a_dtype = d.b_dtype = pc.ab_dtype;
  d.a_strides[0] = pc.a_broadcast ? 0 : pc.m * pc.k;
  d.a_strides[1] = pc.a_transposed ? 1 : pc.k, d.a_strides[2] = pc.a_transposed ? pc.m : 1;
  d.b_strides[0] = pc.b_broadcast ? 0 : pc.k * pc.n;
  d.b_strides[1] = pc.b_transposed ? 1 : pc.n, d.b_strides[2] = pc.b_transposed ? pc.k : 1;
  const int64_t ab = pc.a_broadcast ? 1 : pc.batch, bb = pc.b_broadcast ? 1 : pc.batch;
  in.a.resize(std::size_t(std::max<int64_t>(ab * pc.m * pc.k, 1)));
  in.b.resize(std::size_t(std::max<int64_t>(bb * pc.k * pc.n, 1)));
  in.c.resize(std::size_t(pc.batch * pc.m * pc.n));
  for (std::size_t i = 0; i < in.a.size(); ++i) in.a[i] = float(int(i * 7 % 13) - 6) / 8.f;
  for (std::size_t i = 0; i < in.b.size(); ++i) in.b[i] = float(int(i * 5 % 11) - 5) / 4.f;
  for (std::size_t i = 0; i < in.c.size(); ++i) in.c[i] = float(int(i % 9) - 4);
  return in;
}

// The case's operands, C and a scratchpad for `bl` as the packed GEMM takes them.
GemmArgs args_of(const PackedCase& pc, const PackedInputs& in, const hr::cpu::PackedGemmBlocking& bl) {
  GemmArgs g;
  g.desc = in.desc;
  g.a = Tensor::from_floats(in.a, {int64_t(in.a.size())}, pc.ab_dtype, Device::cpu());
  g.b = Tensor::from_floats(in.b, {int64_t(in.b.size())}, pc.ab_dtype, Device::cpu());
  g.c = Tensor::from_floats(in.c, {pc.batch, pc.m, pc.n}, pc.c_dtype, Device::cpu());
  if (bl.scratchpad_bytes()) g.scratchpad = Tensor::empty({int64_t(bl.scratchpad_bytes())}, DType::U8, Device::cpu());
  return g;
}

// The packed GEMM of the case at `threads` threads with `kernel`: C as it comes out.
std::vector<float> packed_run(const PackedCase& pc, const PackedInputs& in, int threads, hr::cpu::Microkernel kernel) {
  const hr::cpu::PackedGemmBlocking bl = hr::cpu::packed_gemm_blocking(in.desc, threads);
  GemmArgs g = args_of(pc, in, bl);
  ThreadCount t(threads);
  hr::cpu::packed_gemm(g, bl, kernel);
  return g.c.to_floats();
}

}  // namespace

TEST(Gemm, PackedGemmMatchesAReferenceOnEveryEdgeWithTheSameBitsOnAnyThreadsAndKernel) {
  const std::vector<PackedCase> cases = {
      {1, 300, 32, 64, false, true, false, true, 1.f, 0.f, DType::F32},   // linear forward
      {1, 13, 37, 19, false, false, false, false, 1.f, 0.f, DType::F32},  // edges everywhere
      {3, 7, 40, 5, true, false, false, true, 0.5f, 1.f, DType::F32},     // transposed A, broadcast B, beta
      {2, 150, 17, 300, false, true, true, false, 1.f, 1.f, DType::F32},  // long k, broadcast A
      {1, 9, 9, 0, false, false, false, false, 1.f, 0.5f, DType::F32},    // k = 0: C = beta C
      {1, 33, 50, 70, false, true, false, false, 1.f, 0.f, DType::BF16},  // bf16 output, rounded once
      {2, 8, 24, 16, true, true, false, false, 2.f, 0.f, DType::F16},
      // Rows of A contiguous along k (as in x W^T and dy W), a ragged k; f32, bf16 and f16 operands, all
      // packed into f32 panels.
      {1, 40, 20, 45, false, false, false, false, 1.f, 0.f, DType::F32},
      {2, 19, 33, 70, false, true, false, false, 1.f, 1.f, DType::BF16, DType::BF16},
      {1, 12, 16, 8, false, false, false, false, 1.f, 0.f, DType::F32, DType::F16},
      // Three k blocks over three column tiles, the last ragged (352, 352, 326), a broadcast B, bf16 operands and
      // an f16 output with alpha and beta: at 3 threads a thread steals a tile of another column tile.
      {2, 20, 1030, 520, false, true, false, true, 0.5f, 1.f, DType::F16, DType::BF16},
  };
  for (const PackedCase& pc : cases) {
    const PackedInputs in = inputs_of(pc);
    const std::vector<double> want = reference(in.desc, in.a, in.b, in.c);
    // f32 outputs agree to f32 rounding of the sum; bf16/f16 outputs are the f32 result rounded once.
    const double tol = pc.c_dtype == DType::F32 ? 1e-5 : pc.c_dtype == DType::BF16 ? 8e-3 : 1e-3;
    std::vector<float> first;
    for (int threads : {1, 2, 3})
      for (auto kernel : {hr::cpu::Microkernel::Auto, hr::cpu::Microkernel::Portable}) {
        const std::vector<float> got = packed_run(pc, in, threads, kernel);
        for (std::size_t i = 0; i < got.size(); ++i)
          ASSERT_NEAR(got[i], want[i], tol * std::max(1.0, std::abs(want[i])))
              << pc.m << "x" << pc.n << "x" << pc.k << " element " << i << ", " << threads << " threads";
        if (first.empty()) first = got;
        EXPECT_EQ(got, first) << pc.m << "x" << pc.n << "x" << pc.k << ": bits differ at " << threads << " threads";
      }
  }
}

// k deeper than one block is summed block by block, each block's partial sums carried into the next in f32:
// every element is still the one multiply-add chain over k in order, so the bits are those of that chain (for
// A and B with k contiguous, as x and W^T in x W^T, and with their lanes contiguous, as dy^T and x in dy^T x;
// both kernels), and a
// bf16 output is that chain rounded once.
TEST(Gemm, PackedKBlocksCarryOneChainWithItsBits) {
  for (const bool a_transposed : {false, true})
    for (const DType c_dtype : {DType::F32, DType::BF16}) {
      const bool b_transposed = !a_transposed;  // x W^T's B and dy^T x's
      PackedCase pc{1, 50, 40, 700, a_transposed, b_transposed, false, false, 1.f, 0.f, c_dtype};
      PackedInputs in = inputs_of(pc);
      uint32_t state = 12345;  // values that are not exact in any short sum
      auto next = [&] { return float((state = state * 1664525u + 1013904223u) >> 8) / float(1 << 24) - 0.5f; };
      for (float& v : in.a) v = next();
      for (float& v : in.b) v = next();
      const hr::cpu::PackedGemmBlocking bl = hr::cpu::packed_gemm_blocking(in.desc, 2);
      ASSERT_LT(bl.kc, pc.k);  // several k blocks
      ASSERT_GT(bl.p_floats, 0u);
      Tensor chain = Tensor::empty({1, pc.m, pc.n}, DType::F32, Device::cpu());
      float* w = chain.data<float>();
      for (int64_t i = 0; i < pc.m; ++i)
        for (int64_t j = 0; j < pc.n; ++j) {
          float acc = 0.f;
          for (int64_t p = 0; p < pc.k; ++p) {
            const float av = in.a[std::size_t(a_transposed ? p * pc.m + i : i * pc.k + p)];
            acc = std::fma(av, in.b[std::size_t(b_transposed ? j * pc.k + p : p * pc.n + j)], acc);
          }
          w[i * pc.n + j] = acc;
        }
      const std::vector<float> want = chain.to(c_dtype).to_floats();
      for (int threads : {1, 2})
        for (auto kernel : {hr::cpu::Microkernel::Auto, hr::cpu::Microkernel::Portable})
          EXPECT_EQ(packed_run(pc, in, threads, kernel), want)
              << (a_transposed ? "A^T" : "A") << ", " << dtype_name(c_dtype) << ", " << threads << " threads";
    }
}

// The blocks a GEMM's shape gets: k blocks of at most 256 cut evenly, a tile's partial sums only where k has
// several, and the packed A block one k block deep whatever k is.
TEST(Gemm, PackedKBlocksAreCutEvenlyAndSizeTheScratchpad) {
  for (int64_t k : {1, 64, 256, 257, 384, 700, 1024, 2048, 4099}) {
    GemmDesc d = linear_desc(DType::F32);
    d.m = 2048, d.n = 1024, d.k = k;
    const hr::cpu::PackedGemmBlocking bl = hr::cpu::packed_gemm_blocking(d, 2);
    const int64_t blocks = (k + 255) / 256;
    EXPECT_EQ((k + bl.kc - 1) / bl.kc, blocks) << "k " << k;
    EXPECT_LE(bl.kc, 256) << "k " << k;
    EXPECT_LT(blocks * bl.kc - k, blocks) << "k " << k << ": blocks of " << bl.kc;
    EXPECT_EQ(bl.a_floats, std::size_t(bl.mc * bl.kc)) << "k " << k;
    EXPECT_EQ(bl.p_floats, blocks > 1 ? std::size_t(bl.mc * bl.nc) : 0u) << "k " << k;
    EXPECT_EQ(bl.b_floats, std::size_t(k * bl.nc)) << "k " << k;
    const std::size_t floats = bl.a_floats + bl.b_floats + bl.p_floats;  // per thread, each part 64-byte aligned
    EXPECT_GE(bl.scratchpad_bytes(), 2 * 4 * floats) << "k " << k;
    EXPECT_LT(bl.scratchpad_bytes(), 2 * (4 * floats + 3 * 64)) << "k " << k;
  }
}

// A tile's width follows from how many tiles the column count needs, not from the largest block: 384
// columns that need two tiles are two of 192, not 256 and 128 (whose second thread would wait half the GEMM).
TEST(Gemm, PackedTilesAreCutEvenly) {
  for (int64_t n = 16; n <= 2048; n += 16) {
    GemmDesc d = linear_desc(DType::F32);
    d.m = 1024, d.n = n, d.k = 2048;  // k = 2048: B blocks of at most 256 columns (2 MiB of f32)
    const hr::cpu::PackedGemmBlocking bl = hr::cpu::packed_gemm_blocking(d, 2);
    const int64_t tiles = (n + 255) / 256, last = n - (tiles - 1) * bl.nc;
    EXPECT_EQ((n + bl.nc - 1) / bl.nc, tiles) << n << " columns";
    EXPECT_GT(last, 0) << n << " columns";
    EXPECT_LE(bl.nc - last, 16 * tiles) << n << " columns: tiles of " << bl.nc << " and a last of " << last;
  }
}

// Where every tile shares one B block (one column tile, B not batched) of 64 KiB or more, the threads pack it
// together into one block; otherwise each packs its own. The scratchpad holds one B block or one per thread
// accordingly.
TEST(Gemm, PackedThreadsShareOneBBlockWhereAllTilesReadIt) {
  struct Shape {
    int64_t batch, m, n, k;
    bool b_broadcast;
    int threads;
    bool shared;
  };
  for (const Shape& s : std::vector<Shape>{{1, 688, 256, 2048, false, 2, true},  // a weight gradient: k = tokens
                                           {1, 2048, 256, 256, false, 3, true},
                                           {3, 64, 200, 128, true, 2, true},      // B broadcast over the batch
                                           {3, 64, 200, 128, false, 2, false},    // a B per batch: one block each
                                           {1, 300, 32, 64, false, 2, false},     // a small B (8 KiB): each its own
                                           {1, 256, 688, 2048, false, 2, false},  // three column tiles
                                           {1, 2048, 256, 256, false, 1, false}}) {
    GemmDesc d = linear_desc(DType::F32);
    d.batch = s.batch, d.m = s.m, d.n = s.n, d.k = s.k;
    d.b_strides[0] = s.b_broadcast ? 0 : s.k * s.n;
    const hr::cpu::PackedGemmBlocking bl = hr::cpu::packed_gemm_blocking(d, s.threads);
    EXPECT_EQ(bl.shared_b, s.shared) << s.m << "x" << s.n << "x" << s.k << ", " << s.threads << " threads";
    const auto bytes = [](std::size_t floats) { return (floats * 4 + 63) / 64 * 64; };
    const std::size_t own = bytes(bl.a_floats) + bytes(bl.p_floats);
    EXPECT_EQ(bl.scratchpad_bytes(), (s.shared ? 1 : std::size_t(bl.threads)) * bytes(bl.b_floats) + bl.threads * own)
        << s.m << "x" << s.n << "x" << s.k;
  }
}

// A shared B block packed in shares gives the bits one thread gets alone, for B with k contiguous (x W^T) and with
// its lanes contiguous (dy^T x), f32 and bf16 operands: 13 panels, the last ragged, in three k blocks, an uneven
// share per thread (at 14 threads the blocking's 8); 2 panels over 3 threads (thread 0 packs none) in four k blocks
// of 250 (a k tail after the transposes' eights); a B broadcast over a batch of 3.
TEST(Gemm, PackedSharedBBlockGivesTheBitsOfOneThread) {
  struct Shape {
    int64_t batch, m, n, k;
    std::vector<int> threads;
  };
  for (const Shape& sh :
       std::vector<Shape>{{1, 90, 200, 600, {2, 3, 14}}, {1, 90, 32, 1000, {3}}, {3, 64, 200, 128, {2}}})
    for (const bool b_transposed : {true, false})
      for (const DType ab : {DType::F32, DType::BF16}) {
        const PackedCase pc{sh.batch, sh.m,         sh.n, sh.k, !b_transposed, b_transposed,
                            false,    sh.batch > 1, 1.f,  0.f,  DType::F32,    ab};
        const PackedInputs in = inputs_of(pc);
        const std::vector<double> want = reference(in.desc, in.a, in.b, in.c);
        const std::vector<float> alone = packed_run(pc, in, 1, hr::cpu::Microkernel::Auto);
        for (std::size_t i = 0; i < alone.size(); ++i)
          ASSERT_NEAR(alone[i], want[i], 1e-5 * std::max(1.0, std::abs(want[i])));
        for (int threads : sh.threads) {
          ASSERT_TRUE(hr::cpu::packed_gemm_blocking(in.desc, threads).shared_b) << threads << " threads";
          EXPECT_EQ(packed_run(pc, in, threads, hr::cpu::Microkernel::Auto), alone)
              << sh.m << "x" << sh.n << "x" << sh.k << ", " << (b_transposed ? "B^T" : "B") << ", " << dtype_name(ab)
              << ", " << threads << " threads";
        }
      }
}

// A GEMM cut for two threads that OpenMP runs on one (called inside another parallel region, nested regions off):
// the one thread packs the whole shared B block and takes every tile, with the bits of a one-thread GEMM.
TEST(Gemm, PackedSharedBBlockOnASmallerTeamThanItsBlocking) {
  const PackedCase pc{1, 90, 200, 600, false, true, false, false, 1.f, 0.f, DType::F32};
  const PackedInputs in = inputs_of(pc);
  const std::vector<float> alone = packed_run(pc, in, 1, hr::cpu::Microkernel::Auto);
  const hr::cpu::PackedGemmBlocking bl = hr::cpu::packed_gemm_blocking(in.desc, 2);
  ASSERT_TRUE(bl.shared_b);
  ASSERT_EQ(bl.threads, 2);
  GemmArgs g = args_of(pc, in, bl);
  const int levels = omp_get_max_active_levels();
  omp_set_max_active_levels(1);
  int team = 0;
#pragma omp parallel num_threads(2)
  {
#pragma omp single
    {
      hr::cpu::packed_gemm(g, bl);  // its own region gets a team of one
#pragma omp parallel
      team = omp_get_num_threads();
    }
  }
  omp_set_max_active_levels(levels);
  ASSERT_EQ(team, 1);
  EXPECT_EQ(g.c.to_floats(), alone);
}

// Few tiles are cut so that the threads' ranges hold about the same rows: 688 rows over two threads are six
// tiles (360 and 328 rows), not five of 138 (three against two: 412 and 276 rows).
TEST(Gemm, PackedRowTilesSplitEvenlyOverTheThreads) {
  for (int threads : {2, 3})
    for (int64_t m = 256; m <= 4096; m += 8) {
      GemmDesc d = linear_desc(DType::F32);
      d.m = m, d.n = 256, d.k = 2048;  // one column tile
      const hr::cpu::PackedGemmBlocking bl = hr::cpu::packed_gemm_blocking(d, threads);
      const int64_t tiles = (m + bl.mc - 1) / bl.mc;
      ASSERT_EQ(bl.tiles, tiles);
      int64_t most = 0;
      for (int t = 0; t < threads; ++t) {
        int64_t rows = 0;
        for (int64_t i = tiles * t / threads; i < tiles * (t + 1) / threads; ++i)
          rows += std::min(bl.mc, m - i * bl.mc);
        most = std::max(most, rows);
      }
      EXPECT_LE(double(most), 1.07 * double(m) / threads)
          << m << " rows, " << threads << " threads: tiles of " << bl.mc;
    }
}

// Every tile is taken exactly once: first each thread's own range from its front, then, once a thread's range is
// done, the others' from their backs, the one with the most left first.
TEST(Gemm, TileQueuesHandOutEveryTileOnceAndStealFromTheBack) {
  hr::cpu::TileQueues q(10, 3);  // ranges [0, 3), [3, 6), [6, 10)
  std::vector<int64_t> got;
  for (int64_t t = q.next(2); t >= 0; t = q.next(2)) got.push_back(t);
  EXPECT_EQ(got, (std::vector<int64_t>{6, 7, 8, 9, 2, 5, 1, 4, 0, 3}));
  EXPECT_EQ(q.next(0), -1);
  EXPECT_EQ(q.next(1), -1);
  hr::cpu::TileQueues one(5, 1), none(0, 4);
  for (int64_t t = 0; t < 5; ++t) EXPECT_EQ(one.next(0), t);
  EXPECT_EQ(one.next(0), -1);
  EXPECT_EQ(none.next(3), -1);
}

TEST(Gemm, TileQueuesUnderContentionTakeEachTileOnce) {
  constexpr int64_t kTiles = 200000;
  constexpr int kThreads = 6;
  hr::cpu::TileQueues q(kTiles, kThreads);
  std::vector<std::atomic<int>> taken(kTiles);
  // Threads 1-5 run together until they find nothing left; thread 0 starts only then, so its whole range
  // goes to them.
  std::vector<std::thread> others;
  for (int me = 1; me < kThreads; ++me)
    others.emplace_back([&, me] {
      for (int64_t tile = q.next(me); tile >= 0; tile = q.next(me)) taken[std::size_t(tile)].fetch_add(1);
    });
  for (std::thread& th : others) th.join();
  int64_t by_zero = 0;
  for (int64_t tile = q.next(0); tile >= 0; tile = q.next(0)) ++by_zero, taken[std::size_t(tile)].fetch_add(1);
  int64_t twice = 0, never = 0;
  for (const auto& n : taken) twice += n.load() > 1, never += n.load() == 0;
  EXPECT_EQ(twice, 0);
  EXPECT_EQ(never, 0);
  EXPECT_EQ(by_zero, 0) << "thread 0's range is the others' to steal";
}

// Sequence lengths that change from batch to batch make new GEMM shapes: the plans (each a JIT-compiled oneDNN
// primitive) are bounded to the most recently used, and a shape evicted and seen again computes the same.
TEST(Gemm, PlansForShapesThatComeAndGoStayBounded) {
  Tensor w = Tensor::zeros({16, 32}, DType::F32, Device::cpu());
  std::vector<float> wv(16 * 32);
  for (std::size_t i = 0; i < wv.size(); ++i) wv[i] = float(i % 11) * 0.25f - 1.f;
  w = Tensor::from_floats(wv, {16, 32}, DType::F32, Device::cpu());
  auto run = [&](int64_t rows) {
    std::vector<float> xv(std::size_t(rows * 32));
    for (std::size_t i = 0; i < xv.size(); ++i) xv[i] = float(i % 7) - 3.f;
    return linear_forward(Tensor::from_floats(xv, {rows, 32}, DType::F32, Device::cpu()), w, Tensor()).to_floats();
  };
  const std::vector<float> first = run(3);
  for (int64_t rows = 4; rows < 4 + 400; ++rows) run(rows);
  EXPECT_LE(hr::cpu::gemm_plans_cached(), 256u);
  EXPECT_GE(hr::cpu::gemm_plans_cached(), 200u);
  EXPECT_EQ(run(3), first);
}

// gemm_within runs a part of a product (fewer rows, or a shorter inner dimension) with the bits gemm gives that part,
// writes nothing else, and makes exactly the allocations of the whole product; a part that is not within, or whose
// kernel here needs more scratch than the whole's, is refused.
TEST(Gemm, WithinRunsThePartInTheWholeProductsAllocations) {
  const int64_t m = 40, k = 24, n = 29;
  std::vector<float> av(std::size_t(m * k)), bv(std::size_t(k * n));
  for (std::size_t i = 0; i < av.size(); ++i) av[i] = std::sin(0.7f * float(i));
  for (std::size_t i = 0; i < bv.size(); ++i) bv[i] = std::cos(0.3f * float(i));
  for (DType dt : {DType::F32, DType::BF16}) {
    const Tensor a = Tensor::from_floats(av, {1, m, k}, dt, Device::cpu());
    const Tensor b = Tensor::from_floats(bv, {1, k, n}, dt, Device::cpu());
    struct Part {
      int64_t rows, inner;
    };
    for (Part p : {Part{9, k}, Part{m, 5}, Part{1, 1}, Part{m, k}}) {
      const std::string what = hr::str(dtype_name(dt), ", ", p.rows, " rows, inner ", p.inner);
      const Tensor c = Tensor::full({1, m, n}, 7.f, dt, Device::cpu());
      const GemmOperands whole{a, b, c};
      const GemmOperands part{a.slice(1, 0, p.rows).slice(2, 0, p.inner), b.slice(1, 0, p.inner),
                              c.slice(1, 0, p.rows)};
      if (!gemm_fits_within(part, whole)) {
        // oneDNN picks its kernel by shape, and a part's may need more scratchpad than the whole's (on AVX-512, f32
        // with an inner dimension of 5 does): refused by name, nothing written, and the caller runs the whole.
        ASSERT_FALSE(p.rows == m && p.inner == k) << what << ": the whole always fits itself";
        try {
          gemm_within(part, whole, 1.f, 0.f);
          ADD_FAILURE() << what << ": a part that needs more workspace than its whole ran";
        } catch (const hr::Error& e) {
          EXPECT_NE(std::string(e.what()).find("needs more workspace than the product"), std::string::npos) << e.what();
        }
        for (float x : c.to_floats()) ASSERT_EQ(x, 7.f) << what << ": written by a refused part";
        continue;
      }
      std::vector<std::pair<int, std::size_t>> made, asked;
      auto alloc = allocator_for(Device::cpu());
      auto trace = [&](std::vector<std::pair<int, std::size_t>>& into) {
        alloc->set_trace([&into](const TraceEvent& e) {
          if (e.kind == TraceEvent::Kind::Alloc || e.kind == TraceEvent::Kind::Free)
            into.emplace_back(int(e.kind), e.size);
        });
      };
      trace(made);
      gemm_within(part, whole, 1.f, 0.f);
      trace(asked);
      gemm_allocations(whole.a, whole.b, whole.c);
      alloc->set_trace({});
      EXPECT_EQ(made, asked) << what;

      const Tensor alone = Tensor::empty({1, p.rows, n}, dt, Device::cpu());
      gemm(part.a.contiguous(), part.b.contiguous(), alone);
      const std::vector<float> got = c.to_floats(), want = alone.to_floats();
      for (int64_t i = 0; i < m * n; ++i)
        ASSERT_EQ(got[std::size_t(i)], i < p.rows * n ? want[std::size_t(i)] : 7.f) << what << " at " << i;
    }
    const Tensor c = Tensor::empty({1, 9, n}, dt, Device::cpu());
    try {
      gemm_within({a, b, Tensor::empty({1, m, n}, dt, Device::cpu())}, {a.slice(1, 0, 9), b, c});
      ADD_FAILURE() << "a part larger than its whole ran";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("[gemm_within] the part (1, 40, 24) @ (1, 24, 29) is not within the product "
                                           "(1, 9, 24) @ (1, 24, 29)"),
                std::string::npos)
          << e.what();
    }
  }
}

// A product with no C (no batch, no rows or no columns) is cut into no tiles and asks for no scratch, and running
// it, packed or through the backend's gemm on whichever path the CPU takes, touches nothing.
TEST(Gemm, AProductWithNoOutputHasNoTilesAndRunsAsNothing) {
  const std::vector<PackedCase> cases = {
      {0, 8, 16, 32, false, true, false, false, 1.f, 0.f, DType::F32},
      {1, 0, 16, 32, false, true, false, true, 1.f, 1.f, DType::F32},
      {1, 8, 0, 32, true, false, false, true, 1.f, 0.f, DType::BF16},
      {3, 8, 0, 0, false, false, false, false, 1.f, 0.f, DType::F32},
  };
  for (const PackedCase& pc : cases) {
    const PackedInputs in = inputs_of(pc);
    for (int threads : {1, 2, 7}) {
      const hr::cpu::PackedGemmBlocking bl = hr::cpu::packed_gemm_blocking(in.desc, threads);
      EXPECT_EQ(bl.tiles, 0) << pc.batch << " x " << pc.m << " x " << pc.n << ", " << threads << " threads";
      EXPECT_EQ(bl.scratchpad_bytes(), 0u);
      EXPECT_TRUE(packed_run(pc, in, threads, hr::cpu::Microkernel::Auto).empty());
      ThreadCount t(threads);
      EXPECT_EQ(cpu_kernels().gemm_scratchpad_bytes(in.desc), 0u);
      EXPECT_EQ(cpu_kernels().gemm_workspace_bytes(in.desc), 0u);
      GemmArgs g = args_of(pc, in, bl);
      cpu_kernels().gemm(g);
      EXPECT_EQ(g.c.numel(), 0);
    }
  }
}

// A product over k = 0 is C = beta C: with beta 0 every element of C is written as zero, whatever C held (a step's
// first weight gradient over no rows lands in a buffer that was never filled), through whichever path the CPU takes
// (oneDNN's brgemm natively, the packed GEMM under the avx2 ISA rerun), in f32 and bf16; with beta 1, C stays.
TEST(Gemm, AProductOverNoRowsWritesZerosOverWhateverCHeld) {
  const Device cpu = Device::cpu();
  for (const DType dt : {DType::F32, DType::BF16}) {
    const Tensor dy = Tensor::zeros({1, 0, 24}, dt, cpu), x = Tensor::zeros({1, 0, 40}, dt, cpu);
    const Tensor c = Tensor::full({1, 24, 40}, std::nanf(""), DType::F32, cpu);
    gemm(dy.transpose(1, 2), x, c, 1.f, 0.f);
    for (float v : c.to_floats()) ASSERT_EQ(v, 0.f) << dtype_name(dt);
    const Tensor kept = Tensor::full({1, 24, 40}, 3.f, DType::F32, cpu);
    gemm(dy.transpose(1, 2), x, kept, 1.f, 1.f);
    for (float v : kept.to_floats()) ASSERT_EQ(v, 3.f) << dtype_name(dt);
  }
}
