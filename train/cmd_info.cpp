// `headroom info`: what this build has (back-ends, libraries) and what the machine offers.
#include <omp.h>
#include <unistd.h>

#include <cstdio>

#include "core/backend/kernels.h"
#include "train/build_info.h"
#include "train/commands.h"

namespace hr::train {

int cmd_info(const std::vector<std::string>& args) {
  HR_CHECK(args.empty(), "[info] takes no arguments");
  std::printf("headroom %s\n", kVersion);
  std::printf("  %s CUDA back-end%s\n", kHaveCuda ? "✓" : "✗", kHaveCuda ? " (compiled; needs a GPU to run)" : "");
  std::printf("  %s cuDNN\n  %s NCCL\n  %s MPI\n", kHaveCudnn ? "✓" : "✗", kHaveNccl ? "✓" : "✗", kHaveMpi ? "✓" : "✗");
  std::printf("  ✓ oneDNN %s (CPU GEMM)\n", kDnnlVersion);
  std::printf("  CPU threads: %d (OMP_NUM_THREADS to change)\n", omp_get_max_threads());
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  std::printf("  host memory: %s\n", format_bytes(double(pages) * double(page)).c_str());
  return 0;
}

}  // namespace hr::train
