// TensorBoard scalars, memory timelines and out-of-memory snapshots of a training run.
#include "train/observe.h"

#include <algorithm>
#include <cstring>

#include "core/io/atomic_file.h"

namespace hr::train {

using namespace hr::core;
using nlohmann::json;

std::vector<std::pair<std::string, float>> step_scalars(const json& j) {
  std::vector<std::pair<std::string, float>> v;
  auto add = [&](const char* tag, const json& x) {
    if (x.is_number()) v.emplace_back(tag, x.get<float>());
  };
  add("train/loss", j["loss"]);
  add("train/learning_rate", j["lr"]);
  add("train/grad_norm", j["grad_norm"]);
  add("train/loss_scale", j["loss_scale"]);
  add("train/tokens_per_s", j["tokens_per_s"]);
  add("train/samples_per_s", j["samples_per_s"]);
  add("train/comm_exposed_s", j["comm_exposed_s"]);
  for (const char* k : {"allocated", "reserved", "peak_allocated", "peak_reserved", "predicted_peak",
                        "predicted_reserved", "planned_peak", "fragmentation", "host_rss"})
    add(str("memory/", k).c_str(), j[k]);
  add("memory/host_allocated", j["host"]["allocated"]);
  for (const auto& [name, bytes] : j["by_category"].items()) add(str("memory/category/", name).c_str(), bytes);
  return v;
}

std::vector<std::pair<std::string, float>> eval_scalars(const EvalResult& r) {
  std::vector<std::pair<std::string, float>> v = {{"eval/loss", float(r.loss)}, {"eval/accuracy", float(r.accuracy)}};
  for (const auto& [type, ct] : r.by_type)
    v.emplace_back("eval/accuracy/" + type, ct.second ? float(double(ct.first) / double(ct.second)) : 0.f);
  return v;
}

RunObservers::RunObservers(const RunConfig& c, parallel::Communicator& comm, CachingAllocator& device,
                           CachingAllocator& host, int64_t first_step)
    : c_(c), comm_(comm), device_(device), host_(host) {
  if (c.tensorboard && comm.rank() == 0) {
    tensorboard_ =
        std::make_unique<EventWriter>(c.tensorboard_dir.empty() ? c.output_dir + "/runs" : c.tensorboard_dir);
    tensorboard_->session_start(first_step);
  }
  traced_ = !c.trace_steps.empty() || c.snapshot_on_oom;
  if (!traced_) return;
  device_.set_trace([this](const TraceEvent& e) { on_event(true, e); });
  host_.set_trace([this](const TraceEvent& e) { on_event(false, e); });
  if (!c.snapshot_on_oom) return;
  device_.set_oom_observer([this](const AllocatorSnapshot& state, std::size_t) {
    // Under the allocator's lock: only keep the layout; write_oom_snapshot() writes it once the error is caught.
    try {
      oom_state_ = state;
      have_oom_state_ = true;
    } catch (...) {  // out of host memory too: no snapshot, and the OutOfMemory error goes on as it is
      have_oom_state_ = false;
    }
  });
}

std::string RunObservers::write_oom_snapshot() {
  if (!have_oom_state_) return "";
  have_oom_state_ = false;
  std::vector<MemvizAction> history;
  {
    // The device allocator's trace function appends to history_ under its lock.
    (void)device_.stats();
    history.assign(history_.begin(), history_.end());
  }
  if (!history.empty() && std::strcmp(history.back().action, "oom") == 0) {
    int64_t reserved = 0;
    for (const auto& seg : oom_state_.segments) reserved += int64_t(seg.size);
    history.back().device_free = int64_t(device_.capacity()) - reserved;
  }
  const std::string path = str(c_.output_dir, "/oom_snapshot.rank", comm_.rank(), ".step", step_, ".pickle");
  try {
    const std::string data = memviz_snapshot(oom_state_, history, device_.device_name());
    AtomicFile f(path);
    f.write(data.data(), data.size());
    f.commit();
  } catch (const std::exception& e) {
    std::printf("[memory] could not write the out-of-memory snapshot %s: %s\n", path.c_str(), e.what());
    return "";
  }
  oom_state_ = {};
  return path;
}

RunObservers::~RunObservers() {
  if (owned_) {  // a traced step ended by an error: its timeline goes with this object
    Timeline* mine = owned_.get();
    span_timeline_slot().compare_exchange_strong(mine, nullptr);
  }
  if (!traced_) return;
  device_.set_trace({});
  host_.set_trace({});
  device_.set_oom_observer({});
}

void RunObservers::on_event(bool device, const TraceEvent& e) noexcept {
  // Inside the allocator: nothing may throw out of here (a free would end the process). Out of host memory,
  // the observation stops and the run goes on.
  try {
    if (Timeline* t = timeline_.load()) t->allocator_event(device ? device_track_ : host_track_, e);
    if (device && c_.snapshot_on_oom && !history_off_ && memviz_records(e)) {
      history_.push_back(memviz_action(e));
      if (history_.size() > kHistoryKept) history_.pop_front();
    }
  } catch (...) {
    timeline_.store(nullptr);
    history_off_ = true;
  }
}

void RunObservers::begin_step(int64_t step) {
  step_ = step;
  have_oom_state_ = false;
  if (std::find(c_.trace_steps.begin(), c_.trace_steps.end(), step) == c_.trace_steps.end()) return;
  owned_ = std::make_unique<Timeline>(c_.trace_event_clock ? Timeline::Clock::Events : Timeline::Clock::Wall);
  device_track_ = owned_->add_allocator("device", device_.stats());
  host_track_ = owned_->add_allocator("host", host_.stats(), Timeline::Advance::No);
  timeline_.store(owned_.get());
  set_span_timeline(owned_.get());
}

std::string RunObservers::end_step() {
  if (!owned_) return "";
  set_span_timeline(nullptr);
  timeline_.store(nullptr);
  // A loader thread may be inside the host allocator's trace function: its lock orders it before this.
  (void)host_.stats();
  (void)device_.stats();
  const std::string path = str(c_.output_dir, "/trace.rank", comm_.rank(), ".step", step_, ".json");
  try {
    const std::string text = owned_->chrome_json(
        comm_.rank(), str("rank ", comm_.rank(), " step ", step_, " (measured, ", device_.device_name(), ")"));
    owned_.reset();
    AtomicFile f(path);
    f.write(text.data(), text.size());
    f.commit();
  } catch (const std::exception& e) {  // a timeline is worth a warning, not the run
    owned_.reset();
    std::printf("[memory] the timeline of step %lld was not written to %s: %s\n", (long long)step_, path.c_str(),
                e.what());
    return "";
  }
  return path;
}

void RunObservers::step(const json& line) {
  if (!c_.tensorboard) return;
  std::vector<std::pair<std::string, float>> v;
  if (tensorboard_) v = step_scalars(line);
  if (comm_.world() > 1) {
    // Every rank's memory under its own tags, in one collective (every rank calls it, writer or not).
    static constexpr const char* kPerRank[] = {"peak_allocated", "peak_reserved", "predicted_peak", "host_rss"};
    std::vector<double> mine;
    for (const char* k : kPerRank) mine.push_back(line[k].is_number() ? line[k].get<double>() : 0.0);
    const std::vector<double> all = comm_.gather(mine);
    for (int r = 0; r < comm_.world() && tensorboard_; ++r)
      for (std::size_t i = 0; i < mine.size(); ++i)
        v.emplace_back(str("memory/rank", r, "/", kPerRank[i]), float(all[std::size_t(r) * mine.size() + i]));
  }
  if (tensorboard_) write_scalars(line["step"].get<int64_t>(), v);
}

void RunObservers::eval(int64_t step, const EvalResult& r) {
  if (tensorboard_) write_scalars(step, eval_scalars(r));
}

void RunObservers::write_scalars(int64_t step, const std::vector<std::pair<std::string, float>>& v) {
  try {
    tensorboard_->scalars(step, v);
  } catch (const std::exception& e) {  // a full disk ends the TensorBoard curves, not the run
    std::printf("[log] TensorBoard logging stops: %s\n", e.what());
    tensorboard_.reset();
  }
}

}  // namespace hr::train
