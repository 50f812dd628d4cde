// Helpers for tests that run the headroom command: a fresh directory, running a command line, JSON lines.
#pragma once

#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

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

// Starts a shell command line in the background, its stdout and stderr into `output`; returns its pid.
inline pid_t spawn(const std::string& command, const std::string& output) {
  const std::string line = command + " > " + output + " 2>&1";
  const char* argv[] = {"/bin/sh", "-c", line.c_str(), nullptr};
  pid_t pid = -1;
  if (posix_spawn(&pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ) != 0) return -1;
  return pid;
}

// Waits until `path` has at least `lines` complete lines (false after `seconds`).
inline bool wait_for_lines(const std::string& path, std::size_t lines, int seconds) {
  for (int i = 0; i < seconds * 20; ++i) {
    std::ifstream in(path);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (std::size_t(std::count(text.begin(), text.end(), '\n')) >= lines) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// The ranks an mpirun started as `launcher` runs: its children running `headroom train`.
inline std::vector<pid_t> ranks_of(pid_t launcher) {
  const CmdResult ps = run("pgrep -P " + std::to_string(launcher) + " -f 'headroom train'");
  std::vector<pid_t> ranks;
  std::istringstream in(ps.output);
  for (pid_t p; in >> p;) ranks.push_back(p);
  return ranks;
}

// How a job ended after one of its ranks got a signal.
struct JobEnd {
  bool ended = false;  // within the time given (otherwise the launcher and every rank were killed)
  int status = 0;      // the launcher's, as waitpid gives it
  double seconds = 0;  // from the signal to the launcher's end
};

// Sends `sig` to `ranks[victim]` and waits up to `seconds` for the launcher to end.
inline JobEnd signal_rank(pid_t launcher, const std::vector<pid_t>& ranks, std::size_t victim, int sig, int seconds) {
  JobEnd e;
  const auto t0 = std::chrono::steady_clock::now();
  if (kill(ranks.at(victim), sig) != 0) return e;
  pid_t done = 0;
  while ((done = waitpid(launcher, &e.status, WNOHANG)) == 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(seconds))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  e.ended = done != 0;
  if (!e.ended) {
    kill(launcher, SIGKILL);
    for (pid_t p : ranks) kill(p, SIGKILL);
    waitpid(launcher, &e.status, 0);
  }
  return e;
}

// Whether process `pid` is gone (or a zombie).
inline bool process_gone(pid_t pid) {
  return ::kill(pid, 0) != 0 || run("ps -o stat= -p " + std::to_string(pid)).output.find('Z') != std::string::npos;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace hr::testing_cli
