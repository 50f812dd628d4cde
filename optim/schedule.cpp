// Schedules, clipping and the dynamic loss scaler.
#include "optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace hr::optim {

ScheduleKind parse_schedule(const std::string& s) {
  if (s == "cosine") return ScheduleKind::Cosine;
  if (s == "linear") return ScheduleKind::Linear;
  if (s == "constant") return ScheduleKind::Constant;
  throw Error(str("[config] train.lr_scheduler_type '", s, "' is not one of: cosine, linear, constant"));
}

float Schedule::lr(int64_t step) const {
  if (step < warmup_steps) return peak_lr * float(step + 1) / float(warmup_steps + 1);
  if (kind == ScheduleKind::Constant) return peak_lr;
  const double progress =
      std::clamp(double(step - warmup_steps) / double(std::max<int64_t>(1, total_steps - warmup_steps)), 0.0, 1.0);
  if (kind == ScheduleKind::Linear) return float(peak_lr * (1.0 - progress));
  return float(peak_lr * 0.5 * (1.0 + std::cos(M_PI * progress)));
}

float clip_coefficient(float grad_norm, float max_norm) {
  if (max_norm <= 0.f || !(grad_norm > max_norm)) return 1.f;
  return max_norm / (grad_norm + 1e-6f);
}

LossScaler::LossScaler(float initial, int64_t window, int hysteresis, float min_scale)
    : scale_(initial), min_scale_(min_scale), window_(window), hysteresis_(hysteresis), hysteresis_left_(hysteresis) {}

bool LossScaler::update(bool overflow) {
  if (overflow) {
    if (hysteresis_ == 1 || hysteresis_left_ == 1)
      scale_ = std::max(scale_ / 2.f, min_scale_);
    else
      --hysteresis_left_;
    last_overflow_ = iter_;
  } else if ((iter_ - last_overflow_) % window_ == 0) {
    hysteresis_left_ = hysteresis_;
    scale_ *= 2.f;
  }
  ++iter_;
  return overflow;
}

void LossScaler::load(const State& s) {
  scale_ = s.scale;
  iter_ = s.iter;
  last_overflow_ = s.last_overflow;
  hysteresis_left_ = s.hysteresis_left;
}

}  // namespace hr::optim
