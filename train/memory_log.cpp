// memory.jsonl lines and the leak watch.
#include "train/memory_log.h"

#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"

namespace hr::train {

using namespace hr::core;

int64_t host_rss_bytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return resident * int64_t(sysconf(_SC_PAGE_SIZE));
}

MemoryLog::MemoryLog(const std::string& path, int64_t window) : window_(window) {
  file_ = std::fopen(path.c_str(), "a");
  HR_CHECK(file_, "[log] cannot open ", path);
}

MemoryLog::~MemoryLog() {
  if (file_) std::fclose(file_);
}

void MemoryLog::write(const StepRecord& r, const MemoryStats& s, const MemoryStats& host) {
  nlohmann::json j;
  j["step"] = r.step;
  j["loss"] = r.loss;
  j["lr"] = r.lr;
  j["grad_norm"] = r.grad_norm;
  j["loss_scale"] = r.loss_scale;
  j["skipped"] = r.skipped;
  j["nonfinite"] = r.nonfinite.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.nonfinite);
  j["tokens_per_s"] = r.tokens_per_s;
  j["allocated"] = s.allocated_bytes.current;
  j["reserved"] = s.reserved_bytes.current;
  j["active"] = s.active_bytes.current;
  j["peak_allocated"] = s.allocated_bytes.peak;
  j["peak_reserved"] = s.reserved_bytes.peak;
  auto opt = [](int64_t v) { return v >= 0 ? nlohmann::json(v) : nlohmann::json(nullptr); };
  j["predicted_peak"] = opt(r.predicted_peak);
  j["predicted_reserved"] = opt(r.predicted_reserved);
  j["planned_peak"] = opt(r.planned_peak);
  j["fragmentation"] = s.fragmentation();
  j["alloc_retries"] = s.num_alloc_retries;
  j["ooms"] = s.num_ooms;
  nlohmann::json cat = nlohmann::json::object();
  for (Category c : kAllCategories) cat[category_name(c)] = s.category(c).peak;
  j["by_category"] = cat;
  nlohmann::json hcat = nlohmann::json::object();
  for (Category c : kAllCategories) hcat[category_name(c)] = host.category(c).peak;
  j["host"] = {{"allocated", host.allocated_bytes.current}, {"peak_allocated", host.allocated_bytes.peak}, {"by_category", hcat}};
  j["host_rss"] = host_rss_bytes();
  const std::string line = j.dump() + "\n";
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
}

std::string MemoryLog::leak_check(int64_t step, const MemoryStats& s) {
  Sample now{step, s.allocated_bytes.current, {}};
  for (Category c : kAllCategories) now.by_category[category_name(c)] = s.category(c).current;
  history_.push_back(now);
  if (int64_t(history_.size()) > window_) history_.pop_front();
  if (int64_t(history_.size()) < window_ || step - last_warned_ < window_) return "";
  // Sustained growth: allocated never went down across the window and ended higher.
  for (std::size_t i = 1; i < history_.size(); ++i)
    if (history_[i].allocated < history_[i - 1].allocated) return "";
  const Sample& first = history_.front();
  if (now.allocated <= first.allocated) return "";
  std::string grew;
  for (const auto& [name, bytes] : now.by_category) {
    const int64_t d = bytes - first.by_category.at(name);
    if (d > 0) grew += str(grew.empty() ? "" : ", ", name, " +", format_bytes(double(d)));
  }
  last_warned_ = step;
  return str("[memory] warning: allocated bytes grew for ", window_, " steps in a row (step ", first.step, " -> ", step,
             ", ", format_bytes(double(first.allocated)), " -> ", format_bytes(double(now.allocated)), "): ", grew,
             ". Something keeps tensors alive across steps.");
}

}  // namespace hr::train
