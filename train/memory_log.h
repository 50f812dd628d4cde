// The per-step memory log: one JSON line per optimizer step in output_dir/memory.jsonl (schema in the README),
// the same numbers in the console line, and a leak watch over allocated bytes at step boundaries.
#pragma once

#include <cstdio>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/memory/caching_allocator.h"
#include "train/log_file.h"

namespace hr::train {

struct StepRecord {
  int64_t step = 0;
  float loss = 0, lr = 0, grad_norm = 0, loss_scale = 1;
  double step_s = 0;          // wall time of the step: drawing its batches, forward, backward, update
  double comm_exposed_s = 0;  // of it, the time this rank stood still for collectives (Communicator::exposed_seconds)
  int64_t tokens = 0;         // over all ranks
  int64_t loss_tokens = 0;    // of them, the labelled ones the loss averages over (over all ranks)
  double flops = 0;           // what the step's matrix products ran (core::matmul_flops), over all ranks
  double tokens_per_s = 0, samples_per_s = 0;
  bool skipped = false;   // fp16 overflow or a non-finite step: the optimizer step was skipped
  std::string nonfinite;  // a non-finite loss or gradient (bf16/fp32): the first group that produced one
  // The dry run of this step's exact shapes on the meta device (peak allocated and reserved), and the
  // plan's worst case; -1: none.
  int64_t predicted_peak = -1, predicted_reserved = -1, planned_peak = -1;
  const char* allocator = "caching";            // memory.allocator in use
  int64_t device_free = -1, device_total = -1;  // cudaMemGetInfo after the step, on a GPU; -1: the CPU
  std::vector<std::string> warnings;            // the leak watch's and the prediction check's, as printed
};

// Resident set size of this process in bytes (from /proc/self/statm; 0 where unavailable).
int64_t host_rss_bytes();

class MemoryLog {
 public:
  MemoryLog(const std::string& path, int64_t leak_window);
  // Writes the line for a finished step from the allocator's stats (peaks since the last reset_peak_stats).
  // `host`: the host allocator (offloaded optimizer states, loader buffers), logged under "host"; `rss`: the
  // process's resident set. Returns the line.
  nlohmann::json write(const StepRecord& r, const core::MemoryStats& s, const core::MemoryStats& host, int64_t rss);
  // Records the memory at a step boundary; returns warnings (one per line, "" for none) when
  //  - the device's or the host allocator's allocated bytes grew at every step of the window (naming the
  //    categories that grew: something keeps tensors alive across steps), or
  //  - the process's resident set (`rss` bytes) has grown past its level after the first window by more than
  //    max(kRssSlack, 10%): memory outside the allocators (libraries, caches, the loader) that keeps growing.
  std::string leak_check(int64_t step, const core::MemoryStats& device, const core::MemoryStats& host, int64_t rss);
  static constexpr int64_t kRssSlack = int64_t(64) << 20;
  const LogFile& file() const { return file_; }

 private:
  LogFile file_;
  int64_t window_;
  struct Sample {
    int64_t step, allocated;
    std::map<std::string, int64_t> by_category;
  };
  // Sustained growth of one allocator's allocated bytes over the window.
  struct Watch {
    // A category left out of the watch: the host's io, the loader's batches in flight, as many as the
    // workers happen to be ahead at a step boundary (bounded by data.prefetch; a queue filling up over a
    // window is not a leak, and memory that does keep growing shows in the resident-set watch).
    std::optional<core::Category> ignored;
    std::deque<Sample> history;
    int64_t last_warned = -1;
    std::string check(int64_t step, const core::MemoryStats& s, int64_t window, const char* what);
  };
  Watch device_, host_{core::Category::IO, {}, -1};
  int64_t rss_base_ = -1, rss_base_step_ = 0, steps_seen_ = 0;
};

}  // namespace hr::train
