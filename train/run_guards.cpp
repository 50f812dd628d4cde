// Stop signals and the output directory's lock.
#include "train/run_guards.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/check.h"

namespace hr::train {

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void on_stop_signal(int sig) {
  if (g_stop_signal) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_stop_signal = sig;
}

std::string hostname() {
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 ? std::string(name) : std::string("?");
}

}  // namespace

int stop_signal() {
  return int(g_stop_signal);
}

StopSignals::StopSignals() {
  g_stop_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (std::size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &sa, &saved_[i]);
}

StopSignals::~StopSignals() {
  for (std::size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &saved_[i], nullptr);
}

OutputDirLock::OutputDirLock(const std::string& output_dir) {
  const std::string path = (std::filesystem::path(output_dir) / kFile).string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  HR_CHECK(fd_ >= 0, "[run] cannot open the lock file ", path, ": ", std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char owner[512] = {};
    const ssize_t n = ::pread(fd_, owner, sizeof owner - 1, 0);
    std::string who(owner, std::size_t(std::max<ssize_t>(n, 0)));
    while (!who.empty() && (who.back() == '\n' || who.back() == '\0')) who.pop_back();
    ::close(fd_);
    fd_ = -1;
    HR_CHECK(err != EWOULDBLOCK, "[run] ", output_dir, " is in use by another run (",
             who.empty() ? std::string("owner unknown") : who, "; lock ", path,
             "): two runs writing one output directory would overwrite each other's checkpoints and logs. Give "
             "this one another run.output_dir, or stop the other");
    throw Error(str("[run] cannot lock ", path, ": ", std::strerror(err)));
  }
  const std::string me = str("host ", hostname(), ", pid ", ::getpid(), "\n");
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != ssize_t(me.size()))
    std::fprintf(stderr, "[run] warning: could not write the owner into %s: %s\n", path.c_str(), std::strerror(errno));
}

OutputDirLock::~OutputDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock; the file stays (removing it would race a waiting run)
}

}  // namespace hr::train
