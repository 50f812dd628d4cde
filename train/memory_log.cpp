// memory.jsonl lines and the leak watch.
#include "train/memory_log.h"

#include <unistd.h>

#include <algorithm>
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

MemoryLog::MemoryLog(const std::string& path, int64_t window) : file_(path), window_(window) {}

nlohmann::json MemoryLog::write(const StepRecord& r, const MemoryStats& s, const MemoryStats& host, int64_t rss) {
  nlohmann::json j;
  j["step"] = r.step;
  j["loss"] = r.loss;
  j["lr"] = r.lr;
  j["grad_norm"] = r.grad_norm;
  j["loss_scale"] = r.loss_scale;
  j["skipped"] = r.skipped;
  j["nonfinite"] = r.nonfinite.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.nonfinite);
  j["step_s"] = r.step_s;
  j["comm_exposed_s"] = r.comm_exposed_s;
  j["tokens"] = r.tokens;
  j["loss_tokens"] = r.loss_tokens;
  j["flops"] = r.flops;
  j["tokens_per_s"] = r.tokens_per_s;
  j["samples_per_s"] = r.samples_per_s;
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
  j["allocator"] = r.allocator;
  j["alloc_retries"] = s.num_alloc_retries;
  j["ooms"] = s.num_ooms;
  nlohmann::json cat = nlohmann::json::object();
  for (Category c : kAllCategories) cat[category_name(c)] = s.category(c).peak;
  j["by_category"] = cat;
  nlohmann::json at = nlohmann::json::object();
  for (Category c : kAllCategories) at[category_name(c)] = s.at_peak[std::size_t(c)];
  j["at_peak"] = at;
  nlohmann::json hcat = nlohmann::json::object();
  for (Category c : kAllCategories) hcat[category_name(c)] = host.category(c).peak;
  j["host"] = {{"allocated", host.allocated_bytes.current},
               {"peak_allocated", host.allocated_bytes.peak},
               {"reserved", host.reserved_bytes.current},
               {"by_category", hcat}};
  j["host_rss"] = rss;
  if (r.device_total >= 0) j["device_free"] = r.device_free, j["device_total"] = r.device_total;
  j["warnings"] = r.warnings;
  file_.append(j.dump() + "\n", r.step);
  return j;
}

std::string MemoryLog::leak_check(int64_t step, const MemoryStats& device, const MemoryStats& host, int64_t rss) {
  std::string out = device_.check(step, device, window_, "allocated bytes");
  const std::string h = host_.check(step, host, window_, "host allocator's allocated bytes");
  if (!h.empty()) out += (out.empty() ? "" : "\n") + h;
  // The resident set: its level once the first window is over (loader, caches and kernels warmed up), and
  // growth past it. A warning moves the level, so that each further growth warns once.
  if (rss <= 0) return out;
  if (++steps_seen_ == window_ || (rss_base_ >= 0 && rss < rss_base_)) rss_base_ = rss, rss_base_step_ = step;
  if (rss_base_ < 0) return out;
  const int64_t slack = std::max(kRssSlack, rss_base_ / 10);
  if (rss > rss_base_ + slack) {
    out += str(out.empty() ? "" : "\n", "[memory] warning: the process's resident memory grew from ",
               format_bytes(double(rss_base_)), " at step ", rss_base_step_, " to ", format_bytes(double(rss)),
               " at step ", step,
               " while the allocators' bytes stayed within their bounds: memory outside the "
               "allocators (a library cache, the data loader) keeps growing.");
    rss_base_ = rss, rss_base_step_ = step;
  }
  return out;
}

std::string MemoryLog::Watch::check(int64_t step, const MemoryStats& s, int64_t window, const char* what) {
  Sample now{step, s.allocated_bytes.current, {}};
  for (Category c : kAllCategories) {
    if (c == ignored) {
      now.allocated -= s.category(c).current;
      continue;
    }
    now.by_category[category_name(c)] = s.category(c).current;
  }
  history.push_back(now);
  if (int64_t(history.size()) > window) history.pop_front();
  if (int64_t(history.size()) < window || step - last_warned < window) return "";
  // Sustained growth: allocated never went down across the window and ended higher.
  for (std::size_t i = 1; i < history.size(); ++i)
    if (history[i].allocated < history[i - 1].allocated) return "";
  const Sample& first = history.front();
  if (now.allocated <= first.allocated) return "";
  std::string grew;
  for (const auto& [name, bytes] : now.by_category) {
    const int64_t d = bytes - first.by_category.at(name);
    if (d > 0) grew += str(grew.empty() ? "" : ", ", name, " +", format_bytes(double(d)));
  }
  last_warned = step;
  return str("[memory] warning: ", what, " grew for ", window, " steps in a row (step ", first.step, " -> ", step, ", ",
             format_bytes(double(first.allocated)), " -> ", format_bytes(double(now.allocated)), "): ", grew,
             ". Something keeps tensors alive across steps.");
}

}  // namespace hr::train
