// HR_OP_PROFILE=FILE: the GPU time of every kernel-table call, by op. A KernelObserver on the thread that
// starts the back-end records a CUDA event before and after each call on the compute stream and waits for the
// second, so each call's figure is its own GPU time (plus one launch's latency) and nothing overlaps; the step
// is slower while it runs, so the figures are a profile, not a timing. Calls are grouped into steps, a step
// ending where the optimizer's updates (adamw, adamw8bit, sgd, adafactor) end, so that start-up (the weights' copies to
// the GPU) and warm-up stay apart from a steady step. At exit FILE gets every step's GPU and wall time, and,
// per op, the calls and milliseconds of the last complete step (largest first) and of the whole run.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

  void enter(const char* op) override {
    if (std::this_thread::get_id() != owner_ || depth_++ > 0) return;
    if (updating_ && !is_update(op)) end_step();
    if (!began_) began_ = true, step_began_ = std::chrono::steady_clock::now();
    cudaEventRecord(start_, stream());
  }

  void leave(const char* op) override {
    if (std::this_thread::get_id() != owner_ || --depth_ > 0) return;
    cudaEventRecord(end_, stream());
    float ms = 0;
    if (cudaEventSynchronize(end_) == cudaSuccess && cudaEventElapsedTime(&ms, start_, end_) == cudaSuccess) {
      for (Ops* ops : {&step_, &run_}) {
        Op& o = (*ops)[op];
        ++o.calls;
        o.ms += ms;
      }
    }
    cudaGetLastError();  // a failed kernel reports itself where it ran; the profile only skips the figure
    updating_ = is_update(op);
    last_ = std::chrono::steady_clock::now();
  }

  void write() {
    if (updating_) end_step();
    std::FILE* f = std::fopen(path_.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "headroom: warning: HR_OP_PROFILE: cannot write %s\n", path_.c_str());
      return;
    }
    std::fprintf(f, "{\"steps\": [");
    for (std::size_t i = 0; i < steps_.size(); ++i)
      std::fprintf(f, "%s{\"gpu_ms\": %.3f, \"wall_ms\": %.3f}", i ? ", " : "", steps_[i].first, steps_[i].second);
    std::fprintf(f, "],\n\"last_step\": ");
    write_ops(f, last_step_);
    std::fprintf(f, ",\n\"whole_run\": ");
    write_ops(f, run_);
    std::fprintf(f, "}\n");
    std::fclose(f);
  }

 private:
  struct Op {
    int64_t calls = 0;
    double ms = 0;
  };
  using Ops = std::map<std::string, Op>;

  static bool is_update(const char* op) {
    return !std::strcmp(op, "adamw") || !std::strcmp(op, "adamw8bit") || !std::strcmp(op, "sgd") ||
           !std::strcmp(op, "adafactor");
  }

  void end_step() {
    double gpu = 0;
    for (const auto& [name, o] : step_) gpu += o.ms;
    steps_.emplace_back(gpu, std::chrono::duration<double, std::milli>(last_ - step_began_).count());
    last_step_ = std::move(step_);
    step_.clear();
    updating_ = false;
    step_began_ = last_;
  }

  static void write_ops(std::FILE* f, const Ops& ops) {
    std::vector<std::pair<std::string, Op>> v(ops.begin(), ops.end());
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    double total = 0;
    for (const auto& [name, o] : v) total += o.ms;
    std::fprintf(f, "{\"gpu_ms\": %.3f, \"ops\": [", total);
    for (std::size_t i = 0; i < v.size(); ++i)
      std::fprintf(f, "%s\n  {\"op\": \"%s\", \"calls\": %lld, \"ms\": %.3f, \"share\": %.4f}", i ? "," : "",
                   v[i].first.c_str(), static_cast<long long>(v[i].second.calls), v[i].second.ms,
                   total > 0 ? v[i].second.ms / total : 0.0);
    std::fprintf(f, "]}");
  }

  std::string path_;
  std::thread::id owner_;
  cudaEvent_t start_ = nullptr, end_ = nullptr;
  int depth_ = 0;
  bool began_ = false, updating_ = false;
  std::chrono::steady_clock::time_point step_began_, last_;
  Ops step_, last_step_, run_;
  std::vector<std::pair<double, double>> steps_;  // each step's GPU and wall milliseconds
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
