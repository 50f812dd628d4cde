// What guards a training run while it runs: the stop signals that end it after a step with a checkpoint, and the
// lock that keeps a second run out of its output directory.
#pragma once

#include <array>
#include <csignal>
#include <string>

namespace hr::train {

// SIGTERM and SIGINT ask the run to stop after the current step with a checkpoint, the way cluster schedulers stop
// jobs (a grace period between SIGTERM and SIGKILL); a second signal ends it at once. Installed for the object's
// life; stop_signal() says which one came.
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

// The stop signal (SIGTERM, SIGINT) this process received while a StopSignals was installed, or 0.
int stop_signal();

// One writer per output directory: output_dir/.headroom.lock, locked (flock) for the object's life and holding
// the owner's host and pid. A second run on the directory is refused naming them; a run that dies (even by SIGKILL)
// lets the lock go with its file descriptor, so nothing is ever left locked.
class OutputDirLock {
 public:
  explicit OutputDirLock(const std::string& output_dir);
  ~OutputDirLock();
  OutputDirLock(const OutputDirLock&) = delete;
  OutputDirLock& operator=(const OutputDirLock&) = delete;
  static constexpr const char* kFile = ".headroom.lock";

 private:
  int fd_ = -1;
};

}  // namespace hr::train
