// TensorBoard event files.
#include "core/io/tfevents.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/check.h"

namespace hr::core {

namespace {

constexpr std::array<uint32_t, 256> crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected Castagnoli polynomial
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrcTable = crc_table();

void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  out.push_back(char(uint8_t(v)));
}
void key(std::string& out, int field, int wire_type) {
  varint(out, uint64_t(field) << 3 | uint64_t(wire_type));
}
template <typename T>
void fixed(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts only (x86-64, aarch64), as the wire format is
  out.append(b, sizeof(T));
}
void bytes_field(std::string& out, int field, const std::string& v) {
  key(out, field, 2);
  varint(out, v.size());
  out += v;
}

// An Event's wall_time and step, the fields before its payload.
std::string event_at(double wall_time, int64_t step) {
  std::string e;
  key(e, 1, 1);
  fixed(e, wall_time);
  key(e, 2, 0);
  varint(e, uint64_t(step));
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, std::size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < size; ++i) c = kCrcTable[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return ~c;
}

uint32_t masked_crc32c(const void* data, std::size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

// Event: 1 wall_time (double), 2 step (int64), 3 file_version (string), 5 summary (Summary), 7 session_log
// (SessionLog). Summary: 1 value (repeated Value). Value: 1 tag (string), 2 simple_value (float). SessionLog:
// 1 status (enum; START = 1).
std::string encode_scalar_event(double wall_time, int64_t step,
                                const std::vector<std::pair<std::string, float>>& values) {
  std::string summary;
  for (const auto& [tag, v] : values) {
    std::string value;
    bytes_field(value, 1, tag);
    key(value, 2, 5);
    fixed(value, v);
    bytes_field(summary, 1, value);
  }
  std::string e = event_at(wall_time, step);
  bytes_field(e, 5, summary);
  return e;
}

std::string encode_version_event(double wall_time, const std::string& file_version) {
  std::string e;
  key(e, 1, 1);
  fixed(e, wall_time);
  bytes_field(e, 3, file_version);
  return e;
}

std::string encode_session_start_event(double wall_time, int64_t step) {
  std::string log;
  key(log, 1, 0);
  varint(log, 1);  // SessionLog.START
  std::string e = event_at(wall_time, step);
  bytes_field(e, 7, log);
  return e;
}

std::string tfrecord(const std::string& data) {
  std::string r;
  const uint64_t n = data.size();
  fixed(r, n);
  fixed(r, masked_crc32c(&n, sizeof(n)));
  r += data;
  fixed(r, masked_crc32c(data.data(), data.size()));
  return r;
}

namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

EventWriter::EventWriter(const std::string& dir, const std::string& suffix) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  HR_CHECK(!ec, "[log] cannot create the TensorBoard directory ", dir, ": ", ec.message());
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  const double t = now_seconds();
  path_ = str(dir, "/events.out.tfevents.", int64_t(t), ".", host, ".", getpid(), ".0", suffix);
  file_ = std::fopen(path_.c_str(), "wb");
  HR_CHECK(file_, "[log] cannot open ", path_, ": ", std::strerror(errno));
  write(encode_version_event(t, "brain.Event:2"));
}

EventWriter::~EventWriter() {
  if (file_) std::fclose(file_);
}

void EventWriter::scalars(int64_t step, const std::vector<std::pair<std::string, float>>& values) {
  write(encode_scalar_event(now_seconds(), step, values));
}

void EventWriter::session_start(int64_t step) {
  write(encode_session_start_event(now_seconds(), step));
}

void EventWriter::write(const std::string& event) {
  const std::string r = tfrecord(event);
  HR_CHECK(std::fwrite(r.data(), 1, r.size(), file_) == r.size() && std::fflush(file_) == 0, "[log] cannot write ",
           path_, ": ", std::strerror(errno));
}

}  // namespace hr::core
