// AtomicFile: temp + fsync + rename + directory fsync.
#include "core/io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/check.h"

namespace hr::core {

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  tmp_ = path_ + ".tmp." + std::to_string(::getpid());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  HR_CHECK(fd_ >= 0, "[io] cannot create ", tmp_, ": ", std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFile::write(const void* data, std::size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    HR_CHECK(n > 0, "[io] writing ", tmp_, " failed: ", std::strerror(errno));
    p += n;
    bytes -= std::size_t(n);
  }
}

void AtomicFile::commit() {
  HR_CHECK(::fsync(fd_) == 0, "[io] fsync of ", tmp_, " failed: ", std::strerror(errno));
  ::close(fd_);
  fd_ = -1;
  HR_CHECK(::rename(tmp_.c_str(), path_.c_str()) == 0, "[io] rename ", tmp_, " -> ", path_,
           " failed: ", std::strerror(errno));
  std::string dir = std::filesystem::path(path_).parent_path().string();
  int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace hr::core
