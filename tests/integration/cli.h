// Helpers for tests that run the headroom command: a fresh directory, running a command line, JSON lines.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace hr::testing_cli {

struct CmdResult {
  int status;  // as pclose returns it (0: success)
  std::string output;
};

inline std::string fresh_dir(const std::string& name) {
  const std::string d = testing::TempDir() + "/" + name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// Runs a shell command line with stderr folded into the output.
inline CmdResult run(const std::string& command) {
  CmdResult r{0, ""};
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, p)) r.output.append(buf, n);
  r.status = pclose(p);
  return r;
}

// Writes a config file into `dir` and returns its path.
inline std::string write_config(const std::string& dir, const std::string& text) {
  const std::string p = dir + "/config.in.yaml";
  std::ofstream(p) << text;
  return p;
}

inline std::vector<nlohmann::json> jsonl(const std::string& path) {
  std::vector<nlohmann::json> v;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) v.push_back(nlohmann::json::parse(line));
  return v;
}

}  // namespace hr::testing_cli
