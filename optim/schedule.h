// Learning-rate schedules with warmup (as transformers' get_{cosine,linear,constant}_schedule_with_warmup),
// gradient clipping, and DeepSpeed's dynamic loss scaler for fp16.
#pragma once

#include <cstdint>
#include <string>

namespace hr::optim {

enum class ScheduleKind : uint8_t { Cosine, Linear, Constant };
ScheduleKind parse_schedule(const std::string& s);  // cosine | linear | constant

struct Schedule {
  ScheduleKind kind = ScheduleKind::Cosine;
  float peak_lr = 1e-3f;
  int64_t warmup_steps = 0, total_steps = 1;
  // Learning rate of the (0-based) optimizer step: linear warmup from 0, then the decay to 0 at total_steps.
  float lr(int64_t step) const;
};

// Coefficient that brings the global gradient norm down to max_norm (1 when below or max_norm <= 0).
float clip_coefficient(float grad_norm, float max_norm);

// DeepSpeed's DynamicLossScaler: on overflow the step is skipped and, once `hysteresis` overflows have been
// absorbed, the scale halves (not below min_scale); after `window` clean steps it doubles.
class LossScaler {
 public:
  LossScaler(float initial = 65536.f, int64_t window = 1000, int hysteresis = 2, float min_scale = 1.f);
  float scale() const { return scale_; }
  // Records the result of a step; returns true when the step must be skipped (overflow).
  bool update(bool overflow);
  // For checkpoints.
  struct State {
    float scale;
    int64_t iter, last_overflow;
    int hysteresis_left;
  };
  State state() const { return {scale_, iter_, last_overflow_, hysteresis_left_}; }
  void load(const State& s);

 private:
  float scale_, min_scale_;
  int64_t window_, iter_ = 0, last_overflow_ = -1;
  int hysteresis_, hysteresis_left_;
};

}  // namespace hr::optim
