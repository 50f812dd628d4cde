// A file that appears at its path complete or not at all: written to a temporary beside it, fsync'ed,
// renamed over the target, and the directory fsync'ed. Dropped without commit(), the temporary is removed.
#pragma once

#include <string>

namespace hr::core {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, std::size_t bytes);
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
};

}  // namespace hr::core
