// `headroom info`: what this build has (back-ends, libraries) and what the machine offers.
#include <omp.h>
#include <unistd.h>

#include <cstdio>

#include "core/backend/device_info.h"
#include "core/backend/kernels.h"
#include "train/build_info.h"
#include "train/commands.h"

namespace hr::train {

int cmd_info(const std::vector<std::string>& args) {
  HR_CHECK(args.empty(), "[info] takes no arguments");
  std::printf("headroom %s\n", kVersion);
  auto version = [](bool have, const char* v) { return have ? str(" (compiled against ", v, ")") : std::string(); };
  std::printf("  %s CUDA back-end%s\n", kHaveCuda ? "✓" : "✗", version(kHaveCuda, kCudaVersion).c_str());
  std::printf("  %s cuDNN%s\n  %s NCCL%s\n  %s MPI\n", kHaveCudnn ? "✓" : "✗",
              version(kHaveCudnn, kCudnnVersion).c_str(), kHaveNccl ? "✓" : "✗",
              version(kHaveNccl, kNcclVersion).c_str(), kHaveMpi ? "✓" : "✗");
  const core::CudaInfo cuda = core::query_cuda(core::FreeMemory::Query);
  if (kHaveCuda)
    std::printf("  CUDA runtime %s, driver %s\n", core::cuda_version_text(cuda.runtime_version).c_str(),
                cuda.driver_version ? core::cuda_version_text(cuda.driver_version).c_str() : "none");
  if (kHaveCuda) std::printf("  fused attention: %s\n", cuda.fused_attention.c_str());
  // Opened on first use by a GPU run, not at start: here to say where they are found.
  for (const std::string& lib : core::cuda_libraries()) std::printf("  %s\n", lib.c_str());
  for (const core::GpuInfo& g : cuda.gpus)
    std::printf("  cuda:%d %s, compute capability %d.%d, %d multiprocessors, %s (%s free)\n", g.index, g.name.c_str(),
                g.major, g.minor, g.multiprocessors, format_bytes(double(g.total_bytes)).c_str(),
                format_bytes(double(g.free_bytes)).c_str());
  if (cuda.gpus.empty()) std::printf("  no GPU: %s\n", cuda.absent.c_str());
  std::printf("  ✓ oneDNN %s (CPU GEMM)\n", kDnnlVersion);
  std::printf("  CPU threads: %d (OMP_NUM_THREADS to change)\n", omp_get_max_threads());
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  std::printf("  host memory: %s\n", format_bytes(double(pages) * double(page)).c_str());
  return 0;
}

}  // namespace hr::train
