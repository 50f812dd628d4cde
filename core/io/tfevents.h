// TensorBoard event files: the TFRecord framing (length, masked CRC-32C of the length, data, masked CRC-32C of
// the data) around `Event` protocol buffers holding scalar summaries, as TensorBoard's own writers produce them.
// Written by hand: the three messages need a handful of protobuf fields, which is smaller than generated code.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace hr::core {

// CRC-32C (Castagnoli), and the masked form TFRecord stores.
uint32_t crc32c(const void* data, std::size_t size);
uint32_t masked_crc32c(const void* data, std::size_t size);

// One `Event` with wall_time, step and a Summary of simple_value scalars (or, with `file_version`, the
// header event every event file begins with), encoded as protobuf wire format.
std::string encode_scalar_event(double wall_time, int64_t step,
                                const std::vector<std::pair<std::string, float>>& values);
std::string encode_version_event(double wall_time, const std::string& file_version);
// A SessionLog START event at `step`: TensorBoard's loaders drop every event of the run's earlier files from that
// step on (PyTorch's SummaryWriter(purge_step=step) writes the same).
std::string encode_session_start_event(double wall_time, int64_t step);
// `data` framed as one TFRecord.
std::string tfrecord(const std::string& data);

// An event file in `dir` (created), named as TensorBoard names them: events.out.tfevents.<secs>.<host>.<pid>.0
// plus `suffix`. Every write is flushed, so a run that dies keeps its curves.
class EventWriter {
 public:
  explicit EventWriter(const std::string& dir, const std::string& suffix = "");
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;
  void scalars(int64_t step, const std::vector<std::pair<std::string, float>>& values);
  // This run writes from `step` on: what earlier runs in the directory wrote from there is to be dropped.
  void session_start(int64_t step);
  const std::string& path() const { return path_; }

 private:
  void write(const std::string& event);
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace hr::core
