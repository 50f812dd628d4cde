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

std::size_t parse_bytes(const std::string& text, const std::string& what) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  double mul = 0;
  if (unit.empty() || unit == "B") mul = 1;
  else if (unit == "KiB" || unit == "K") mul = 1024.0;
  else if (unit == "MiB" || unit == "M") mul = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "G") mul = 1024.0 * 1024 * 1024;
  else if (unit == "TiB" || unit == "T") mul = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "KB") mul = 1e3;
  else if (unit == "MB") mul = 1e6;
  else if (unit == "GB") mul = 1e9;
  HR_CHECK(used > 0 && mul > 0 && v >= 0, "[", what, "] '", text,
           "' is not a size; write e.g. 64MiB, 2GiB, 40GB or a number of bytes");
  return std::size_t(v * mul);
}

}  // namespace hr::train
