// Out-of-line pieces of check.h: assertion failure and byte formatting.
#include "core/check.h"

#include <cmath>
#include <cstdio>

namespace hr {

void assert_fail(const char* cond, const char* file, int line, const std::string& msg) {
  throw Error(str("[internal] ", file, ":", line, ": assertion `", cond, "` failed",
                  msg.empty() ? "" : ": ", msg));
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

}  // namespace hr
