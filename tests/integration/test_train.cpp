// End-to-end training through the headroom command: memory log fields, resume equivalence, atomic
// checkpoints under SIGKILL, fp16 loss scaling, bf16 convergence, bad samples, config errors.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "core/backend/device_info.h"
#include "core/io/safetensors.h"
#include "integration/cli.h"
#include "models/llava.h"
#include "optim/optimizer.h"
#include "train/checkpoint.h"

extern char** environ;

using namespace hr;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The shared tiny run (cli.h).
const char* const kTinyConfig = testing_cli::kTinyTrainConfig;

std::string fresh_dir(const std::string& name) {
  return testing_cli::fresh_dir("train_" + name);
}

std::string config_file(const std::string& dir, const std::string& extra = "") {
  return testing_cli::write_config(dir, kTinyConfig + extra);
}

using testing_cli::CmdResult;
using testing_cli::jsonl;

CmdResult headroom(const std::string& args) {
  return testing_cli::run(std::string(HR_HEADROOM_BIN) + " " + args);
}

// The complete checkpoints in an output directory (an unfinished one is still a .tmp- directory).
std::set<std::string> checkpoint_names(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (name.rfind("checkpoint-", 0) == 0) names.insert(std::move(name));
  }
  return names;
}

// Every step of a run's memory.jsonl peaked, allocated and reserved, where its dry run said (`what`: which run).
void expect_each_step_predicted(const std::vector<json>& lines, const std::string& what = "") {
  for (const json& l : lines) {
    EXPECT_EQ(l["peak_allocated"], l["predicted_peak"]) << what << "step " << l["step"];
    EXPECT_EQ(l["peak_reserved"], l["predicted_reserved"]) << what << "step " << l["step"];
  }
}

}  // namespace

TEST(Train, MemoryLogHasEveryFieldOnEveryStep) {
  const std::string d = fresh_dir("fields");
  CmdResult r = headroom("train " + config_file(d) + " --set run.output_dir=" + d);
  ASSERT_EQ(r.status, 0) << r.output;
  auto lines = jsonl(d + "/memory.jsonl");
  ASSERT_EQ(lines.size(), 8u);
  for (const json& l : lines) {
    for (const char* f :
         {"step",          "loss",          "lr",        "tokens",         "loss_tokens",   "tokens_per_s",
          "allocated",     "reserved",      "active",    "peak_allocated", "peak_reserved", "predicted_peak",
          "fragmentation", "alloc_retries", "ooms",      "by_category",    "host_rss",      "grad_norm",
          "loss_scale",    "skipped",       "nonfinite", "flops"})
      EXPECT_TRUE(l.contains(f)) << f << " missing in " << l.dump();
    for (const char* c : {"params", "master_params", "grads", "optimizer", "activations", "workspace", "comm", "io"})
      EXPECT_TRUE(l["by_category"].contains(c)) << c;
    for (const char* f : {"allocated", "peak_allocated", "reserved", "by_category"})
      EXPECT_TRUE(l["host"].contains(f)) << "host." << f << " missing in " << l.dump();
    EXPECT_GE(l["host"]["reserved"].get<int64_t>(), l["host"]["allocated"].get<int64_t>());
    EXPECT_GT(l["peak_allocated"].get<int64_t>(), 0);
    EXPECT_GT(l["by_category"]["activations"].get<int64_t>(), 0);
    // The breakdown at the peak adds up to the peak; no step of this run warns.
    int64_t at_peak = 0;
    for (const auto& [name, b] : l["at_peak"].items()) {
      at_peak += b.get<int64_t>();
      EXPECT_LE(b.get<int64_t>(), l["by_category"][name].get<int64_t>()) << name;
    }
    EXPECT_EQ(at_peak, l["peak_allocated"].get<int64_t>()) << l.dump();
    EXPECT_GT(l["samples_per_s"].get<double>(), 0);
    // The labelled tokens the loss averages over: the answers, a part of the step's tokens.
    EXPECT_GT(l["loss_tokens"].get<int64_t>(), 0);
    EXPECT_LT(l["loss_tokens"].get<int64_t>(), l["tokens"].get<int64_t>());
    EXPECT_GT(l["flops"].get<double>(), 0);             // what the step's GEMMs and attention ran
    EXPECT_EQ(l["comm_exposed_s"].get<double>(), 0.0);  // one process: no collective to wait for
    EXPECT_TRUE(l["warnings"].is_array() && l["warnings"].empty()) << l.dump();
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
  EXPECT_NE(r.output.find("| ETA "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("error 0 B (exact)"), std::string::npos) << r.output;
}

// memory.trace_clock: events makes a step's memory timeline and its dry run's (headroom plan --trace) the
// same picture: every device counter point and every phase slice at the same time, with the same bytes. Under
// memory.allocator: planned the real step also reserves its arena as it begins (a reserved point the dry run,
// which records the plan, has not), so there the points are the same in the same order, one event later.
TEST(Train, AStepsMemoryTimelineIsItsDryRunsEventForEvent) {
  for (const char* allocator : {"caching", "planned"}) {
    SCOPED_TRACE(allocator);
    const bool planned = std::string(allocator) == "planned";
    const std::string d = fresh_dir(str("timeline_", allocator));
    const std::string sets = " --set run.output_dir=" + d +
                             " --set train.max_steps=1 --set data.pad_to_max_length=true --set data.max_seq_len=48"
                             " --set train.padding_free=false"  // the step is the plan's worst case
                             " --set memory.trace_steps=[1] --set memory.trace_clock=events"
                             " --set memory.gradient_checkpointing.llm=selective --set train.eval_steps=0"
                             " --set memory.allocator=" +
                             allocator;
    CmdResult r = headroom("train " + config_file(d) + sets);
    ASSERT_EQ(r.status, 0) << r.output;
    CmdResult p = headroom("plan " + config_file(d) + sets + " --trace " + d + "/plan.trace.json");
    ASSERT_EQ(p.status, 0) << p.output;
    auto device_side = [&](const std::string& path) {
      std::ifstream in(path);
      const json t = json::parse(in);
      std::vector<std::string> out;
      for (const json& e : t["traceEvents"]) {
        const std::string ph = e["ph"];
        const std::string ts = planned ? "" : str(e["ts"].get<double>(), " ");
        if (ph == "C" && e["name"].get<std::string>().rfind("device ", 0) == 0 && e["name"] != "device reserved")
          out.push_back(str(ts, e["name"].get<std::string>(), " ", e["args"]["bytes"].get<int64_t>()));
        if (ph == "B" || ph == "E") out.push_back(str(ts, ph, " ", e.value("name", "")));
      }
      return out;
    };
    const auto measured = device_side(d + "/trace.rank0.step1.json"), dry = device_side(d + "/plan.trace.json");
    ASSERT_GT(measured.size(), 200u);
    EXPECT_EQ(measured, dry);
    bool recompute = false;
    for (const std::string& e : measured)
      recompute |= e.find("B recompute language_model.model.layers.") != std::string::npos;
    EXPECT_TRUE(recompute);
  }
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
  expect_each_step_predicted(lines);
  std::set<int64_t> reserved;
  for (const json& l : lines) reserved.insert(l["peak_reserved"].get<int64_t>());
  // The evaluation after step 2 leaves a large segment cached: later steps start from more reserved memory
  // than a dry run from nothing has, and are still predicted.
  EXPECT_GT(reserved.size(), 1u);
  EXPECT_EQ(jsonl(d + "/eval.jsonl").size(), 5u);
  EXPECT_EQ(r.output.find("WARNING"), std::string::npos) << r.output;
}

// Padding-free steps under the planned allocator: the same requests on other token counts from step to step, so a
// step no larger than an earlier one (every buffer) takes that step's arena layout rather than packing its own
// (core::ArenaLayouts); every step is still predicted to the byte, allocated and reserved.
TEST(Train, APaddingFreeStepRunsInAnEarlierStepsArenaLayoutWhereItFits) {
  const std::string d = fresh_dir("layouts_reused");
  CmdResult r = headroom("train " + config_file(d) + " --set run.output_dir=" + d +
                         " --set memory.allocator=planned --set train.padding_free=true --set train.max_steps=16"
                         " --set train.eval_steps=0");
  ASSERT_EQ(r.status, 0) << r.output;
  const auto lines = jsonl(d + "/memory.jsonl");
  ASSERT_EQ(lines.size(), 16u);
  expect_each_step_predicted(lines);
  const std::string said = " of them in an earlier step's arena layout";
  const std::size_t at = r.output.find(said);
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::size_t count = r.output.rfind(", ", at) + 2;  // "N dry runs, K of them in ..."
  EXPECT_GE(std::stoi(r.output.substr(count, at - count)), 1) << r.output;
  EXPECT_EQ(r.output.find("WARNING"), std::string::npos) << r.output;
}

TEST(Train, ResumeContinuesBitForBit) {
  const std::string a = fresh_dir("resume_a"), b = fresh_dir("resume_b");
  const std::string cfg = config_file(a, "");
  // Model weights sharded as save_pretrained shards them above max_shard_size: resuming reads the index.
  const std::string save = " --set train.save_steps=4 --set train.save_total_limit=5 --set train.max_shard_size=64KB";
  CmdResult ra = headroom("train " + cfg + " --set run.output_dir=" + a + save);
  ASSERT_EQ(ra.status, 0) << ra.output;
  ASSERT_TRUE(fs::exists(a + "/checkpoint-4/model.safetensors.index.json"));
  ASSERT_FALSE(fs::exists(a + "/checkpoint-4/model.safetensors"));
  fs::copy(a + "/checkpoint-4", b + "/checkpoint-4", fs::copy_options::recursive);
  CmdResult rb = headroom("train " + cfg + " --set run.output_dir=" + b + " --resume" + save);
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

// train.optimizer: adamw_8bit: every step's peak its dry run's, the optimizer's bytes a quarter of f32 AdamW's and a
// little more (a block scale per 256 elements of each moment; parameters under 4,096 elements and embedding tables
// keep f32 moments), the
// codes and scales checkpointed under bitsandbytes' names, and a resume that continues bit for bit.
TEST(Train, AdamW8bitIsPlannedToTheByteCheckpointsItsCodesAndResumesBitForBit) {
  const std::string a = fresh_dir("adam8_a"), b = fresh_dir("adam8_b"), f = fresh_dir("adam8_f32");
  const std::string cfg = config_file(a, "");
  const std::string save = " --set train.save_steps=4 --set train.optimizer=adamw_8bit";
  CmdResult ra = headroom("train " + cfg + " --set run.output_dir=" + a + save);
  ASSERT_EQ(ra.status, 0) << ra.output;
  CmdResult rf = headroom("train " + cfg + " --set run.output_dir=" + f + " --set train.max_steps=1");
  ASSERT_EQ(rf.status, 0) << rf.output;
  const auto la = jsonl(a + "/memory.jsonl");
  ASSERT_EQ(la.size(), 8u);
  expect_each_step_predicted(la);
  const int64_t eight = la[0]["by_category"]["optimizer"].get<int64_t>(),
                f32 = jsonl(f + "/memory.jsonl")[0]["by_category"]["optimizer"].get<int64_t>();
  const core::SafetensorsFile opt = core::SafetensorsFile::open(a + "/checkpoint-4/optimizer.safetensors");
  int codes = 0, f32_moments = 0;
  int64_t in_file = 0, quantized = 0;  // the states' bytes as the allocator rounds them; elements kept in 8 bits
  for (const std::string& n : opt.names()) {
    const core::Tensor t = opt.get(n);
    in_file += (int64_t(t.numel() * core::dtype_size(t.dtype())) + 511) / 512 * 512;
    if (n.size() > 7 && n.substr(n.size() - 7) == ".state1") {
      ++codes;
      quantized += t.numel();
      EXPECT_EQ(opt.get(n).dtype(), core::DType::U8) << n;
      const std::string base = n.substr(0, n.size() - 7);
      for (const char* other : {".state2", ".absmax1", ".absmax2"})
        EXPECT_TRUE(std::find(opt.names().begin(), opt.names().end(), base + other) != opt.names().end())
            << base << other;
    }
    f32_moments += n.size() > 8 && n.substr(n.size() - 8) == ".exp_avg";
  }
  EXPECT_GT(codes, 0);
  EXPECT_GT(f32_moments, 0);  // the norms' weights and biases, the embedding tables
  // Embedding tables keep f32 moments, as Hugging Face's Trainer keeps them for adamw_bnb_8bit.
  for (const std::string table :
       {"language_model.model.embed_tokens.weight", "vision_tower.vision_model.embeddings.position_embedding.weight"}) {
    const auto names = opt.names();
    EXPECT_NE(std::find(names.begin(), names.end(), table + ".exp_avg"), names.end()) << table;
    EXPECT_EQ(std::find(names.begin(), names.end(), table + ".state1"), names.end()) << table;
  }
  EXPECT_EQ(eight, in_file);
  // Each quantized element saves 6 of AdamW's 8 bytes, less its share of the scales (8 B a block of 256).
  EXPECT_GE(f32 - eight, quantized * 6 - quantized / 32 - 2048 * codes) << eight << " B against " << f32;
  std::printf("optimizer states: %lld B (8-bit AdamW, %lld elements in 8 bits) against %lld B (AdamW)\n",
              (long long)eight, (long long)quantized, (long long)f32);
  fs::copy(a + "/checkpoint-4", b + "/checkpoint-4", fs::copy_options::recursive);
  CmdResult rb = headroom("train " + cfg + " --set run.output_dir=" + b + " --resume" + save);
  ASSERT_EQ(rb.status, 0) << rb.output;
  const auto lb = jsonl(b + "/memory.jsonl");
  ASSERT_EQ(lb.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(lb[i]["loss"].get<double>(), la[4 + i]["loss"].get<double>()) << "step " << 5 + i;
    EXPECT_EQ(lb[i]["grad_norm"].get<double>(), la[4 + i]["grad_norm"].get<double>()) << "step " << 5 + i;
  }
  // Resuming with f32 AdamW from 8-bit states names what is missing.
  const std::string c = fresh_dir("adam8_c");
  fs::copy(a + "/checkpoint-4", c + "/checkpoint-4", fs::copy_options::recursive);
  CmdResult rc = headroom("train " + cfg + " --set run.output_dir=" + c + " --resume --set train.save_steps=4");
  EXPECT_NE(rc.status, 0) << rc.output;
  EXPECT_NE(rc.output.find("exp_avg"), std::string::npos) << rc.output;
}

// memory.offload_activations: cpu: what each checkpointed block keeps waits on the host between its forward and its
// backward, in both towers. Copies move bytes unchanged, so losses, gradient norms and the final weights are those
// of the run without offload bit for bit; the device's peak drops, the host holds the blocks' tensors, and every
// step's peaks are still its dry run's.
TEST(Train, ActivationOffloadKeepsEveryBitAndTheDeviceHoldsLess) {
  for (const char* policy : {"selective", "full"}) {
    std::map<std::string, std::vector<json>> lines;
    for (const char* offload : {"none", "cpu"}) {
      const std::string d = fresh_dir(str("act_offload_", policy, "_", offload));
      CmdResult r =
          headroom(str("train ", config_file(d), " --set run.output_dir=", d,
                       " --set train.stage=full --set train.save_steps=8 --set memory.gradient_checkpointing=", policy,
                       " --set memory.offload_activations=", offload));
      ASSERT_EQ(r.status, 0) << r.output;
      lines[offload] = jsonl(d + "/memory.jsonl");
      ASSERT_EQ(lines[offload].size(), 8u) << policy << " " << offload;
      expect_each_step_predicted(lines[offload], str(policy, " ", offload, " "));
      lines[str(offload, "_dir")] = {json(d)};
    }
    for (std::size_t i = 0; i < 8; ++i) {
      const json &off = lines["cpu"][i], &on = lines["none"][i];
      EXPECT_EQ(off["loss"].get<double>(), on["loss"].get<double>()) << policy << " step " << i + 1;
      EXPECT_EQ(off["grad_norm"].get<double>(), on["grad_norm"].get<double>()) << policy << " step " << i + 1;
      EXPECT_LT(off["peak_allocated"].get<int64_t>(), on["peak_allocated"].get<int64_t>()) << policy;
      EXPECT_GT(off["host"]["by_category"]["activations"].get<int64_t>(), 0) << policy;
      EXPECT_EQ(on["host"]["by_category"]["activations"].get<int64_t>(), 0) << policy;
    }
    const core::SafetensorsFile a = core::SafetensorsFile::open(lines["cpu_dir"][0].get<std::string>() +
                                                                "/checkpoint-8/model.safetensors"),
                                b = core::SafetensorsFile::open(lines["none_dir"][0].get<std::string>() +
                                                                "/checkpoint-8/model.safetensors");
    ASSERT_EQ(a.names(), b.names());
    for (const std::string& n : a.names()) EXPECT_EQ(a.get(n).to_floats(), b.get(n).to_floats()) << policy << " " << n;
  }
  // Nothing to move without checkpointing: refused, naming both keys.
  const std::string d = fresh_dir("act_offload_refused");
  CmdResult r = headroom("plan " + config_file(d) + " --set memory.offload_activations=cpu");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("memory.offload_activations"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("memory.gradient_checkpointing"), std::string::npos) << r.output;
}

// SIGTERM (a scheduler's stop) finishes the step, writes its checkpoint and exits 0; --resume goes on from it.
TEST(Train, SigtermStopsAfterTheStepWithACheckpointAndExitsZero) {
  const std::string d = fresh_dir("sigterm");
  const std::string cmd = std::string(HR_HEADROOM_BIN) + " train " + config_file(d) + " --set run.output_dir=" + d +
                          " --set train.max_steps=100000 --set train.save_steps=0";
  const pid_t pid = testing_cli::spawn("exec " + cmd, d + "/out.txt");
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(testing_cli::wait_for_lines(d + "/memory.jsonl", 3, 120)) << testing_cli::read_file(d + "/out.txt");
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  const std::string out = testing_cli::read_file(d + "/out.txt");
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  const int64_t last = jsonl(d + "/memory.jsonl").back()["step"];
  EXPECT_NE(out.find(str("stop requested (Terminated): saving the checkpoint of step ", last)), std::string::npos)
      << out;
  EXPECT_EQ(train::latest_checkpoint(d), d + "/checkpoint-" + std::to_string(last));
  CmdResult resumed =
      headroom("train " + config_file(d) + " --set run.output_dir=" + d +
               " --set train.save_steps=0 --set train.max_steps=" + std::to_string(last + 2) + " --resume");
  EXPECT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find(str("at step ", last)), std::string::npos) << resumed.output;
  EXPECT_EQ(jsonl(d + "/memory.jsonl").back()["step"], last + 2);
}

namespace {
// Rewrites `file` with one value of `tensor` set to NaN.
void poison(const std::string& file, const std::string& tensor) {
  core::NamedTensors all;
  {
    core::SafetensorsFile f = core::SafetensorsFile::open(file);
    for (const std::string& n : f.names()) {
      core::Tensor t = f.get(n);
      std::vector<float> v = t.to_floats();
      if (n == tensor) v[0] = std::nanf("");
      all.emplace_back(n, core::Tensor::from_floats(v, t.shape(), t.dtype(), core::Device::host()));
    }
  }
  core::save_safetensors(file, all);
}
}  // namespace

// A NaN in one parameter: the step is diagnosed, the console and memory.jsonl name the layer and the parameter,
// and the run stops without writing a checkpoint (the last one stays the last good one); with
// train.on_nonfinite: skip the steps are skipped and the run goes on, and non-finite weights are never saved.
TEST(Train, ANanInAParameterIsNamedAndStopsTheRunKeepingTheLastGoodCheckpoint) {
  const std::string d = fresh_dir("nan");
  const std::string base = "train " + config_file(d) + " --set run.output_dir=" + d;
  CmdResult first = headroom(base + " --set train.max_steps=4 --set train.save_steps=2");
  ASSERT_EQ(first.status, 0) << first.output;
  const std::string bad = "language_model.model.layers.1.mlp.down_proj.weight";
  poison(d + "/checkpoint-4/model.safetensors", bad);
  const auto written = fs::last_write_time(d + "/checkpoint-4/model.safetensors");
  CmdResult stopped = headroom(base + " --set train.max_steps=8 --set train.save_steps=1 --resume");
  EXPECT_NE(stopped.status, 0) << stopped.output;
  EXPECT_NE(stopped.output.find("step 5: non-finite loss"), std::string::npos) << stopped.output;
  const std::string where = "language_model.model.layers.1 (its forward output); parameter " + bad + " is not finite";
  EXPECT_NE(stopped.output.find("the first non-finite value came from " + where), std::string::npos) << stopped.output;
  EXPECT_NE(stopped.output.find("the last checkpoint, " + d + "/checkpoint-4, is from before it"), std::string::npos)
      << stopped.output;
  const json last = jsonl(d + "/memory.jsonl").back();
  EXPECT_EQ(last["step"], 5);
  EXPECT_EQ(last["nonfinite"], where);
  EXPECT_TRUE(last["skipped"].get<bool>());
  EXPECT_FALSE(fs::exists(d + "/checkpoint-5"));
  EXPECT_EQ(fs::last_write_time(d + "/checkpoint-4/model.safetensors"), written);

  // With skip the steps are skipped and the run goes on; the NaN weight stays (no step updates it), so the end of
  // the run does not write it in a checkpoint: the save is refused by name and checkpoint-4 stays the last one.
  CmdResult skipped = headroom(base + " --set train.max_steps=6 --set train.on_nonfinite=skip --resume");
  EXPECT_NE(skipped.status, 0) << skipped.output;
  EXPECT_NE(skipped.output.find("[checkpoint] not writing checkpoint-6: parameter " + bad + " is not finite"),
            std::string::npos)
      << skipped.output;
  const auto lines = jsonl(d + "/memory.jsonl");
  EXPECT_EQ(lines.size(), 6u) << "each step once";
  EXPECT_EQ(lines.back()["step"], 6);
  EXPECT_EQ(lines.back()["nonfinite"], where);
  EXPECT_FALSE(fs::exists(d + "/checkpoint-6"));
  EXPECT_EQ(fs::last_write_time(d + "/checkpoint-4/model.safetensors"), written);
}

// A checkpoint write that fails (a full disk; here a file-size limit makes every write past 64 KiB fail): a
// clear error naming the checkpoint and the file, no partial directory, the previous checkpoint intact.
TEST(Train, AFailedCheckpointWriteLeavesThePreviousCheckpointIntact) {
  const std::string d = fresh_dir("disk_full");
  const std::string base = "train " + config_file(d) + " --set run.output_dir=" + d;
  CmdResult first = headroom(base + " --set train.max_steps=2");
  ASSERT_EQ(first.status, 0) << first.output;
  ASSERT_GT(fs::file_size(d + "/checkpoint-2/model.safetensors"), 64u << 10);
  const auto written = fs::last_write_time(d + "/checkpoint-2/model.safetensors");
  CmdResult full = testing_cli::run("ulimit -f 64; exec " + std::string(HR_HEADROOM_BIN) + " " + base +
                                    " --set train.max_steps=4 --resume");
  EXPECT_NE(full.status, 0) << full.output;
  EXPECT_NE(full.output.find("[checkpoint] writing " + d + "/checkpoint-4 failed: [io] writing " + d +
                             "/.tmp-checkpoint-4/model.safetensors"),
            std::string::npos)
      << full.output;
  EXPECT_NE(full.output.find("File too large; the last checkpoint, " + d + "/checkpoint-2, is intact"),
            std::string::npos)
      << full.output;
  EXPECT_FALSE(fs::exists(d + "/checkpoint-4"));
  EXPECT_FALSE(fs::exists(d + "/.tmp-checkpoint-4"));
  EXPECT_EQ(fs::last_write_time(d + "/checkpoint-2/model.safetensors"), written);
  CmdResult again = headroom(base + " --set train.max_steps=4 --resume");
  EXPECT_EQ(again.status, 0) << again.output;
  EXPECT_TRUE(fs::exists(d + "/checkpoint-4"));
}

TEST(Train, KillDuringCheckpointingLeavesTheLastCheckpointLoadable) {
  const std::string d = fresh_dir("kill");
  const std::string cfg = config_file(d);
  for (int attempt = 0; attempt < 4; ++attempt) {
    std::vector<std::string> args = {
        HR_HEADROOM_BIN,      "train",   cfg, "--set", "run.output_dir=" + d, "--set", "train.max_steps=400", "--set",
        "train.save_steps=1", "--resume"};
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
  CmdResult r =
      headroom("train " + config_file(d) + " --set run.output_dir=" + d +
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
  const std::string base = "train " + config_file(d) + " --set run.output_dir=" + d +
                           "/out --set data.train_json=" + d + "/data/bad.json --set data.image_folder=" + d +
                           "/data --set data.eval_json=" + d + "/data/eval.json --set train.max_steps=3";
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
  // A combination the sharding refuses is the error, not an empty plan search.
  CmdResult offload = headroom("train " + config_file(d) + " --set memory.offload_params=cpu");
  EXPECT_NE(offload.status, 0) << offload.output;
  EXPECT_NE(offload.output.find("memory.offload_params: cpu needs memory.zero_stage: 3"), std::string::npos)
      << offload.output;
  // Batch sizes are bounded before anything is sized from them.
  CmdResult huge = headroom("train " + config_file(d) + " --set train.micro_batch_size=1000000000000");
  EXPECT_NE(huge.status, 0) << huge.output;
  EXPECT_NE(huge.output.find("train.micro_batch_size 1000000000000: one micro-batch's inputs"), std::string::npos)
      << huge.output;
  CmdResult overflow = headroom("train " + config_file(d) + " --set train.micro_batch_size=4611686018427387904");
  EXPECT_NE(overflow.status, 0) << overflow.output;
  EXPECT_NE(overflow.output.find("the batch's sizes overflow 64 bits"), std::string::npos) << overflow.output;
  EXPECT_FALSE(fs::exists(d + "/memory.jsonl"));
}

// `headroom eval` and `headroom generate` run on device.type: on the CPU as given; with device.type: cuda on a
// machine without a usable GPU (or a build without the CUDA back-end) they stop naming it (they used to run on the
// CPU, silently).
TEST(Train, EvalAndGenerateRunOnTheConfiguredDevice) {
  const std::string d = fresh_dir("inference_device");
  const std::string cfg = config_file(d), out = " --set run.output_dir=" + d;
  CmdResult t = headroom("train " + cfg + out + " --set train.max_steps=2 --set train.save_steps=2");
  ASSERT_EQ(t.status, 0) << t.output;
  const std::string ckpt = " --checkpoint " + d + "/checkpoint-2";
  std::string image;
  for (const auto& e : fs::directory_iterator(d + "/data/images")) image = e.path().string();
  const std::string ask = " --image " + image + " --prompt 'What color is the shape?' --max-new-tokens 2 --json";
  CmdResult e = headroom("eval " + cfg + ckpt + out);
  EXPECT_EQ(e.status, 0) << e.output;
  EXPECT_EQ(e.output.rfind("eval loss ", 0), 0u) << e.output;
  CmdResult g = headroom("generate " + cfg + ckpt + out + ask);
  EXPECT_EQ(g.status, 0) << g.output;
  EXPECT_NE(g.output.find("\"tokens\""), std::string::npos) << g.output;
  if (!core::query_cuda().gpus.empty()) GTEST_SKIP() << "this machine has a GPU (test_cuda_train runs them there)";
  for (const std::string& cmd : {"eval " + cfg + ckpt + out, "generate " + cfg + ckpt + out + ask}) {
    CmdResult r = headroom(cmd + " --set device.type=cuda");
    EXPECT_NE(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("cuda:0"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("eval loss"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("\"tokens\""), std::string::npos) << r.output;
  }
}

// A bf16 run keeps its gradients in f32 (memory.grad_accum_dtype auto), twice the bytes of bf16 gradients, planned
// as such: with batches padded to a multiple of 16 (data.pad_to_multiple_of, as a GPU pads them) every step's peak
// and every evaluation pass's is its prediction, at either gradient dtype.
TEST(Train, Bf16GradientsAccumulateInF32AndPaddedBatchesArePredicted) {
  std::map<std::string, int64_t> grads;
  for (const char* accum : {"fp32", "model"}) {
    const std::string d = fresh_dir(std::string("accum_") + accum);
    CmdResult r = headroom("train " + config_file(d) + " --set run.output_dir=" + d +
                           " --set memory.precision=bf16 --set data.pad_to_multiple_of=16 --set train.max_steps=4 "
                           "--set train.eval_steps=2 --set memory.grad_accum_dtype=" +
                           accum);
    ASSERT_EQ(r.status, 0) << r.output;
    const auto lines = jsonl(d + "/memory.jsonl");
    ASSERT_EQ(lines.size(), 4u);
    expect_each_step_predicted(lines, str(accum, " "));
    for (const json& e : jsonl(d + "/eval.jsonl"))  // the evaluation's padded batches too
      EXPECT_EQ(e["memory"]["loss_pass"]["mismatches"], 0) << e.dump();
    grads[accum] = lines.back()["by_category"]["grads"].get<int64_t>();
    std::ifstream in(d + "/config.yaml");
    const std::string yaml((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(yaml.find(std::string("grad_accum_dtype: ") + accum), std::string::npos) << yaml;
    EXPECT_NE(yaml.find("pad_to_multiple_of: 16"), std::string::npos);
  }
  ASSERT_GT(grads["model"], 0);
  // Twice the bytes but for the allocator's rounding of the smallest tensors (512-byte blocks).
  EXPECT_GT(double(grads["fp32"]) / double(grads["model"]), 1.75) << "f32 gradients of bf16 parameters";
  EXPECT_LE(grads["fp32"], 2 * grads["model"]);
}
