// Checked appends to the run's JSON-lines logs, and their truncation to a resumed step.
#include "train/log_file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/io/atomic_file.h"

namespace hr::train {

LogFile::LogFile(std::string path) : path_(std::move(path)) {
  file_ = std::fopen(path_.c_str(), "a+");
  HR_CHECK(file_, "[log] cannot open ", path_, ": ", std::strerror(errno));
  // A run killed mid-line left a partial last line: the resumed run's lines start on a line of their own.
  if (std::fseek(file_, -1, SEEK_END) == 0 && std::fgetc(file_) != '\n') std::fputc('\n', file_);
}

LogFile::~LogFile() {
  if (file_) std::fclose(file_);
}

void LogFile::append(const std::string& lines, int64_t step) {
  if (failed_step_ >= 0) return;
  errno = 0;
  const bool written = std::fwrite(lines.data(), 1, lines.size(), file_) == lines.size() && std::fflush(file_) == 0;
  if (written) return;
  failed_step_ = step;
  error_ = errno ? std::strerror(errno) : "write failed";
  std::printf(
      "[log] warning: writing %s failed at step %lld (%s): the log is incomplete from there on; training "
      "goes on\n",
      path_.c_str(), (long long)step, error_.c_str());
  std::fflush(stdout);
}

std::string LogFile::incomplete() const {
  return failed_step_ < 0 ? std::string() : str(path_, " from step ", failed_step_, " on (", error_, ")");
}

int64_t drop_lines_after_step(const std::string& path, int64_t step) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return 0;
  std::ifstream in(path, std::ios::binary);
  std::string kept, line;
  int64_t dropped = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() > step) {
      ++dropped;
      continue;
    }
    if (!line.empty()) kept += line + "\n";
  }
  if (dropped == 0) return 0;
  core::AtomicFile f(path);
  f.write(kept.data(), kept.size());
  f.commit();
  return dropped;
}

}  // namespace hr::train
