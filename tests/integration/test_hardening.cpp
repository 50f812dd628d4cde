// Hostile but realistic use of the headroom command (issue #38): each test is a case that once got through, and
// checks that it is now refused by name, or survived, as README "Robustness" says.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/io/safetensors.h"
#include "integration/cli.h"

using namespace hr;
namespace fs = std::filesystem;
using json = nlohmann::json;
using testing_cli::CmdResult;
using testing_cli::jsonl;

namespace {

std::string fresh(const std::string& name) {
  return testing_cli::fresh_dir("hardening_" + name);
}

std::string config(const std::string& dir, const std::string& extra = "") {
  return testing_cli::write_config(dir, testing_cli::kTinyTrainConfig + extra);
}

CmdResult headroom(const std::string& args) {
  return testing_cli::run(std::string(HR_HEADROOM_BIN) + " " + args);
}

// `headroom train` of the tiny config into `dir`.
std::string train_in(const std::string& dir) {
  return "train " + config(dir) + " --set run.output_dir=" + dir;
}

// The process's exit code; a death by signal N reads 128 + N, as the shell reports it.
int exit_code(const CmdResult& r) {
  return WIFEXITED(r.status) ? WEXITSTATUS(r.status) : 128 + WTERMSIG(r.status);
}

bool says(const CmdResult& r, const std::string& text) {
  return r.output.find(text) != std::string::npos;
}

}  // namespace

// 1. A finished run resumed (a requeued job, a wrapper that always passes --resume) saves its last step again. The
// old checkpoint-N was deleted before the new one was renamed into place: a kill in between left no checkpoint-N,
// and the next --resume went back to an older one. The new one is swapped in first and the old one deleted after;
// a save killed after its files were whole is finished by the next resume. Killed here at each rename of the swap
// (also where RENAME_EXCHANGE is missing), the next resume always starts from step 4.
TEST(Hardening, ResavingAFinishedRunsLastCheckpointNeverLosesIt) {
  const std::string d = fresh("resave");
  const std::string run = train_in(d) + " --set train.max_steps=4 --set train.save_steps=2";
  const CmdResult first = headroom(run);
  ASSERT_EQ(first.status, 0) << first.output;
  ASSERT_TRUE(fs::exists(d + "/checkpoint-2") && fs::exists(d + "/checkpoint-4"));
  const std::string preload =
      std::string("ASAN_OPTIONS=${ASAN_OPTIONS:-}:verify_asan_link_order=0 LD_PRELOAD=") + HR_KILL_ON_RENAME + " ";
  const std::vector<std::string> kill_points = {
      "HR_KILL_AT_RENAME_TO=checkpoint-4",                          // the new checkpoint-4 going into place
      "HR_KILL_AT_RENAME_TO=checkpoint-4 HR_NO_RENAME_EXCHANGE=1",  // the same where the swap takes two renames
      "HR_KILL_AT_RENAME_FROM=.complete-checkpoint-4 HR_KILL_AT_RENAME_TO=.trash-.complete-checkpoint-4",  // after
  };
  for (const std::string& point : kill_points) {
    const CmdResult killed = testing_cli::run(preload + point + " " + HR_HEADROOM_BIN + " " + run + " --resume");
    ASSERT_TRUE(says(killed, "kill_on_rename: SIGKILL before the rename")) << point << ":\n" << killed.output;
    EXPECT_EQ(exit_code(killed), 128 + SIGKILL) << killed.output;
    const CmdResult resumed = headroom(run + " --resume");
    ASSERT_EQ(resumed.status, 0) << point << ":\n" << resumed.output;
    EXPECT_TRUE(says(resumed, "resumed from " + d + "/checkpoint-4 at step 4")) << point << ":\n" << resumed.output;
    EXPECT_TRUE(fs::exists(d + "/checkpoint-4/model.safetensors")) << point;
    EXPECT_TRUE(fs::exists(d + "/checkpoint-2/model.safetensors")) << point;
    for (const auto& e : fs::directory_iterator(d))
      EXPECT_EQ(e.path().filename().string().rfind(".", 0) == 0 && e.is_directory(), false)
          << point << ": " << e.path() << " left behind";
  }
}
