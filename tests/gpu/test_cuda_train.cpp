// Training on cuda:0 (label gpu): a tiny LLaVA trains 20 f32 steps with the losses of the same run on the CPU
// (within 1e-3) and every step's measured peak equal to its dry run on the meta device mirroring CUDA; the memory
// log carries cudaMemGetInfo's device_free and device_total; a capped GPU (device.memory_limit) runs out of memory
// with the report, as the capped CPU does. Skipped where no GPU is present. The headroom binary is HR_HEADROOM
// (the GPU bundle's bin/headroom) or the one built beside this test.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <map>

#include "integration/cli.h"

using namespace hr::testing_cli;
using json = nlohmann::json;

namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::string headroom_bin() {
  const char* b = std::getenv("HR_HEADROOM");
  return b && *b ? b : HR_HEADROOM_BIN;
}

const char* kConfig = R"(model:
  preset: tiny
  vision: {image_size: 8, patch_size: 4}
  llm: {vocab_size: 300}
  image_token_index: 299
data:
  synthetic: {train: 64, eval: 8, image_size: 8}
  system_prompt: ""
  num_workers: 1
  pad_to_max_length: true
train:
  stage: full
  micro_batch_size: 4
  global_batch_size: 8
  max_steps: 20
  learning_rate: 0.003
  warmup_steps: 1
  eval_steps: 0
  save_steps: 0
  max_new_tokens: 2
log:
  logging_steps: 5
  progress_bar: false
)";

CmdResult train(const std::string& cfg, const std::string& out, const std::string& sets) {
  return run(headroom_bin() + " train " + cfg + " --set run.output_dir=" + out + " " + sets);
}

// `mpirun -np ranks` as root (HR_MPIRUN: the GPU bundle's), with `env` (VAR=value ...) before it.
std::string mpirun(int ranks, const std::string& env = "") {
  const char* m = std::getenv("HR_MPIRUN");
  return "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " + env + " " + (m && *m ? m : "mpirun") +
         " --oversubscribe -np " + std::to_string(ranks);
}

// Two ranks training on GPUs at ZeRO `stage` until stopped, in the background; output in base/log.txt.
pid_t spawn_endless_training(const std::string& base, const std::string& cfg, int stage) {
  return spawn(
      "exec " + mpirun(2) + " " + headroom_bin() + " train " + cfg + " --set run.output_dir=" + base +
          "/run --set device.type=cuda --set train.max_steps=1000000 --set memory.zero_stage=" + std::to_string(stage),
      base + "/log.txt");
}

}  // namespace

TEST(CudaTrain, TwentyStepsMatchTheCpuAndEveryPeakItsDryRun) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const std::string base = fresh_dir("cuda_train");
  const std::string cfg = write_config(base, kConfig);
  CmdResult cpu = train(cfg, base + "/cpu", "");
  ASSERT_EQ(cpu.status, 0) << cpu.output;
  CmdResult gpu = train(cfg, base + "/gpu", "--set device.type=cuda:0");
  ASSERT_EQ(gpu.status, 0) << gpu.output;
  const auto a = jsonl(base + "/cpu/memory.jsonl"), b = jsonl(base + "/gpu/memory.jsonl");
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 20u);
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(b[i]["loss"].get<double>(), a[i]["loss"].get<double>(), 1e-3) << "step " << i + 1;
    EXPECT_EQ(b[i]["peak_allocated"], b[i]["predicted_peak"]) << "step " << i + 1;
    EXPECT_EQ(b[i]["peak_reserved"], b[i]["predicted_reserved"]) << "step " << i + 1;
    ASSERT_TRUE(b[i].contains("device_free") && b[i].contains("device_total")) << b[i].dump();
    EXPECT_GT(b[i]["device_total"].get<int64_t>(), b[i]["device_free"].get<int64_t>());
  }
  EXPECT_EQ(gpu.output.find("WARNING"), std::string::npos) << gpu.output;
}

// memory.allocator on the GPU, each for a few steps of the same run: every step's peaks equal its dry run (the
// expandable segments over cuMem*, the planned arena from cudaMalloc), and the losses are the same (f32 takes
// the own attention kernels, which sum in a fixed order).
TEST(CudaTrain, EveryAllocatorTrainsWithEveryPeakItsDryRun) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const std::string base = fresh_dir("cuda_allocators");
  const std::string cfg = write_config(base, kConfig);
  std::vector<json> first;
  for (const std::string kind : {"caching", "expandable", "planned"}) {
    SCOPED_TRACE(kind);
    CmdResult r = train(cfg, base + "/" + kind,
                        "--set device.type=cuda:0 --set train.max_steps=6 --set memory.allocator=" + kind);
    ASSERT_EQ(r.status, 0) << r.output;
    const auto lines = jsonl(base + "/" + kind + "/memory.jsonl");
    ASSERT_EQ(lines.size(), 6u);
    for (std::size_t i = 0; i < lines.size(); ++i) {
      EXPECT_EQ(lines[i]["allocator"], kind) << lines[i].dump();
      EXPECT_EQ(lines[i]["peak_allocated"], lines[i]["predicted_peak"]) << "step " << i + 1;
      EXPECT_EQ(lines[i]["peak_reserved"], lines[i]["predicted_reserved"]) << "step " << i + 1;
      if (!first.empty()) {
        EXPECT_EQ(lines[i]["loss"].get<double>(), first[i]["loss"].get<double>()) << "step " << i + 1;
      }
    }
    if (first.empty()) first = lines;
  }
}

TEST(CudaTrain, ACappedGpuRunsOutOfMemoryWithTheReport) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const std::string base = fresh_dir("cuda_capped");
  const std::string cfg = write_config(base, kConfig);
  CmdResult r =
      train(cfg, base + "/run", "--set device.type=cuda:0 --set device.memory_limit=4MiB --set memory.preflight=false");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("out of memory"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("cuda:0"), std::string::npos) << r.output;
}

// Under mpirun each rank trains on cuda:<local rank> with ZeRO's collectives over NCCL. With more ranks than GPUs
// (NCCL refuses two ranks on one GPU), every rank stops with the reason instead of one failing and the others
// waiting in a collective. With as many ranks as GPUs (two or more), ZeRO-3 matches the single GPU's losses.
TEST(CudaTrain, RanksTakeTheirLocalGpuOverNcclAndMoreRanksThanGpusIsAnErrorOnEveryRank) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  int gpus = 0;
  cudaGetDeviceCount(&gpus);
  const std::string base = fresh_dir("cuda_ranks");
  const std::string cfg = write_config(base, kConfig);
  const std::string sets = " --set device.type=cuda --set train.max_steps=5 --set memory.zero_stage=3";
  CmdResult over =
      run(mpirun(gpus + 1) + " " + headroom_bin() + " train " + cfg + " --set run.output_dir=" + base + "/over" + sets);
  EXPECT_NE(over.status, 0) << over.output;
  EXPECT_NE(over.output.find("have no GPU of their own"), std::string::npos) << over.output;
  if (gpus < 2) return;
  CmdResult one = train(cfg, base + "/one", sets);
  ASSERT_EQ(one.status, 0) << one.output;
  CmdResult two =
      run(mpirun(2) + " " + headroom_bin() + " train " + cfg + " --set run.output_dir=" + base + "/two" + sets);
  ASSERT_EQ(two.status, 0) << two.output;
  const auto a = jsonl(base + "/one/memory.jsonl"), b = jsonl(base + "/two/memory.rank0.jsonl");
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(b[i]["loss"].get<double>(), a[i]["loss"].get<double>(), 1e-3) << "step " << i + 1;
    EXPECT_EQ(b[i]["peak_allocated"], b[i]["predicted_peak"]) << "step " << i + 1;
  }
}

// A rank killed while NCCL carries ZeRO-3's collectives still ends the whole job within a minute (the launcher
// ends the job; a rank whose collective can no longer finish sees NCCL's asynchronous error, aborts its
// communicator and reports). Needs two GPUs: NCCL takes one GPU per rank.
TEST(CudaTrain, AKilledRankEndsTheNcclJobWithinAMinute) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 2) GTEST_SKIP() << "needs two GPUs";
  const std::string base = fresh_dir("cuda_kill");
  const std::string cfg = write_config(base, kConfig);
  const pid_t launcher = spawn_endless_training(base, cfg, 3);
  ASSERT_GT(launcher, 0);
  ASSERT_TRUE(wait_for_lines(base + "/run/memory.rank1.jsonl", 1, 120)) << read_file(base + "/log.txt");
  const std::vector<pid_t> ranks = ranks_of(launcher);
  ASSERT_EQ(ranks.size(), 2u);
  const JobEnd end = signal_rank(launcher, ranks, 1, SIGKILL, 60);
  ASSERT_TRUE(end.ended) << "the job was still running 60 s after a rank was killed\n" << read_file(base + "/log.txt");
  EXPECT_TRUE(!WIFEXITED(end.status) || WEXITSTATUS(end.status) != 0) << "mpirun exited 0";
  EXPECT_TRUE(process_gone(ranks[0])) << "rank 0 still alive";
  std::printf("job ended %.1f s after rank 1 was killed\n", end.seconds);
}

// Exposed communication with NCCL (memory.jsonl's comm_exposed_s: the compute stream's stalls behind the NCCL
// stream): rank 1 stopped for 2 s in the middle of a ZeRO-2 run shows up in one step of rank 0, and its other steps
// hold little. Needs two GPUs.
TEST(CudaTrain, ARankWaitingForAnotherOverNcclReportsItAsExposedCommunication) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 2) GTEST_SKIP() << "needs two GPUs";
  const std::string base = fresh_dir("cuda_exposed");
  const std::string cfg = write_config(base, kConfig);
  const pid_t launcher = spawn_endless_training(base, cfg, 2);
  ASSERT_GT(launcher, 0);
  const JobEnd end = pause_rank_then_stop(launcher, base + "/run", 2);
  ASSERT_TRUE(end.ended) << read_file(base + "/log.txt");
  ASSERT_TRUE(WIFEXITED(end.status) && WEXITSTATUS(end.status) == 0) << read_file(base + "/log.txt");
  expect_rank0_waited_once(base + "/run", 2.0);
}

namespace {

// The MPI matrix on GPUs: ZeRO 0-3, each with and without optimizer offload (overlap and prefetch on, the defaults),
// 2 ranks launched as `launch` (mpirun ... -np 2, its environment first) with `more` settings: both ranks' losses
// equal one GPU's within 1e-3 and every step's peaks equal its dry run on both ranks. At ZeRO-3 step 3's measured
// memory timeline has layer 1's parameters gathered beside layer 0's while layer 0's forward runs with prefetch 1,
// and not with prefetch 0.
void zero_matrix_on_gpus(const std::string& base, const std::string& launch, const std::string& more) {
  const std::string cfg = write_config(base, kConfig);
  const std::string sets = " --set device.type=cuda --set train.max_steps=8";
  CmdResult one = train(cfg, base + "/one", sets);
  ASSERT_EQ(one.status, 0) << one.output;
  const auto ref = jsonl(base + "/one/memory.jsonl");
  auto two = [&](const std::string& name, const std::string& extra) {
    const std::string out = base + "/" + name;
    CmdResult r =
        run(launch + " " + headroom_bin() + " train " + cfg + " --set run.output_dir=" + out + sets + more + extra);
    EXPECT_EQ(r.status, 0) << name << "\n" << r.output;
    for (int rank = 0; rank < 2; ++rank) {
      const auto got = jsonl(out + "/memory.rank" + std::to_string(rank) + ".jsonl");
      EXPECT_EQ(got.size(), ref.size()) << name;
      for (std::size_t i = 0; i < std::min(got.size(), ref.size()); ++i) {
        EXPECT_NEAR(got[i]["loss"].get<double>(), ref[i]["loss"].get<double>(), 1e-3)
            << name << " rank " << rank << " step " << i + 1;
        EXPECT_EQ(got[i]["peak_allocated"], got[i]["predicted_peak"]) << name << " rank " << rank << " step " << i + 1;
        EXPECT_EQ(got[i]["peak_reserved"], got[i]["predicted_reserved"])
            << name << " rank " << rank << " step " << i + 1;
      }
    }
    return out;
  };
  for (int stage = 0; stage <= 3; ++stage)
    for (const char* offload : {"none", "cpu"})
      two(std::string("z") + std::to_string(stage) + "_" + offload, std::string(" --set memory.zero_stage=") +
                                                                        std::to_string(stage) +
                                                                        " --set memory.offload_optimizer=" + offload);
  const std::string layer0 = "forward language_model.model.layers.0";
  int64_t params_in_layer0[2] = {0, 0};
  for (int prefetch : {0, 1}) {
    const std::string out =
        two("prefetch" + std::to_string(prefetch),
            " --set memory.zero_stage=3 --set memory.trace_steps=[3] --set parallel.prefetch_groups=" +
                std::to_string(prefetch));
    std::ifstream in(out + "/trace.rank0.step3.json");
    ASSERT_TRUE(in) << out;
    walk_slices(json::parse(in)["traceEvents"], [&](const json& e, const std::vector<std::string>& open) {
      if (e.value("ph", "") == "C" && e.value("name", "") == "device params" && inside(open, layer0))
        params_in_layer0[prefetch] = std::max(params_in_layer0[prefetch], e["args"]["bytes"].get<int64_t>());
    });
  }
  // A decoder layer of the tiny LLaMA in f32 (q, k, v, o, gate, up, down, two norms) is gathered beside layer 0.
  const int64_t layer_bytes = 4 * (32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 64 + 2 * 32);
  EXPECT_GE(params_in_layer0[1] - params_in_layer0[0], layer_bytes)
      << "parameters during layer 0's forward: " << params_in_layer0[0] << " B without prefetching, "
      << params_in_layer0[1] << " B with";
}

}  // namespace

// The matrix over NCCL, one GPU per rank. Needs two GPUs.
TEST(CudaTrain, ZeroStagesWithAndWithoutOffloadOverNcclMatchOneGpuAndTheirDryRuns) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 2) GTEST_SKIP() << "needs two GPUs";
  zero_matrix_on_gpus(fresh_dir("cuda_zero_nccl"), mpirun(2), "");
}

// The matrix with both ranks on one GPU (parallel.backend: mpi: NCCL refuses two ranks on one GPU, so the device
// tensors' collectives go through MPI in host memory, and each rank plans with half the GPU's free memory): what a
// machine with one GPU can check of several ranks' arithmetic and memory.
TEST(CudaTrain, TwoRanksShareOneGpuOverMpiAndMatchOneGpuAndTheirDryRuns) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  zero_matrix_on_gpus(fresh_dir("cuda_zero_shared"), mpirun(2, "CUDA_VISIBLE_DEVICES=0"),
                      " --set parallel.backend=mpi");
}

// bf16 on one GPU, where host and GPU tensors of different dtypes meet (f32 initial values into bf16 parameters,
// f32 host masters of bf16 GPU parameters with optimizer offload, LoRA's adapters) and with ZeRO-3's parameters on
// the host without offloaded states (the update runs on the GPU, the shard comes and goes), and with activations
// offloaded beside 8-bit AdamW: each trains, and every step's peaks equal its dry run.
TEST(CudaTrain, Bf16WithOffloadLoraAndHostParametersTrainsAndEveryPeakItsDryRun) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const std::string base = fresh_dir("cuda_bf16");
  const std::string cfg = write_config(base, kConfig);
  const std::string sets = " --set device.type=cuda --set memory.precision=bf16 --set train.max_steps=6";
  const std::pair<const char*, const char*> runs[] = {
      {"plain", ""},
      {"offload", " --set memory.offload_optimizer=cpu"},
      {"lora", " --set lora.enable=true --set train.learning_rate=0.01"},
      {"z3_host_params", " --set memory.zero_stage=3 --set memory.offload_params=cpu"},
      // Activation offload: the blocks' kept tensors leave and come back on the side stream, 8-bit AdamW beside.
      {"offload_activations_8bit",
       " --set memory.gradient_checkpointing=selective --set memory.offload_activations=cpu"
       " --set train.optimizer=adamw_8bit --set model.llm.hidden_size=64"},
  };
  for (const auto& [name, more] : runs) {
    CmdResult r = train(cfg, base + "/" + name, sets + more);
    ASSERT_EQ(r.status, 0) << name << "\n" << r.output;
    const auto lines = jsonl(base + "/" + name + "/memory.jsonl");
    ASSERT_EQ(lines.size(), 6u) << name;
    for (const json& l : lines) {
      EXPECT_TRUE(std::isfinite(l["loss"].get<double>())) << name << " " << l.dump();
      EXPECT_EQ(l["peak_allocated"], l["predicted_peak"]) << name << " step " << l["step"];
    }
    EXPECT_LT(lines.back()["loss"].get<double>(), lines.front()["loss"].get<double>()) << name;
  }
}

// `headroom eval` and `headroom generate` with device.type: cuda run on the GPU and give the CPU's results for the
// same checkpoint (f32): the same eval loss within 1e-3 and accuracy, the same greedy tokens.
TEST(CudaTrain, EvalAndGenerateOnTheGpuAgreeWithTheCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const std::string base = fresh_dir("cuda_inference");
  const std::string cfg = write_config(base, kConfig);
  const std::string out = " --set run.output_dir=" + base + "/run";
  CmdResult t = train(cfg, base + "/run", " --set train.max_steps=10 --set train.save_steps=10");
  ASSERT_EQ(t.status, 0) << t.output;
  const std::string ckpt = " --checkpoint " + base + "/run/checkpoint-10";
  std::string image;
  for (const auto& e : std::filesystem::directory_iterator(base + "/run/data/images")) image = e.path().string();
  ASSERT_FALSE(image.empty());
  std::map<std::string, std::string> eval_line;
  std::map<std::string, json> answer;
  for (const char* dev : {"cpu", "cuda"}) {
    const std::string on = std::string(" --set device.type=") + dev;
    CmdResult e = run(headroom_bin() + " eval " + cfg + ckpt + out + on);
    ASSERT_EQ(e.status, 0) << dev << "\n" << e.output;
    eval_line[dev] = e.output.substr(0, e.output.find('\n'));
    CmdResult g = run(headroom_bin() + " generate " + cfg + ckpt + out + on + " --image " + image +
                      " --prompt 'What color is the shape?' --max-new-tokens 4 --json");
    ASSERT_EQ(g.status, 0) << dev << "\n" << g.output;
    answer[dev] = json::parse(g.output.substr(g.output.find('{')));
  }
  auto loss = [](const std::string& line) { return std::stod(line.substr(line.find("eval loss ") + 10)); };
  auto accuracy = [](const std::string& line) { return line.substr(line.find("accuracy")); };
  EXPECT_NEAR(loss(eval_line["cuda"]), loss(eval_line["cpu"]), 1e-3) << eval_line["cuda"] << " | " << eval_line["cpu"];
  EXPECT_EQ(accuracy(eval_line["cuda"]), accuracy(eval_line["cpu"]));
  EXPECT_EQ(answer["cuda"]["tokens"], answer["cpu"]["tokens"]) << answer["cuda"].dump() << "\n" << answer["cpu"].dump();
}

// The LLaVA family's pieces on the GPU, in one tiny model: a SigLIP tower, AnyRes images (crops of a grid picked
// per image, image_newline, a variable count of image tokens, mix_rows), a Qwen2 decoder whose second layer keeps
// an 8-token sliding window (sequences of ~76 tokens, so the window hides keys and every windowed layer takes the
// own attention kernels, forward, backward and in the KV cache of the eval's generation). f32: the losses within
// 1e-3 of the CPU's and the same greedy answers; bf16 (cuDNN's attention for the layer without a window): losses
// within 0.05 of the CPU's bf16 run. Every step's peaks are its dry run's.
TEST(CudaTrain, AnyresSiglipAndASlidingWindowTrainLikeTheCpuAndEveryPeakItsDryRun) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const std::string base = fresh_dir("cuda_family");
  std::string text = kConfig;
  auto swap = [&](const std::string& from, const std::string& to) {
    const std::size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
  };
  swap("vision: {image_size: 8, patch_size: 4}",
       "vision: {image_size: 8, patch_size: 4, model_type: siglip_vision_model, select_feature: cls_patch}");
  swap("llm: {vocab_size: 300}", "llm: {vocab_size: 300, model_type: qwen2, sliding_window: 8, max_window_layers: 1}");
  swap("image_token_index: 299", "image_token_index: 299\n  image_grid_pinpoints: [[8, 16], [16, 8], [16, 16]]");
  swap("image_size: 8}", "image_size: 16}");
  const std::string cfg = write_config(base, text);
  const std::string steps = " --set train.max_steps=6";
  for (const std::string precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    const std::string sets = steps + " --set memory.precision=" + precision;
    CmdResult cpu = train(cfg, base + "/cpu_" + precision, sets);
    ASSERT_EQ(cpu.status, 0) << cpu.output;
    ASSERT_NE(cpu.output.find("images: AnyRes"), std::string::npos) << cpu.output;
    CmdResult gpu = train(cfg, base + "/gpu_" + precision, sets + " --set device.type=cuda:0");
    ASSERT_EQ(gpu.status, 0) << gpu.output;
    EXPECT_EQ(gpu.output.find("WARNING"), std::string::npos) << gpu.output;
    const auto a = jsonl(base + "/cpu_" + precision + "/memory.jsonl");
    const auto b = jsonl(base + "/gpu_" + precision + "/memory.jsonl");
    ASSERT_EQ(a.size(), 6u);
    ASSERT_EQ(b.size(), 6u);
    for (std::size_t i = 0; i < a.size(); ++i) {
      // 8 sequences a step, on average longer than twice the window
      EXPECT_GT(a[i]["tokens"].get<int64_t>(), 8 * 8 * 2) << "step " << i + 1;
      EXPECT_NEAR(b[i]["loss"].get<double>(), a[i]["loss"].get<double>(), precision == "fp32" ? 1e-3 : 5e-2)
          << "step " << i + 1;
      EXPECT_EQ(b[i]["peak_allocated"], b[i]["predicted_peak"]) << "step " << i + 1;
      EXPECT_EQ(b[i]["peak_reserved"], b[i]["predicted_reserved"]) << "step " << i + 1;
    }
    if (precision == "fp32") {  // the eval's greedy answers, generated through the windowed KV cache
      auto answers = [](const std::string& out) {
        std::string s;
        for (std::size_t at = out.find("eval-"); at != std::string::npos; at = out.find("eval-", at + 1))
          s += out.substr(at, out.find('\n', at) - at) + "\n";
        return s;
      };
      EXPECT_FALSE(answers(cpu.output).empty()) << cpu.output;
      EXPECT_EQ(answers(gpu.output), answers(cpu.output));
    }
  }
}

// Full checkpointing with the LLM's last block kept whole (the planner's choice where its dry runs show that adds no
// peak, as on the small preset in f32): the plan says so on the GPU as on the CPU, every step's peaks are its dry
// run's, the losses are the CPU's, and they are the bits of the same run without checkpointing on the GPU (the
// recomputed blocks and the kept one give the forward's own values; f32 takes the own attention kernels, which sum
// in a fixed order).
TEST(CudaTrain, AKeptLastBlockTrainsLikeTheCpuAndLikeNoCheckpointing) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const std::string base = fresh_dir("cuda_kept_block");
  const std::string cfg = write_config(base, R"(model: {preset: small}
data: {synthetic: {train: 16, eval: 2, image_size: 32}, system_prompt: "", max_seq_len: 112, pad_to_max_length: true}
train: {stage: full, micro_batch_size: 2, global_batch_size: 4, max_steps: 4, eval_steps: 0, save_steps: 0}
log: {progress_bar: false}
)");
  auto run_on = [&](const std::string& name, const std::string& sets) {
    CmdResult r = train(cfg, base + "/" + name, sets);
    EXPECT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(r.output.find("WARNING"), std::string::npos) << r.output;
    const json plan = json::parse(std::ifstream(base + "/" + name + "/plan.json"));
    return std::make_pair(plan["decisions"], jsonl(base + "/" + name + "/memory.jsonl"));
  };
  const auto [cpu_plan, cpu] = run_on("cpu", "--set memory.gradient_checkpointing=full");
  const auto [gpu_plan, gpu] = run_on("gpu", "--set memory.gradient_checkpointing=full --set device.type=cuda:0");
  const auto [none_plan, none] = run_on("none", "--set memory.gradient_checkpointing=none --set device.type=cuda:0");
  EXPECT_TRUE(cpu_plan["llm_last_block_kept"].get<bool>()) << cpu_plan.dump();
  ASSERT_TRUE(gpu_plan["llm_last_block_kept"].get<bool>()) << gpu_plan.dump();
  EXPECT_FALSE(none_plan["llm_last_block_kept"].get<bool>()) << none_plan.dump();
  ASSERT_EQ(cpu.size(), 4u);
  ASSERT_EQ(gpu.size(), 4u);
  ASSERT_EQ(none.size(), 4u);
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    EXPECT_NEAR(gpu[i]["loss"].get<double>(), cpu[i]["loss"].get<double>(), 1e-3) << "step " << i + 1;
    EXPECT_EQ(gpu[i]["loss"].get<double>(), none[i]["loss"].get<double>()) << "step " << i + 1;
    for (const auto* run : {&gpu, &none}) {
      EXPECT_EQ((*run)[i]["peak_allocated"], (*run)[i]["predicted_peak"]) << "step " << i + 1;
      EXPECT_EQ((*run)[i]["peak_reserved"], (*run)[i]["predicted_reserved"]) << "step " << i + 1;
    }
  }
  EXPECT_LT(gpu[0]["peak_allocated"].get<int64_t>(), none[0]["peak_allocated"].get<int64_t>());
}
