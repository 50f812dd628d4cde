// HR_OP_PROFILE=FILE: the GPU time of every kernel-table call, by op. A KernelObserver on the thread that
// starts the back-end records a CUDA event before and after each call on the compute stream and waits for the
// second, so each call's figure is its own GPU time (plus one launch's latency) and nothing overlaps; the step
// is slower while it runs, so the figures are a profile, not a timing. At exit FILE gets, per op, the calls and
// milliseconds, largest first, and their total beside the process's wall time between the first and last call.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/backend/cuda/cuda_check.h"
#include "core/backend/cuda/cuda_kernels.h"
#include "core/ops/dispatch.h"

namespace hr::cuda {
namespace {

class OpProfile : public core::KernelObserver {
 public:
  explicit OpProfile(std::string path) : path_(std::move(path)), owner_(std::this_thread::get_id()) {
    HR_CUDA_CHECK(cudaEventCreate(&start_));
    HR_CUDA_CHECK(cudaEventCreate(&end_));
  }

  void enter(const char* /*op*/) override {
    if (std::this_thread::get_id() != owner_ || depth_++ > 0) return;
    if (!began_) began_ = true, first_ = std::chrono::steady_clock::now();
    cudaEventRecord(start_, stream());
  }

  void leave(const char* op) override {
    if (std::this_thread::get_id() != owner_ || --depth_ > 0) return;
    cudaEventRecord(end_, stream());
    float ms = 0;
    if (cudaEventSynchronize(end_) == cudaSuccess && cudaEventElapsedTime(&ms, start_, end_) == cudaSuccess) {
      Op& o = ops_[op];
      ++o.calls;
      o.ms += ms;
    }
    cudaGetLastError();  // a failed kernel reports itself where it ran; the profile only skips the figure
    last_ = std::chrono::steady_clock::now();
  }

  void write() const {
    std::vector<std::pair<std::string, Op>> v(ops_.begin(), ops_.end());
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    double total = 0;
    for (const auto& [name, o] : v) total += o.ms;
    std::FILE* f = std::fopen(path_.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "headroom: warning: HR_OP_PROFILE: cannot write %s\n", path_.c_str());
      return;
    }
    const double wall = std::chrono::duration<double, std::milli>(last_ - first_).count();
    std::fprintf(f, "{\"gpu_ms\": %.3f, \"wall_ms_first_to_last_call\": %.3f, \"ops\": [", total, wall);
    for (std::size_t i = 0; i < v.size(); ++i)
      std::fprintf(f, "%s\n  {\"op\": \"%s\", \"calls\": %lld, \"ms\": %.3f, \"share\": %.4f}", i ? "," : "",
                   v[i].first.c_str(), static_cast<long long>(v[i].second.calls), v[i].second.ms,
                   total > 0 ? v[i].second.ms / total : 0.0);
    std::fprintf(f, "\n]}\n");
    std::fclose(f);
  }

 private:
  struct Op {
    int64_t calls = 0;
    double ms = 0;
  };
  std::string path_;
  std::thread::id owner_;
  cudaEvent_t start_ = nullptr, end_ = nullptr;
  int depth_ = 0;
  bool began_ = false;
  std::chrono::steady_clock::time_point first_, last_;
  std::map<std::string, Op> ops_;
};

OpProfile* g_profile = nullptr;

}  // namespace

void start_op_profile() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* path = std::getenv("HR_OP_PROFILE");
    if (!path || !*path || core::kernel_observer()) return;
    g_profile = new OpProfile(path);  // lives to the exit, where it is written (the CUDA context may be gone)
    core::set_kernel_observer(g_profile);
    std::atexit([] { g_profile->write(); });
  });
}

}  // namespace hr::cuda
