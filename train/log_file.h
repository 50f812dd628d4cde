// The run's JSON-lines logs (memory.jsonl, eval.jsonl, eval_predictions.jsonl): appended line by line, every write
// checked. A write that fails (a full disk, a quota) warns once naming the log and the step it is incomplete from,
// and the run goes on; the end of the run names the logs that are incomplete. A resumed run first drops the lines
// of the steps after its checkpoint, which it writes again, so that a reader sees every step once.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace hr::train {

class LogFile {
 public:
  // Opens `path` for appending, creating it. A run killed mid-line left a partial last line: it is ended.
  explicit LogFile(std::string path);
  ~LogFile();
  LogFile(const LogFile&) = delete;
  LogFile& operator=(const LogFile&) = delete;

  // Appends `lines` (each ending in '\n') of step `step`, flushed. After a failed write, nothing more is written.
  void append(const std::string& lines, int64_t step);
  bool complete() const { return failed_step_ < 0; }
  // "memory.jsonl from step 5 on (No space left on device)"; "" while complete.
  std::string incomplete() const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  int64_t failed_step_ = -1;
  std::string error_;
};

// Keeps the lines of the JSON-lines file `path` whose "step" is at most `step` (lines without one, or that do not
// parse, stay); returns how many went. The file is rewritten atomically, and only when a line goes. Nothing when it
// does not exist or is not a regular file.
int64_t drop_lines_after_step(const std::string& path, int64_t step);

}  // namespace hr::train
