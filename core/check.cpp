// Out-of-line pieces of check.h: assertion failure and byte formatting.
#include "core/check.h"

#include <cmath>
#include <cstdio>
#include <string>

namespace hr {

void assert_fail(const char* cond, const char* file, int line, const std::string& msg) {
  throw Error(str("[internal] ", file, ":", line, ": assertion `", cond, "` failed", msg.empty() ? "" : ": ", msg));
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = std::fabs(bytes);
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[48];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%s%.0f B", bytes < 0 ? "-" : "", v);
  else
    std::snprintf(buf, sizeof buf, "%s%.2f %s", bytes < 0 ? "-" : "", v, units[u]);
  return buf;
}

std::size_t parse_bytes(const std::string& text, const std::string& what) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  double mul = 0;
  if (unit.empty() || unit == "B")
    mul = 1;
  else if (unit == "KiB" || unit == "K")
    mul = 1024.0;
  else if (unit == "MiB" || unit == "M")
    mul = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "G")
    mul = 1024.0 * 1024 * 1024;
  else if (unit == "TiB" || unit == "T")
    mul = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "KB")
    mul = 1e3;
  else if (unit == "MB")
    mul = 1e6;
  else if (unit == "GB")
    mul = 1e9;
  HR_CHECK(used > 0 && mul > 0 && v >= 0, "[", what, "] '", text,
           "' is not a size; write e.g. 64MiB, 2GiB, 40GB or a number of bytes");
  // Sizes are counted in int64 bytes: infinity, or 1e30GiB, would convert to garbage.
  HR_CHECK(v * mul < 9223372036854775807.0, "[", what, "] '", text, "' is more than 2^63 bytes");
  return std::size_t(v * mul);
}

}  // namespace hr
