// The console line's formatting: the progress bar, the ETA, rates and exposed milliseconds.
#pragma once

#include <cstdint>
#include <string>

namespace hr::train {

// "[=====>      ]": `done` of `total` in 24 columns.
std::string bar(int64_t done, int64_t total);
// "42s", "3m05s", "1h02m": the ETA on the console line.
std::string format_duration(double seconds);
// "1234", "12.3", "0.0421": three significant digits below 100.
std::string format_rate(double v);
// "0.42 ms", "12.3 ms", "184 ms": exposed communication on the console line.
std::string format_ms(double seconds);

}  // namespace hr::train
