// One training step, from drawing its micro-batches to the optimizer update.
#include "train/step_runner.h"

#include <cmath>

#include "train/run_guards.h"

namespace hr::train {

using namespace hr::core;
using namespace hr::data;

std::vector<LoadedBatch> split_batch(const LoadedBatch& lb, int64_t parts, const RunConfig& c) {
  if (parts == 1) return {lb};
  std::vector<LoadedBatch> out;
  const int64_t n = int64_t(lb.examples.size()), per = (n + parts - 1) / parts;
  for (int64_t start = 0; start < n; start += per) {
    LoadedBatch b;
    b.examples.assign(lb.examples.begin() + start, lb.examples.begin() + std::min(n, start + per));
    for (const Example& e : b.examples) b.tokens += int64_t(e.ids.size());
    LoaderOptions o;
    o.pad_to_max_seq_len = c.pad_to_max_length;
    o.pad_to_multiple_of = c.pad_to_multiple_of;
    o.max_seq_len = c.max_seq_len;
    b.batch = collate(b.examples, batch_length(b.examples, o), c.model.config.ignore_index);
    out.push_back(std::move(b));
  }
  return out;
}

StepRunner::StepRunner(const RunConfig& c, Parts parts) : c_(c), p_(parts) {}

bool StepRunner::diverged() const {
  return c_.loss_scale_max_skips_at_min > 0 && skips_at_min_ >= c_.loss_scale_max_skips_at_min;
}

StepOutcome StepRunner::run(int64_t step, float lr) {
  const auto t0 = Clock::now();
  StepOutcome out;
  out.step = step;
  out.lr = lr;
  // The step's peaks start here, from the state the allocator is in: what it has cached depends on every earlier
  // step, evaluation and checkpoint, and so does the step's reserved peak.
  p_.device.reset_peak_stats();
  p_.host.reset_peak_stats();
  out.start = p_.device.snapshot();
  p_.observers.begin_step(step);
  const double exposed_at_start = p_.collectives.exposed_seconds();
  Drawn d;
  out.stats = forward_backward(d, out);
  update(d, out);
  out.shapes = d.shapes;
  for (const LoadedBatch& b : d.pending) out.unlearnable += b.no_labels_after_truncation;
  // The ranks agree inside the step, so that a rank waiting there for the others counts it in the step's time.
  out.stop_agreed = agree_on_stop();
  out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  out.comm_exposed_s = p_.collectives.exposed_seconds() - exposed_at_start;
  return out;
}

void StepRunner::draw(Drawn& d) {
  d.batches.push_back(p_.loader.next());
  for (LoadedBatch& b : split_batch(d.batches.back(), split_, c_)) d.pending.push_back(std::move(b));
}

Engine::StepStats StepRunner::forward_backward(Drawn& d, StepOutcome& out) {
  auto next = [&] {
    if (d.at == d.pending.size()) draw(d);
    LoadedBatch& lb = d.pending[d.at++];
    d.shapes.push_back(shape_of(lb.batch, c_));
    return lb;
  };
  const bool planned = c_.allocator == AllocatorKind::Planned;
  for (;;) {
    try {
      if (planned) {  // the step follows the plan of its shapes: every micro-batch is drawn first, to know them
        while (d.batches.size() < std::size_t(c_.gradient_accumulation_steps)) draw(d);
        StepShapes shapes;
        for (const LoadedBatch& lb : d.pending) shapes.push_back(shape_of(lb.batch, c_));
        p_.device.begin_stretch(p_.predictions.of(shapes).layout);
      }
      return p_.engine.step(next, c_.gradient_accumulation_steps * split_, p_.scaler.scale());
    } catch (const OutOfMemory&) {
      if (planned && p_.device.stretch_open()) p_.device.end_stretch();
      if (!shrink(d, out)) throw;
    }
  }
}

bool StepRunner::shrink(Drawn& d, StepOutcome& out) {
  const int64_t micro = c_.micro_batch_size / split_;
  const std::string snapshot = p_.observers.write_oom_snapshot();
  if (!snapshot.empty()) p_.console.oom_snapshot(snapshot);
  if (!c_.shrink_on_oom || micro <= 1) {
    p_.observers.end_step();
    return false;
  }
  split_ *= 2;
  p_.console.oom_halving(out.step, micro, c_.gradient_accumulation_steps * split_);
  ++out.oom_recoveries;
  p_.device.empty_cache();
  p_.device.reset_peak_stats();  // the step's peak is the redone step's; the OOM stays counted
  out.start = p_.device.snapshot();
  d.pending.clear();
  d.shapes.clear();
  d.at = 0;
  for (const LoadedBatch& b : d.batches)
    for (LoadedBatch& part : split_batch(b, split_, c_)) d.pending.push_back(std::move(part));
  return true;
}

// The loss scaler's verdict, clipping, the optimizer update. A non-finite loss or gradient in bf16/fp32 is
// diagnosed on the step's first micro-batch and skips the step.
void StepRunner::update(const Drawn& d, StepOutcome& out) {
  const Engine::StepStats& s = out.stats;
  const float grad_norm = s.scaled_norm / s.loss_scale;
  const bool overflow = !std::isfinite(s.scaled_norm);
  if (c_.precision == Precision::FP16) {
    const bool at_min = p_.scaler.scale() <= c_.loss_scale_min;  // the scale this step ran at could go no lower
    out.skipped = out.fp16_overflow = p_.scaler.update(overflow);
    skips_at_min_ = out.skipped && at_min ? skips_at_min_ + 1 : 0;
  } else if (overflow || !std::isfinite(s.loss)) {  // the same verdict on every rank: both are all-reduced
    out.nonfinite = out.skipped = true;
    ++nonfinite_steps_;
    out.nonfinite_where = p_.engine.diagnose_nonfinite(d.pending.front(), s.loss_scale / float(d.pending.size()));
  }
  if (out.skipped)
    p_.engine.skip_update();
  else
    p_.engine.update(out.lr, optim::clip_coefficient(grad_norm, c_.max_grad_norm) / s.loss_scale);
  if (c_.allocator == AllocatorKind::Planned) p_.device.end_stretch();
}

bool StepRunner::agree_on_stop() {
  const double mine = stop_signal() ? 1.0 : 0.0;
  return (p_.comm.world() > 1 ? p_.collectives.sum(mine) : mine) > 0;
}

}  // namespace hr::train
