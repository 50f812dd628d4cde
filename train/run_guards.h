// What guards a training run while it runs: the stop signals that end it after a step with a checkpoint.
#pragma once

#include <array>
#include <csignal>

namespace hr::train {

// SIGTERM and SIGINT ask the run to stop after the current step with a checkpoint, the way cluster schedulers stop
// jobs (a grace period between SIGTERM and SIGKILL); a second signal ends it at once. Installed for the object's
// life; stop_signal() (trainer.h) says which one came.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  static constexpr std::array<int, 2> kSignals = {SIGTERM, SIGINT};
  std::array<struct sigaction, 2> saved_{};
};

}  // namespace hr::train
