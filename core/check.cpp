// Out-of-line pieces of check.h: assertion failure and byte formatting.
#include "core/check.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

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
  // Binary units as PyTorch and DeepSpeed write them, decimal ones as disks are sold.
  static constexpr std::pair<const char*, double> kUnits[] = {{"", 1.0},
                                                              {"B", 1.0},
                                                              {"KiB", 1024.0},
                                                              {"K", 1024.0},
                                                              {"MiB", 1048576.0},
                                                              {"M", 1048576.0},
                                                              {"GiB", 1073741824.0},
                                                              {"G", 1073741824.0},
                                                              {"TiB", 1099511627776.0},
                                                              {"T", 1099511627776.0},
                                                              {"KB", 1e3},
                                                              {"MB", 1e6},
                                                              {"GB", 1e9}};
  const std::string unit = text.substr(used);
  double mul = 0;
  for (const auto& [name, factor] : kUnits)
    if (unit == name) mul = factor;
  HR_CHECK(used > 0 && mul > 0 && v >= 0, "[", what, "] '", text,
           "' is not a size; write e.g. 64MiB, 2GiB, 40GB or a number of bytes");
  // Sizes are counted in int64 bytes: infinity, or 1e30GiB, would convert to garbage.
  HR_CHECK(v * mul < 9223372036854775807.0, "[", what, "] '", text, "' is more than 2^63 bytes");
  return std::size_t(v * mul);
}

}  // namespace hr
