// A step's measurements beside its dry run's: the record memory.jsonl writes and the console shows.
#include "train/step_record.h"

#include <algorithm>

#include "core/backend/device_info.h"
#include "core/memory/replay.h"

namespace hr::train {

using namespace hr::core;

const Prediction& StepPredictions::of(const StepShapes& shapes) {
  return predicted_.get(shapes, [&] {
    ++dry_runs_;
    return predictor_.step(shapes, nullptr, device_.arena_bytes());
  });
}

StepMeter::StepMeter(const RunConfig& c, CachingAllocator& device, CachingAllocator& host, StepPredictions& predictions,
                     MemoryLog& log, RunObservers& observers, int64_t planned_peak, Where where)
    : c_(c),
      device_(device),
      host_(host),
      predictions_(predictions),
      log_(log),
      observers_(observers),
      planned_peak_(planned_peak),
      where_(where) {}

// The record's numbers of the step itself.
StepRecord StepMeter::record_of(const StepOutcome& s) const {
  StepRecord rec;
  rec.step = s.step;
  rec.loss = float(s.stats.loss);
  rec.lr = s.lr;
  rec.loss_scale = s.stats.loss_scale;
  rec.grad_norm = s.stats.scaled_norm / rec.loss_scale;
  rec.skipped = s.skipped;
  if (s.nonfinite)
    rec.nonfinite = s.nonfinite_where.empty() ? "elsewhere (another rank's micro-batch)" : s.nonfinite_where;
  rec.step_s = s.seconds;
  rec.comm_exposed_s = s.comm_exposed_s;
  rec.tokens = s.stats.tokens;
  rec.loss_tokens = s.stats.loss_tokens;
  rec.flops = s.stats.flops;
  rec.tokens_per_s = double(s.stats.tokens) / std::max(s.seconds, 1e-9);
  rec.samples_per_s = double(c_.global_batch_size) / std::max(s.seconds, 1e-9);
  rec.allocator = allocator_kind_name(c_.allocator);
  rec.planned_peak = planned_peak_;
  return rec;
}

MeasuredStep StepMeter::measure(const StepOutcome& s) {
  MeasuredStep m;
  m.timeline = observers_.end_step();  // before the dry run below, whose phases are not this step's
  m.record = record_of(s);
  StepRecord& rec = m.record;
  m.device = device_.stats();
  const Prediction& predicted = predictions_.of(s.shapes);
  // The dry run's requests replayed from the state this step started in: the reserved peak depends on what the
  // allocator has cached, and so, with the caching kind, does the allocated one (a large block is split only
  // when more than 1 MiB would remain, and an allocation counts its whole block).
  const ReplayPeaks at = replay(s.start, *predicted.requests, device_.capacity(), predicted.layout);
  rec.predicted_peak = at.peak_allocated;
  rec.predicted_reserved = at.peak_reserved;
  if (where_.gpu >= 0) {
    const CudaMemInfo g = cuda_memory_now(where_.gpu);
    rec.device_free = g.free_bytes, rec.device_total = g.total_bytes;
  }
  const MemoryStats& ms = m.device;
  m.mismatch =
      !s.skipped && (ms.allocated_bytes.peak != rec.predicted_peak || ms.reserved_bytes.peak != rec.predicted_reserved);
  if (m.mismatch)
    rec.warnings.push_back(
        str("[memory] WARNING step ", rec.step, where_.world > 1 ? str(" rank ", where_.rank) : std::string(),
            ": measured peak ", ms.allocated_bytes.peak, " B allocated / ", ms.reserved_bytes.peak,
            " B reserved differs from the dry run of this step's shapes, ", rec.predicted_peak, " B / ",
            rec.predicted_reserved, " B. The planner's prediction is exact by design on the CPU: this is a bug."));
  m.host = host_.stats();
  m.rss = host_rss_bytes();
  m.leak = log_.leak_check(rec.step, ms, m.host, m.rss);
  for (std::size_t at = 0; at < m.leak.size();) {
    const std::size_t nl = std::min(m.leak.find('\n', at), m.leak.size());
    rec.warnings.push_back(m.leak.substr(at, nl - at));
    at = nl + 1;
  }
  return m;
}

}  // namespace hr::train
