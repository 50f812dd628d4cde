// Command-line parsing shared by the sub-commands: a positional argument, --set key=value overrides,
// --flag value options and bare --flags.
#pragma once

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

inline Parsed parse(const std::vector<std::string>& args, const char* cmd, const std::set<std::string>& with_value,
                    const std::set<std::string>& flags) {
  Parsed p;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--set") {
      HR_CHECK(i + 1 < args.size(), "[", cmd, "] --set needs key=value");
      p.sets.push_back(args[++i]);
    } else if (a.rfind("--set=", 0) == 0) {
      p.sets.push_back(a.substr(6));
    } else if (with_value.count(a)) {
      HR_CHECK(i + 1 < args.size(), "[", cmd, "] ", a, " needs a value");
      p.options[a] = args[++i];
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

}  // namespace hr::train
