// Command-line parsing shared by the sub-commands: a positional argument, --set key=value overrides,
// --flag value options and bare --flags.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/check.h"

namespace hr::train {

struct Parsed {
  std::string config;
  std::vector<std::string> sets;
  std::map<std::string, std::string> options;  // --flag value
  std::set<std::string> flags;                 // --flag
};

// `--flag value` or `--flag=value`. A flag whose next argument is another flag has no value: an error, not a value
// swallowed (`--checkpoint --set x=1` would take "--set" for the checkpoint). A value that begins with "--" is given
// as --flag=value.
inline Parsed parse(const std::vector<std::string>& args, const char* cmd, const std::set<std::string>& with_value,
                    const std::set<std::string>& flags) {
  Parsed p;
  auto value_of = [&](std::size_t& i, const std::string& flag) {
    HR_CHECK(i + 1 < args.size(), "[", cmd, "] ", flag, " needs a value");
    HR_CHECK(args[i + 1].rfind("--", 0) != 0, "[", cmd, "] ", flag, " needs a value; the next argument is the flag ",
             args[i + 1], " (write ", flag, "=VALUE for a value that begins with --)");
    return args[++i];
  };
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const std::size_t eq = a.rfind("--", 0) == 0 ? a.find('=') : std::string::npos;
    const std::string name = a.substr(0, eq);
    if (a == "--set") {
      p.sets.push_back(value_of(i, a));
    } else if (a.rfind("--set=", 0) == 0) {
      p.sets.push_back(a.substr(6));
    } else if (eq != std::string::npos && with_value.count(name)) {
      p.options[name] = a.substr(eq + 1);
    } else if (with_value.count(a)) {
      p.options[a] = value_of(i, a);
    } else if (flags.count(a)) {
      p.flags.insert(a);
    } else if (a.rfind("--", 0) != 0 && p.config.empty()) {
      p.config = a;
    } else {
      throw Error(str("[", cmd, "] unknown argument '", a, "'"));
    }
  }
  return p;
}

// A whole-number option in [lo, hi] (the fallback when absent), or an error naming the flag and the range: "abc",
// "-5" for a count, and values past 64 bits are refused instead of reaching std::stoll or wrapping.
inline int64_t integer_option(const Parsed& p, const char* cmd, const char* flag, int64_t fallback, int64_t lo,
                              int64_t hi) {
  const auto it = p.options.find(flag);
  if (it == p.options.end()) return fallback;
  std::size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(it->second, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  HR_CHECK(used > 0 && used == it->second.size() && v >= lo && v <= hi, "[", cmd, "] ", flag, " '", it->second,
           "' is not a whole number from ", lo, " to ", hi);
  return v;
}

// A finite number option in [lo, hi], or an error naming the flag and the range (nan, inf, "2" for a probability).
inline double number_option(const Parsed& p, const char* cmd, const char* flag, double fallback, double lo, double hi) {
  const auto it = p.options.find(flag);
  if (it == p.options.end()) return fallback;
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(it->second, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  HR_CHECK(used > 0 && used == it->second.size() && std::isfinite(v) && v >= lo && v <= hi, "[", cmd, "] ", flag, " '",
           it->second, "' is not a number from ", lo, " to ", hi);
  return v;
}

}  // namespace hr::train
