// The console line's formatting.
#include "train/console_format.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace hr::train {

std::string bar(int64_t done, int64_t total) {
  const int width = 24;
  const int fill = int(double(done) / double(std::max<int64_t>(total, 1)) * width);
  std::string s(std::size_t(width + 2), ' ');
  s.front() = '[';
  s.back() = ']';
  for (int i = 0; i < fill && i < width; ++i) s[std::size_t(1 + i)] = '=';
  if (fill < width) s[std::size_t(1 + fill)] = '>';
  return s;
}

std::string format_duration(double seconds) {
  const int64_t s = int64_t(std::llround(std::max(seconds, 0.0)));
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof(buf), "%llds", (long long)s);
  else if (s < 3600)
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
  else
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", (long long)(s / 3600), (long long)(s / 60 % 60));
  return buf;
}

std::string format_rate(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), v >= 100 ? "%.0f" : "%.3g", v);
  return buf;
}

std::string format_ms(double seconds) {
  return format_rate(seconds * 1e3) + " ms";
}

}  // namespace hr::train
