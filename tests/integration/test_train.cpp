// End-to-end training through the headroom command: memory log fields, resume equivalence, atomic
// checkpoints under SIGKILL, fp16 loss scaling, bf16 convergence, bad samples, config errors.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "models/llava.h"
#include "optim/optimizer.h"
#include "integration/cli.h"
#include "train/checkpoint.h"

extern char** environ;

using namespace hr;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const char* kTinyConfig = R"(model:
  preset: tiny
  vision: {image_size: 8, patch_size: 4}
  llm: {vocab_size: 300}
  image_token_index: 299
data:
  synthetic: {train: 64, eval: 16, image_size: 8}
  system_prompt: ""
  num_workers: 2
train:
  micro_batch_size: 4
  gradient_accumulation_steps: 2
  max_steps: 8
  learning_rate: 0.003
  warmup_steps: 1
  max_new_tokens: 4
log:
  logging_steps: 1
  progress_bar: false
)";

std::string fresh_dir(const std::string& name) { return testing_cli::fresh_dir("train_" + name); }

std::string config_file(const std::string& dir, const std::string& extra = "") {
  return testing_cli::write_config(dir, kTinyConfig + extra);
}

using testing_cli::CmdResult;
using testing_cli::jsonl;

CmdResult headroom(const std::string& args) { return testing_cli::run(std::string(HR_HEADROOM_BIN) + " " + args); }

// The complete checkpoints in an output directory (an unfinished one is still a .tmp- directory).
std::set<std::string> checkpoint_names(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (name.rfind("checkpoint-", 0) == 0) names.insert(std::move(name));
  }
  return names;
}

}  // namespace

TEST(Train, MemoryLogHasEveryFieldOnEveryStep) {
  const std::string d = fresh_dir("fields");
  CmdResult r = headroom("train " + config_file(d) + " --set run.output_dir=" + d);
  ASSERT_EQ(r.status, 0) << r.output;
  auto lines = jsonl(d + "/memory.jsonl");
  ASSERT_EQ(lines.size(), 8u);
  for (const json& l : lines) {
    for (const char* f : {"step", "loss", "lr", "tokens_per_s", "allocated", "reserved", "active", "peak_allocated",
                          "peak_reserved", "predicted_peak", "fragmentation", "alloc_retries", "ooms", "by_category",
                          "host_rss", "grad_norm", "loss_scale", "skipped"})
      EXPECT_TRUE(l.contains(f)) << f << " missing in " << l.dump();
    for (const char* c : {"params", "master_params", "grads", "optimizer", "activations", "workspace", "comm", "io"})
      EXPECT_TRUE(l["by_category"].contains(c)) << c;
    EXPECT_GT(l["peak_allocated"].get<int64_t>(), 0);
    EXPECT_GT(l["by_category"]["activations"].get<int64_t>(), 0);
  }
  EXPECT_EQ(lines.back()["step"], 8);
  auto evals = jsonl(d + "/eval.jsonl");
  ASSERT_EQ(evals.size(), 1u);
  for (const char* f : {"step", "loss", "accuracy", "accuracy_by_type"}) EXPECT_TRUE(evals[0].contains(f)) << f;
  // One prediction line per evaluated sample, agreeing with the accuracy.
  auto preds = jsonl(d + "/eval_predictions.jsonl");
  ASSERT_EQ(int64_t(preds.size()), evals[0]["samples"].get<int64_t>());
  int64_t correct = 0;
  for (const json& p : preds) {
    for (const char* f : {"step", "id", "question_type", "prediction", "answer", "correct"})
      EXPECT_TRUE(p.contains(f)) << f;
    EXPECT_EQ(p["correct"].get<bool>(), p["prediction"] == p["answer"]) << p.dump();
    correct += p["correct"].get<bool>();
  }
  EXPECT_DOUBLE_EQ(double(correct) / double(preds.size()), evals[0]["accuracy"].get<double>());
  EXPECT_TRUE(fs::exists(d + "/config.yaml"));
  EXPECT_TRUE(fs::exists(d + "/checkpoint-8/model.safetensors"));
  EXPECT_NE(r.output.find("memory summary"), std::string::npos);
}

TEST(Train, EveryStepsPeaksArePredictedWhateverTheAllocatorCachedBefore) {
  // Sequences of varying length, evaluations every 2 steps and checkpoints every 3: what the allocator has
  // cached when a step starts differs from step to step, and the reserved peak with it.
  const std::string d = fresh_dir("every_step");
  CmdResult r = headroom("train " + config_file(d) + " --set run.output_dir=" + d +
                         " --set train.eval_steps=2 --set train.save_steps=3 --set train.max_steps=10");
  ASSERT_EQ(r.status, 0) << r.output;
  const auto lines = jsonl(d + "/memory.jsonl");
  ASSERT_EQ(lines.size(), 10u);
  std::set<int64_t> reserved;
  for (const json& l : lines) {
    EXPECT_EQ(l["peak_allocated"], l["predicted_peak"]) << "step " << l["step"];
    EXPECT_EQ(l["peak_reserved"], l["predicted_reserved"]) << "step " << l["step"];
    reserved.insert(l["peak_reserved"].get<int64_t>());
  }
  // The evaluation after step 2 leaves a large segment cached: later steps start from more reserved memory
  // than a dry run from nothing has, and are still predicted.
  EXPECT_GT(reserved.size(), 1u);
  EXPECT_EQ(jsonl(d + "/eval.jsonl").size(), 5u);
  EXPECT_EQ(r.output.find("WARNING"), std::string::npos) << r.output;
}

TEST(Train, ResumeContinuesBitForBit) {
  const std::string a = fresh_dir("resume_a"), b = fresh_dir("resume_b");
  const std::string cfg = config_file(a, "");
  CmdResult ra = headroom("train " + cfg + " --set run.output_dir=" + a + " --set train.save_steps=4 --set train.save_total_limit=5");
  ASSERT_EQ(ra.status, 0) << ra.output;
  fs::copy(a + "/checkpoint-4", b + "/checkpoint-4", fs::copy_options::recursive);
  CmdResult rb = headroom("train " + cfg + " --set run.output_dir=" + b + " --resume --set train.save_steps=4 --set train.save_total_limit=5");
  ASSERT_EQ(rb.status, 0) << rb.output;
  EXPECT_NE(rb.output.find("resumed from"), std::string::npos) << rb.output;
  auto la = jsonl(a + "/memory.jsonl"), lb = jsonl(b + "/memory.jsonl");
  ASSERT_EQ(la.size(), 8u);
  ASSERT_EQ(lb.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(lb[i]["step"], la[4 + i]["step"]);
    EXPECT_EQ(lb[i]["loss"].get<double>(), la[4 + i]["loss"].get<double>()) << "step " << 5 + i;
    EXPECT_EQ(lb[i]["grad_norm"].get<double>(), la[4 + i]["grad_norm"].get<double>()) << "step " << 5 + i;
  }
}

TEST(Train, KillDuringCheckpointingLeavesTheLastCheckpointLoadable) {
  const std::string d = fresh_dir("kill");
  const std::string cfg = config_file(d);
  for (int attempt = 0; attempt < 4; ++attempt) {
    std::vector<std::string> args = {HR_HEADROOM_BIN, "train", cfg, "--set", "run.output_dir=" + d, "--set",
                                     "train.max_steps=400", "--set", "train.save_steps=1", "--resume"};
    std::vector<char*> argv;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    const std::set<std::string> before = checkpoint_names(d);
    pid_t pid;
    ASSERT_EQ(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ), 0);
    // Waits for this attempt's first checkpoint rather than a fixed time, so that a slow build (sanitizers, a
    // loaded machine) still kills during training; each attempt then kills at another point of the save cycle.
    int status = 0;
    bool exited = false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!exited && checkpoint_names(d) == before && std::chrono::steady_clock::now() < deadline) {
      exited = waitpid(pid, &status, WNOHANG) == pid;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!exited) {
      std::this_thread::sleep_for(std::chrono::milliseconds(170 * attempt));
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
    }
    posix_spawn_file_actions_destroy(&fa);
    // Every checkpoint directory present is complete and loads.
    int found = 0;
    for (const auto& e : fs::directory_iterator(d)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("checkpoint-", 0) != 0) continue;
      ++found;
      models::LlavaConfig mc = models::preset("tiny");
      mc.vision.image_size = 8;
      mc.vision.patch = 4;
      mc.llm.vocab = 300;
      mc.image_token_id = 299;
      models::Llava model(mc, core::Device::cpu(), core::DType::F32);
      auto single = parallel::make_single_process();
      EXPECT_NO_THROW({
        train::TrainerState st = train::read_trainer_state(e.path().string());
        train::load_model_weights(e.path().string(), model);
        parallel::Zero zero(model, *single, {}, {});
        train::load_optimizer_state(e.path().string(), zero, st.optimizer_steps);
      }) << name;
    }
    EXPECT_GT(found, 0) << "attempt " << attempt << ": no checkpoint written before the kill";
  }
}

TEST(Train, Fp16LossScalingSkipsOverflowsAndConverges) {
  const std::string d = fresh_dir("fp16");
  CmdResult r = headroom("train " + config_file(d) + " --set run.output_dir=" + d +
                   " --set memory.precision=fp16 --set memory.loss_scale.initial=1e7 --set memory.loss_scale.hysteresis=1"
                   " --set train.max_steps=60");
  ASSERT_EQ(r.status, 0) << r.output;
  auto l = jsonl(d + "/memory.jsonl");
  ASSERT_EQ(l.size(), 60u);
  int skipped = 0;
  for (const json& x : l) skipped += x["skipped"].get<bool>();
  EXPECT_GT(skipped, 0) << "an initial scale of 1e7 overflows fp16 gradients";
  EXPECT_TRUE(l.front()["skipped"].get<bool>());
  EXPECT_NE(r.output.find("step skipped"), std::string::npos);
  EXPECT_LT(l.back()["loss_scale"].get<double>(), 1e7);
  EXPECT_LT(l.back()["loss"].get<double>(), 0.7 * l.front()["loss"].get<double>());
}

TEST(Train, Bf16AndFp32Converge) {
  for (const char* p : {"bf16", "fp32"}) {
    const std::string d = fresh_dir(std::string("conv_") + p);
    CmdResult r = headroom("train " + config_file(d) + " --set run.output_dir=" + d + " --set memory.precision=" + p +
                     " --set train.max_steps=40");
    ASSERT_EQ(r.status, 0) << r.output;
    auto l = jsonl(d + "/memory.jsonl");
    EXPECT_LT(l.back()["loss"].get<double>(), 0.6 * l.front()["loss"].get<double>()) << p;
    if (std::string(p) == "bf16") {
      EXPECT_GT(l.back()["by_category"]["master_params"].get<int64_t>(), 0);
    }
  }
}

TEST(Train, BadSamplesAreSkippedAndNamedOrStopTheRun) {
  const std::string d = fresh_dir("bad");
  {
    CmdResult r = headroom("data synth --out " + d + "/data --train 8 --eval 2 --image-size 8");
    ASSERT_EQ(r.status, 0) << r.output;
  }
  json all = json::parse(std::ifstream(d + "/data/train.json"));
  all[2]["image"] = "images/missing.png";
  all[5]["conversations"][0]["from"] = "robot";
  std::ofstream(d + "/data/bad.json") << all.dump();
  const std::string base = "train " + config_file(d) + " --set run.output_dir=" + d + "/out --set data.train_json=" + d +
                           "/data/bad.json --set data.image_folder=" + d + "/data --set data.eval_json=" + d +
                           "/data/eval.json --set train.max_steps=3";
  CmdResult skip = headroom(base);
  ASSERT_EQ(skip.status, 0) << skip.output;
  EXPECT_NE(skip.output.find("skipped bad sample: [data] " + d + "/data/bad.json[2] (id train-000002): image"),
            std::string::npos)
      << skip.output;
  EXPECT_NE(skip.output.find("(id train-000005): turn 'from' is 'robot'"), std::string::npos) << skip.output;
  CmdResult fail = headroom(base + " --set data.on_bad_sample=fail");
  EXPECT_NE(fail.status, 0);
  // Whichever bad sample the shuffled order reaches first stops the run, by name.
  EXPECT_TRUE(fail.output.find("(id train-000002)") != std::string::npos ||
              fail.output.find("(id train-000005)") != std::string::npos)
      << fail.output;
  EXPECT_NE(fail.output.find("(data.on_bad_sample: fail)"), std::string::npos) << fail.output;
}

TEST(Train, ConfigErrorsStopBeforeTraining) {
  const std::string d = fresh_dir("cfg");
  CmdResult unknown = headroom("train " + config_file(d) + " --set memory.gradient_checkpoint=full");
  EXPECT_NE(unknown.status, 0);
  EXPECT_NE(unknown.output.find("did you mean 'memory.gradient_checkpointing'?"), std::string::npos) << unknown.output;
  CmdResult bad = headroom("train " + config_file(d) + " --set train.lr_scheduler_type=exponential");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.output.find("train.lr_scheduler_type: 'exponential' is not one of: cosine, linear, constant"),
            std::string::npos)
      << bad.output;
  EXPECT_FALSE(fs::exists(d + "/memory.jsonl"));
}
