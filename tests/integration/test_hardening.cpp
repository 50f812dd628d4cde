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

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The tensors of every safetensors file in the checkpoint directories of `dir` that hold a NaN or an infinity.
std::vector<std::string> nonfinite_in_checkpoints(const std::string& dir, int* checkpoints) {
  std::vector<std::string> bad;
  *checkpoints = 0;
  for (const auto& c : fs::directory_iterator(dir)) {
    if (c.path().filename().string().rfind("checkpoint-", 0) != 0) continue;
    ++*checkpoints;
    for (const auto& f : fs::recursive_directory_iterator(c.path())) {
      if (f.path().extension() != ".safetensors") continue;
      const core::SafetensorsFile file = core::SafetensorsFile::open(f.path().string());
      for (const std::string& name : file.names()) {
        const core::Tensor t = file.get(name);
        if (!core::is_float(t.dtype())) continue;
        for (float v : t.to_floats())
          if (!std::isfinite(v)) {
            bad.push_back(f.path().string() + ":" + name);
            break;
          }
      }
    }
  }
  return bad;
}

void edit_json(const std::string& path, const std::function<void(json&)>& edit) {
  json j = json::parse(std::ifstream(path));
  edit(j);
  std::ofstream(path) << j.dump(2);
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

// 2. A diverged fp16 run (a learning rate of 1e4): every step overflowed, the scale sat at its minimum, the run
// exited 0, and its checkpoints held non-finite tensors while rotation deleted the good ones. It now stops after
// memory.loss_scale.max_skips_at_min steps in a row overflow at the minimum scale, naming it, and no checkpoint
// holding a non-finite tensor is ever written.
TEST(Hardening, ADivergedFp16RunStopsAndNeverSavesNonFiniteWeights) {
  const std::string diverge =
      " --set memory.precision=fp16 --set train.learning_rate=1e4 --set train.warmup_steps=0"
      " --set memory.loss_scale.initial=4 --set train.max_steps=40";
  const std::string a = fresh("fp16_diverged");
  const CmdResult stopped = headroom(train_in(a) + diverge + " --set train.save_steps=0");
  EXPECT_EQ(exit_code(stopped), 1) << stopped.output;
  EXPECT_TRUE(says(stopped, "[fp16] stopped at step ")) << stopped.output;
  EXPECT_TRUE(says(stopped, "2 steps in a row overflowed at the minimum loss scale 1 (memory.loss_scale.min"))
      << stopped.output;
  EXPECT_LT(jsonl(a + "/memory.jsonl").size(), 20u) << "stopped soon after the scale reached its minimum";
  int checkpoints = 0;
  EXPECT_TRUE(nonfinite_in_checkpoints(a, &checkpoints).empty());
  EXPECT_EQ(checkpoints, 0);

  // A learning rate of 1e5 takes fp16 weights past 65504 (infinite) at the first step. With a good checkpoint of
  // step 2 and save_total_limit 1, the save of step 3 is refused by name, and rotation never deletes the good one.
  const std::string b = fresh("fp16_diverged_saves");
  const std::string run = train_in(b) +
                          " --set memory.precision=fp16 --set train.save_steps=1 --set "
                          "train.save_total_limit=1 --set train.warmup_steps=0";
  const CmdResult good = headroom(run + " --set train.max_steps=2");
  ASSERT_EQ(good.status, 0) << good.output;
  const CmdResult saving = headroom(run + " --set train.max_steps=6 --set train.learning_rate=1e5 --resume");
  EXPECT_EQ(exit_code(saving), 1) << saving.output;
  EXPECT_TRUE(says(saving, "[checkpoint] not writing checkpoint-3: parameter ")) << saving.output;
  EXPECT_TRUE(says(saving, "is not finite (the run diverged); the last checkpoint, " + b + "/checkpoint-2, is kept"))
      << saving.output;
  EXPECT_TRUE(fs::exists(b + "/checkpoint-2/model.safetensors"));
  const std::vector<std::string> bad = nonfinite_in_checkpoints(b, &checkpoints);
  EXPECT_TRUE(bad.empty()) << bad.size() << " non-finite tensors, the first " << bad.front();
  EXPECT_EQ(checkpoints, 1);
}

// 3. Model sizes are checked when the config loads, naming the key: an intermediate_size of 0 ended `train` and
// `plan` with SIGFPE, from the YAML and from a config.json alike; a layer count no device holds is refused by the
// planner's arithmetic in moments instead of building the model in host memory.
TEST(Hardening, ModelSizesAreCheckedNamingTheKey) {
  const std::string d = fresh("sizes");
  for (const std::string cmd : {"train", "plan"}) {
    const CmdResult r =
        headroom(cmd + " " + config(d) + " --set run.output_dir=" + d + " --set model.llm.intermediate_size=0");
    EXPECT_EQ(exit_code(r), 1) << cmd << ": " << r.output;
    EXPECT_TRUE(says(r, "model.llm.intermediate_size 0 must be positive")) << cmd << ": " << r.output;
  }
  // A Hugging Face directory whose config.json says it: a checkpoint's, edited.
  const CmdResult t = headroom(train_in(d) + " --set train.max_steps=1");
  ASSERT_EQ(t.status, 0) << t.output;
  const std::string hf = d + "/hf";
  fs::create_directories(hf);
  fs::copy_file(d + "/checkpoint-1/config.json", hf + "/config.json");
  edit_json(hf + "/config.json", [](json& j) { j["text_config"]["intermediate_size"] = 0; });
  const std::string cfg = testing_cli::write_config(d, "model:\n  name_or_path: " + hf + "\n");
  const CmdResult from_json = headroom("plan " + cfg);
  EXPECT_EQ(exit_code(from_json), 1) << from_json.output;
  EXPECT_TRUE(says(from_json, "[hf] " + hf + "/config.json: text_config.intermediate_size 0 must be positive"))
      << from_json.output;
  const auto t0 = std::chrono::steady_clock::now();
  const CmdResult layers = headroom("plan " + config(d) + " --set model.llm.num_hidden_layers=100000000");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(exit_code(layers), 1) << layers.output;
  EXPECT_TRUE(says(layers, "[plan] model.llm.num_hidden_layers 100000000")) << layers.output;
  EXPECT_TRUE(says(layers, "no plan can fit")) << layers.output;
  EXPECT_LT(seconds, 10.0) << "refused by arithmetic, not by building the model";
}

// 5. trainer_state.json is checked against its types and the run's data: a negative epoch segfaulted, a huge offset
// threw bad_alloc out of a loader thread, a step of 1e30 resumed at step -9.2e18. Each is an error naming the file.
TEST(Hardening, AResumedTrainerStateIsCheckedNamingTheFile) {
  const std::string d = fresh("trainer_state");
  const std::string run = train_in(d) + " --set train.max_steps=2 --set train.save_steps=2";
  const CmdResult first = headroom(run);
  ASSERT_EQ(first.status, 0) << first.output;
  const std::string state = d + "/checkpoint-2/trainer_state.json";
  const std::string good = testing_cli::read_file(state);
  struct Case {
    std::function<void(json&)> edit;
    std::string says;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j["loader"]["epoch"] = -1; }, "loader.epoch -1 is not a whole number"},
      {[](json& j) { j["loader"]["offset"] = 1000000000000LL; }, "loader.offset 1000000000000 is past the end of"},
      {[](json& j) { j["step"] = 1e30; }, "step 1e+30 is not a whole number"},
      {[](json& j) { j["loss_scaler"]["scale"] = -1; }, "loss_scaler.scale -1 is not a positive finite number"},
  };
  for (const Case& c : cases) {
    edit_json(state, c.edit);
    const CmdResult r = headroom(run + " --set train.max_steps=4 --resume");
    EXPECT_EQ(exit_code(r), 1) << r.output;
    EXPECT_TRUE(says(r, "[checkpoint] " + state + ": " + c.says)) << r.output;
    std::ofstream(state) << good;
  }
}

// 7. Evaluation follows data.on_bad_sample as training does: an evaluation set of one truncated PNG printed
// "accuracy 0% over 0 samples" and exited 0 under `fail`, and in a mixed file the bad samples were neither named
// nor counted.
TEST(Hardening, EvaluationNamesCountsAndStopsOnBadSamplesAsTrainingDoes) {
  const std::string d = fresh("eval_bad");
  const CmdResult synth = headroom("data synth --out " + d + "/data --train 8 --eval 2 --image-size 8");
  ASSERT_EQ(synth.status, 0) << synth.output;
  std::string png;
  for (const auto& e : fs::directory_iterator(d + "/data/images")) png = e.path().string();
  const std::string bytes = testing_cli::read_file(png);
  std::ofstream(d + "/data/images/truncated.png", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  json eval = json::parse(std::ifstream(d + "/data/eval.json"));
  json bad = eval[0];
  bad["id"] = "broken";
  bad["image"] = "images/truncated.png";
  std::ofstream(d + "/data/only_bad.json") << json::array({bad}).dump();
  std::ofstream(d + "/data/mixed.json") << json::array({bad, eval[0], eval[1]}).dump();
  const std::string data = " --set data.train_json=" + d + "/data/train.json --set data.image_folder=" + d + "/data";
  const CmdResult t = headroom("train " + config(d) + " --set run.output_dir=" + d + "/run" + data +
                               " --set data.eval_json=" + d + "/data/mixed.json --set train.max_steps=2");
  ASSERT_EQ(t.status, 0) << t.output;
  EXPECT_TRUE(says(t, "skipped bad evaluation sample: [data] " + d + "/data/mixed.json[0] (id broken)")) << t.output;
  EXPECT_EQ(jsonl(d + "/run/eval.jsonl").back()["skipped"], 1);
  EXPECT_EQ(jsonl(d + "/run/eval.jsonl").back()["samples"], 2);

  const std::string eval_cmd = "eval " + config(d) + " --set run.output_dir=" + d + "/run" + data + " --checkpoint " +
                               d + "/run/checkpoint-2 --set data.eval_json=" + d + "/data/";
  const CmdResult fail = headroom(eval_cmd + "only_bad.json --set data.on_bad_sample=fail");
  EXPECT_EQ(exit_code(fail), 1) << fail.output;
  EXPECT_TRUE(says(fail, d + "/data/only_bad.json[0] (id broken)")) << fail.output;
  EXPECT_TRUE(says(fail, "(data.on_bad_sample: fail)")) << fail.output;
  const CmdResult none = headroom(eval_cmd + "only_bad.json");
  EXPECT_EQ(exit_code(none), 1) << none.output;
  EXPECT_TRUE(says(none, "no usable sample in " + d + "/data/only_bad.json (1 of 1 skipped")) << none.output;
  const CmdResult mixed = headroom(eval_cmd + "mixed.json");
  EXPECT_EQ(mixed.status, 0) << mixed.output;
  EXPECT_TRUE(says(mixed, "skipped bad sample: [data] " + d + "/data/mixed.json[0] (id broken)")) << mixed.output;
  EXPECT_TRUE(says(mixed, "over 2 samples (1 bad samples skipped")) << mixed.output;
}

// 8. A log write that fails (here every write of memory.jsonl and eval.jsonl, on /dev/full) warned of nothing:
// memory.jsonl kept 4 lines of 150. The run now warns once per log, trains on, and names the incomplete logs.
TEST(Hardening, ALogOnAFullDiskWarnsOnceAndTrainingGoesOn) {
  const std::string d = fresh("full_disk_log");
  std::error_code ec;
  fs::create_symlink("/dev/full", d + "/memory.jsonl", ec);
  fs::create_symlink("/dev/full", d + "/eval.jsonl", ec);
  ASSERT_FALSE(ec) << ec.message();
  const CmdResult r = headroom(train_in(d) + " --set train.max_steps=4");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(count_of(r.output, "[log] warning: writing " + d + "/memory.jsonl failed at step 1"), 1u) << r.output;
  EXPECT_EQ(count_of(r.output, "[log] warning: writing"), 2u) << "once per log:\n" << r.output;
  EXPECT_TRUE(says(r, "incomplete log: " + d + "/memory.jsonl from step 1 on (No space left on device)")) << r.output;
  EXPECT_TRUE(says(r, "incomplete log: " + d + "/eval.jsonl from step 4 on")) << r.output;
  EXPECT_TRUE(says(r, "step 4/4")) << r.output;
  EXPECT_TRUE(fs::exists(d + "/checkpoint-4/model.safetensors"));
}

// 8. After a run killed past its last checkpoint, --resume wrote the steps after the checkpoint again below the
// first run's: memory.jsonl (and eval.jsonl) now go back to the checkpoint's step first, so every step is read once.
TEST(Hardening, AResumedRunsLogsHoldEachStepOnce) {
  const std::string d = fresh("resume_logs");
  const std::string run = train_in(d) + " --set train.max_steps=4 --set train.save_steps=2 --set train.eval_steps=3";
  const CmdResult first = headroom(run);
  ASSERT_EQ(first.status, 0) << first.output;
  fs::remove_all(d + "/checkpoint-4");  // as if killed after step 4, before its checkpoint
  const CmdResult resumed = headroom(run + " --resume");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_TRUE(says(resumed, d + "/memory.jsonl: dropped 2 lines of steps after 2")) << resumed.output;
  std::vector<int64_t> steps, evals;
  for (const json& l : jsonl(d + "/memory.jsonl")) steps.push_back(l["step"]);
  for (const json& l : jsonl(d + "/eval.jsonl")) evals.push_back(l["step"]);
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(evals, (std::vector<int64_t>{3, 4}));
}

// 9. Arguments no run can mean: generate's sampling options, an empty --set value for a directory, and a flag whose
// value was left out (it swallowed the next flag).
TEST(Hardening, ArgumentsNoRunCanMeanAreRefusedByName) {
  const std::string d = fresh("arguments");
  const std::string generate = "generate " + config(d) + " --set run.output_dir=" + d + " --checkpoint " + d + "/none";
  for (const auto& [flag, want] : std::vector<std::pair<std::string, std::string>>{
           {" --temperature nan", "[generate] --temperature 'nan' is not a number"},
           {" --top-p 2", "[generate] --top-p '2' is not a number from 0 to 1"},
           {" --top-k -5", "[generate] --top-k '-5' is not a whole number from 0"},
           {" --max-new-tokens 0", "[generate] --max-new-tokens '0' is not a whole number from 1"}}) {
    const CmdResult r = headroom(generate + flag);
    EXPECT_EQ(exit_code(r), 1) << flag << ": " << r.output;
    EXPECT_TRUE(says(r, want)) << flag << ": " << r.output;
  }
  const CmdResult empty =
      testing_cli::run("cd " + d + " && " + HR_HEADROOM_BIN + " train " + config(d) + " --set run.output_dir=");
  EXPECT_EQ(exit_code(empty), 1) << empty.output;
  EXPECT_TRUE(says(empty, "[config] run.output_dir: ")) << empty.output;
  EXPECT_FALSE(fs::exists(d + "/null"));
  const CmdResult swallowed = headroom("eval " + config(d) + " --checkpoint --set train.max_steps=1");
  EXPECT_EQ(exit_code(swallowed), 1) << swallowed.output;
  EXPECT_TRUE(says(swallowed, "[eval] --checkpoint needs a value; the next argument is the flag --set"))
      << swallowed.output;
  const CmdResult epochs = headroom(train_in(d) + " --set train.max_steps=0 --set train.num_train_epochs=.inf");
  EXPECT_EQ(exit_code(epochs), 1) << epochs.output;
  EXPECT_TRUE(says(epochs, "[config] train.num_train_epochs: '.inf' is not a finite number > 0")) << epochs.output;
}

// 10. A data.max_seq_len that cuts the text before the image kept the pixels without their placeholders, and
// training stopped ("input_ids hold placeholders for 0 images but pixel_values has 4"). The image is dropped with
// them, as LLaVA truncates and trains on; the drops are counted, and a batch left with no label is warned about.
TEST(Hardening, ACutBeforeTheImageDropsItAndTrainingGoesOn) {
  const std::string d = fresh("truncation");
  // Vicuna's system prompt is longer than 16 tokens: the cut comes before "USER: <image>".
  const CmdResult r =
      headroom(train_in(d) + " --set train.max_steps=2 --set data.system_prompt=default --set data.max_seq_len=16");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(says(r, "warning: step 1: data.max_seq_len 16 cut off every answer of a micro-batch")) << r.output;
  EXPECT_TRUE(says(r, "warning: step 1: data.max_seq_len 16 cut a sample before its image's placeholders")) << r.output;
  EXPECT_TRUE(says(r, "16 images dropped with their placeholders by data.max_seq_len 16")) << r.output;
  EXPECT_TRUE(says(r, "4 micro-batches had no label left after data.max_seq_len 16 cut them")) << r.output;
  for (const json& l : jsonl(d + "/memory.jsonl")) EXPECT_EQ(l["loss"].get<double>(), 0.0) << "nothing to learn";
}

// 12. Errors that named neither the file nor the key: a directory given for a file, a checkpoint without its
// model.safetensors, `data synth` counts that are not counts, and DeepSpeed values past what the keys hold.
TEST(Hardening, ErrorsNameTheFileOrTheKey) {
  const std::string d = fresh("named_errors");
  fs::create_directories(d + "/adir");
  const std::string adir = d + "/adir";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"train " + adir, "[config] " + adir + ": is a directory, not a file"},
      {train_in(d) + " --deepspeed " + adir, "[deepspeed] " + adir + ": is a directory, not a file (--deepspeed)"},
      {train_in(d) + " --set data.train_json=" + adir, "[data] " + adir + ": is a directory, not a file"},
      {"data synth --out " + d + "/synth --train abc", "[data synth] --train 'abc' is not a whole number from 1"},
      {"data synth --out " + d + "/synth --train -5", "[data synth] --train '-5' is not a whole number from 1"},
  };
  for (const auto& [cmd, want] : cases) {
    const CmdResult r = headroom(cmd);
    EXPECT_EQ(exit_code(r), 1) << cmd << ": " << r.output;
    EXPECT_TRUE(says(r, want)) << cmd << ": " << r.output;
  }
  EXPECT_FALSE(fs::exists(d + "/synth/train.json")) << "a set of -5 samples was written";
  for (const auto& [ds, want] : std::vector<std::pair<std::string, std::string>>{
           {R"({"train_micro_batch_size_per_gpu": 1e30})", "train_micro_batch_size_per_gpu: 1e+30 is outside"},
           {R"({"zero_optimization": {"reduce_bucket_size": 3e18}})", "reduce_bucket_size: 3e+18 is outside"},
           {R"({"fp16": {"enabled": true, "initial_scale_power": 100000}})",
            "initial_scale_power: 100000 is outside"}}) {
    std::ofstream(d + "/ds.json") << ds;
    const CmdResult r = headroom(train_in(d) + " --deepspeed " + d + "/ds.json --print-config");
    EXPECT_EQ(exit_code(r), 1) << ds << ": " << r.output;
    EXPECT_TRUE(says(r, "[deepspeed] " + d + "/ds.json: ")) << r.output;
    EXPECT_TRUE(says(r, want)) << ds << ": " << r.output;
  }
  const CmdResult t = headroom(train_in(d) + " --set train.max_steps=2");
  ASSERT_EQ(t.status, 0) << t.output;
  fs::remove(d + "/checkpoint-2/model.safetensors");
  const CmdResult resume = headroom(train_in(d) + " --set train.max_steps=4 --resume");
  EXPECT_EQ(exit_code(resume), 1) << resume.output;
  EXPECT_TRUE(says(resume, "[checkpoint] " + d + "/checkpoint-2/model.safetensors is missing")) << resume.output;
}

// 13. A run's own checkpoint-N/config.yaml (model.weights, the batch of its world size) is taken by every command
// that reads a config, as eval and generate take it; `headroom --help` lists debug batch.
TEST(Hardening, ARunsOwnConfigIsTakenByEveryCommand) {
  const std::string d = fresh("own_config");
  const CmdResult t = headroom(train_in(d) + " --set train.max_steps=2");
  ASSERT_EQ(t.status, 0) << t.output;
  const std::string ckpt = d + "/checkpoint-2";
  const CmdResult info = headroom("model info " + ckpt + "/config.yaml");
  EXPECT_EQ(info.status, 0) << info.output;
  EXPECT_TRUE(says(info, "trainable")) << info.output;
  const CmdResult batch =
      headroom("debug batch " + ckpt + "/config.yaml --out " + d + "/batch.safetensors --count 2" +
               " --set data.train_json=" + d + "/data/train.json --set data.image_folder=" + d + "/data");
  ASSERT_EQ(batch.status, 0) << batch.output;
  const CmdResult grads =
      headroom("debug grads --config " + ckpt + "/config.yaml --weights " + ckpt + "/model.safetensors --batch " + d +
               "/batch.safetensors --out " + d + "/grads.safetensors");
  EXPECT_EQ(grads.status, 0) << grads.output;
  EXPECT_TRUE(says(grads, "gradients to " + d + "/grads.safetensors")) << grads.output;
  const CmdResult help = headroom("--help");
  EXPECT_TRUE(says(help, "debug batch CONFIG --out")) << help.output;
}

// 15. Two runs on one output directory had no lock (one died with an [io] rename error). The second is refused,
// naming the first's host and pid; the lock goes with the first run.
TEST(Hardening, ASecondRunOnAnOutputDirectoryIsRefusedNamingTheFirst) {
  const std::string d = fresh("lock");
  const pid_t first = testing_cli::spawn(
      "exec " + std::string(HR_HEADROOM_BIN) + " " + train_in(d) + " --set train.max_steps=100000", d + "/first.txt");
  ASSERT_GT(first, 0);
  ASSERT_TRUE(testing_cli::wait_for_lines(d + "/memory.jsonl", 1, 120)) << testing_cli::read_file(d + "/first.txt");
  const CmdResult second = headroom(train_in(d) + " --set train.max_steps=2");
  EXPECT_EQ(exit_code(second), 1) << second.output;
  EXPECT_TRUE(says(second, "[run] " + d + " is in use by another run (host ")) << second.output;
  EXPECT_TRUE(says(second, ", pid " + std::to_string(first) + ";")) << second.output;
  kill(first, SIGTERM);
  int status = 0;
  waitpid(first, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << testing_cli::read_file(d + "/first.txt");
  const CmdResult third = headroom(train_in(d) + " --set train.max_steps=1");
  EXPECT_EQ(third.status, 0) << "the lock went with the first run:\n" << third.output;
}
