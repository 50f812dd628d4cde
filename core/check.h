// Errors and invariants: user errors throw hr::Error with the op or key in brackets; internal invariants use HR_ASSERT.
#pragma once

#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>

namespace hr {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Concatenates anything streamable: str("[matmul] shape ", a, " vs ", b).
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

[[noreturn]] void assert_fail(const char* cond, const char* file, int line, const std::string& msg);

constexpr std::size_t operator""_KiB(unsigned long long v) {
  return v << 10;
}
constexpr std::size_t operator""_MiB(unsigned long long v) {
  return v << 20;
}
constexpr std::size_t operator""_GiB(unsigned long long v) {
  return v << 30;
}

// "1.50 MiB", "512 B": bytes in the unit a reader expects.
std::string format_bytes(double bytes);

// Parses "64MiB", "2GiB", "512KiB", "40GB", "1000" (bytes); throws naming `what` on anything else.
std::size_t parse_bytes(const std::string& text, const std::string& what);

}  // namespace hr

#define HR_ASSERT(cond, ...)                                                           \
  do {                                                                                 \
    if (!(cond)) ::hr::assert_fail(#cond, __FILE__, __LINE__, ::hr::str(__VA_ARGS__)); \
  } while (0)

#define HR_CHECK(cond, ...)                                 \
  do {                                                      \
    if (!(cond)) throw ::hr::Error(::hr::str(__VA_ARGS__)); \
  } while (0)
