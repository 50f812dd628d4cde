// Multi-rank training under mpirun (label mpi): ZeRO stages 0-3 with and without optimizer offload give the
// per-step losses of a single process with the same global batch; per-rank memory by category shrinks as
// the ZeRO formulas say; sharded checkpoints resume at another world size and stage and consolidate into one
// model; evaluation is shared between the ranks and merges to one process's result; a killed rank takes the
// whole job down quickly.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "core/backend/device_info.h"
#include "core/check.h"
#include "core/io/safetensors.h"
#include "integration/cli.h"

using namespace hr;
using namespace hr::testing_cli;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// f32 losses of the same global batch agree to this: only the order of the gradient sums differs.
constexpr double kLossTolerance = 1e-4;

const char* kConfig = R"(model:
  preset: tiny
  vision: {image_size: 8, patch_size: 4}
  llm: {vocab_size: 300}
  image_token_index: 299
data:
  synthetic: {train: 64, eval: 8, image_size: 8}
  system_prompt: ""
  num_workers: 1
train:
  stage: full
  micro_batch_size: 4
  global_batch_size: 8
  max_steps: 20
  learning_rate: 0.003
  warmup_steps: 1
  max_new_tokens: 2
log:
  logging_steps: 5
  progress_bar: false
)";

std::string config(const std::string& dir) {
  return write_config(dir, kConfig);
}

const std::string kMpirun = std::string("env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ") + HR_MPIEXEC +
                            " --oversubscribe -np ";

CmdResult train(int ranks, const std::string& cfg, const std::string& out, const std::string& sets) {
  const std::string cmd = std::string(HR_HEADROOM_BIN) + " train " + cfg + " --set run.output_dir=" + out + " " + sets;
  return run(ranks == 1 ? cmd : str(kMpirun, ranks, " ", cmd));
}

std::vector<double> losses(const std::string& path) {
  std::vector<double> v;
  for (const json& l : jsonl(path)) v.push_back(l["loss"].get<double>());
  return v;
}

json last_line(const std::string& path) {
  return jsonl(path).back();
}

// Every rank of the run in `out`: each step's measured peaks equal its dry run's, byte for byte, and its losses
// equal the single process's `ref`.
void expect_exact_and_like_single(const std::string& out, int ranks, const std::vector<double>& ref,
                                  const std::string& what) {
  for (int rank = 0; rank < ranks; ++rank) {
    for (const json& l : jsonl(str(out, "/memory.rank", rank, ".jsonl"))) {
      EXPECT_EQ(l["peak_allocated"], l["predicted_peak"]) << what << " rank " << rank << " step " << l["step"];
      EXPECT_EQ(l["peak_reserved"], l["predicted_reserved"]) << what << " rank " << rank << " step " << l["step"];
    }
    const auto got = losses(str(out, "/memory.rank", rank, ".jsonl"));
    ASSERT_EQ(got.size(), ref.size()) << what;
    for (std::size_t i = 0; i < ref.size(); ++i)
      EXPECT_NEAR(got[i], ref[i], kLossTolerance) << what << " rank " << rank << " step " << i + 1;
  }
}

}  // namespace

TEST(Mpi, ZeroStagesMatchASingleProcessAndShrinkMemoryAsTheFormulasSay) {
  const std::string base = fresh_dir("mpi_zero");
  const std::string cfg = config(base);
  CmdResult single = train(1, cfg, base + "/single", "");
  ASSERT_EQ(single.status, 0) << single.output;
  const auto ref = losses(base + "/single/memory.jsonl");
  ASSERT_EQ(ref.size(), 20u);
  EXPECT_LT(ref.back(), 0.8 * ref.front());
  const auto one = jsonl(base + "/single/memory.jsonl");
  std::map<std::string, json> mem;
  for (int stage = 0; stage <= 3; ++stage)
    for (const char* offload : {"none", "cpu"}) {
      const std::string name = str("z", stage, "_", offload), out = str(base, "/", name);
      CmdResult r =
          train(2, cfg, out, str("--set memory.zero_stage=", stage, " --set memory.offload_optimizer=", offload));
      ASSERT_EQ(r.status, 0) << name << "\n" << r.output;
      for (int rank = 0; rank < 2; ++rank) {
        // Each rank's measured peaks equal the planner's dry run of that rank's step, byte for byte.
        for (const json& l : jsonl(str(out, "/memory.rank", rank, ".jsonl"))) {
          EXPECT_EQ(l["peak_allocated"], l["predicted_peak"]) << name << " rank " << rank << " step " << l["step"];
          EXPECT_EQ(l["peak_reserved"], l["predicted_reserved"]) << name << " rank " << rank << " step " << l["step"];
        }
        const auto got = losses(str(out, "/memory.rank", rank, ".jsonl"));
        ASSERT_EQ(got.size(), ref.size()) << name;
        for (std::size_t i = 0; i < ref.size(); ++i)
          EXPECT_NEAR(got[i], ref[i], kLossTolerance) << name << " rank " << rank << " step " << i + 1;
        // Every rank logs the step's tokens and labelled tokens over both ranks: the single process's.
        const auto lines = jsonl(str(out, "/memory.rank", rank, ".jsonl"));
        for (std::size_t i = 0; i < lines.size(); ++i) {
          EXPECT_EQ(lines[i]["tokens"], one[i]["tokens"]) << name << " rank " << rank << " step " << i + 1;
          EXPECT_EQ(lines[i]["loss_tokens"], one[i]["loss_tokens"]) << name << " rank " << rank << " step " << i + 1;
          // And the FLOPs both ranks' products ran: the single process's, but for the loss's last chunk, which each
          // micro-batch cuts to its own labelled rows rounded up.
          EXPECT_NEAR(lines[i]["flops"].get<double>() / one[i]["flops"].get<double>(), 1.0, 0.05)
              << name << " rank " << rank << " step " << i + 1;
        }
      }
      mem[name] = last_line(out + "/memory.rank0.jsonl");
    }
  auto dev = [&](const std::string& run, const char* cat) { return mem[run]["by_category"][cat].get<int64_t>(); };
  auto host = [&](const std::string& run, const char* cat) {
    return mem[run]["host"]["by_category"][cat].get<int64_t>();
  };
  // Stage 1 halves the optimizer states (plus per-parameter padding and allocator rounding).
  EXPECT_LE(dev("z1_none", "optimizer"), dev("z0_none", "optimizer") / 2 + 4096);
  // Stage 2 keeps gradient shards plus one group's full gradients while it is reduced.
  EXPECT_LT(dev("z2_none", "grads"), dev("z1_none", "grads"));
  // Stage 3 keeps parameter shards plus the gathered groups in use.
  EXPECT_LT(dev("z3_none", "params"), dev("z2_none", "params"));
  for (int stage = 0; stage <= 3; ++stage) {
    const std::string off = str("z", stage, "_cpu"), on = str("z", stage, "_none");
    EXPECT_EQ(dev(off, "optimizer"), 0) << off;
    EXPECT_EQ(dev(off, "master_params"), 0) << off;
    // The same states, on the host: the same flat shards from stage 1 on; at stage 0 one flat buffer per
    // group instead of one tensor per parameter (less allocator rounding).
    if (stage > 0)
      EXPECT_EQ(host(off, "optimizer"), dev(on, "optimizer")) << off;
    else
      EXPECT_GE(host(off, "optimizer"), dev(on, "optimizer") * 9 / 10) << off;
  }
}

TEST(Mpi, LoraUnderZeroMatchesASingleProcess) {
  // LoRA's adapters train beside a frozen base in the same layers: ZeRO shards each layer's frozen and
  // trainable parameters as two parts. Dropout off, so that two ranks and one process draw nothing different.
  const std::string base = fresh_dir("mpi_lora");
  const std::string cfg = config(base);
  const std::string lora = " --set lora.enable=true --set lora.r=4 --set lora.alpha=8 --set lora.dropout=0";
  CmdResult single = train(1, cfg, base + "/single", lora);
  ASSERT_EQ(single.status, 0) << single.output;
  const auto ref = losses(base + "/single/memory.jsonl");
  ASSERT_EQ(ref.size(), 20u);
  EXPECT_LT(ref.back(), ref.front());
  for (const char* sets : {" --set memory.zero_stage=0", " --set memory.zero_stage=2",
                           " --set memory.zero_stage=3 --set memory.offload_optimizer=cpu"}) {
    const std::string out = str(base, "/z", sets[std::string(sets).find('=') + 1]);
    CmdResult r = train(2, cfg, out, lora + sets);
    ASSERT_EQ(r.status, 0) << sets << "\n" << r.output;
    expect_exact_and_like_single(out, 2, ref, sets);
  }
}

// 8-bit AdamW under ZeRO: each rank's block of a parameter is rounded up to whole 256-element blocks of its codes,
// so that a shard's blocks (and their scales) are blocks of the whole parameter, and the parameters whose moments
// stay f32 (tables, small ones) are parts of their own. Every stage, with the states on the device or the host,
// steps like one process, and without clipping (whose norm each stage sums in its own order) bit for bit like two
// ranks at stage 0, which step whole parameters; the sharded checkpoint resumes on one rank (its scales resharded
// by block).
TEST(Mpi, AdamW8bitUnderZeroAndOffloadMatchesASingleProcessAndResumesAtAnotherWorldSize) {
  const std::string base = fresh_dir("mpi_8bit");
  const std::string cfg = config(base);
  // Wide enough for codes: lm_head (300 x 64) and the MLP's projections (90 x 64: 22.5 blocks, so each rank's
  // block of 2,880 elements rounds up to 3,072 and the last block is a part one) keep 8-bit moments; the norms and
  // the embedding tables f32 ones.
  const std::string eight =
      " --set train.optimizer=adamw_8bit --set train.save_steps=10 --set model.llm.hidden_size=64"
      " --set model.llm.intermediate_size=90 --set train.max_grad_norm=0";
  CmdResult single = train(1, cfg, base + "/single", eight);
  ASSERT_EQ(single.status, 0) << single.output;
  const auto ref = losses(base + "/single/memory.jsonl");
  ASSERT_EQ(ref.size(), 20u);
  EXPECT_LT(ref.back(), 0.8 * ref.front());
  for (const char* sets :
       {" --set memory.zero_stage=0", " --set memory.zero_stage=1", " --set memory.zero_stage=2",
        " --set memory.zero_stage=3", " --set memory.zero_stage=3 --set memory.offload_optimizer=cpu",
        " --set memory.zero_stage=0 --set memory.offload_optimizer=cpu"}) {
    const std::string set = sets;
    const std::string out = str(base, "/z", set[set.find('=') + 1], set.find("cpu") != std::string::npos ? "_cpu" : "");
    CmdResult r = train(2, cfg, out, eight + sets);
    ASSERT_EQ(r.status, 0) << sets << "\n" << r.output;
    expect_exact_and_like_single(out, 2, ref, sets);
  }
  auto optimizer = [&](const std::string& run, const char* where) {
    const json l = last_line(base + "/" + run);
    return (std::string(where) == "host" ? l["host"]["by_category"] : l["by_category"])["optimizer"].get<int64_t>();
  };
  // A rank keeps half the codes and scales, plus the padding of its blocks to whole ones; offloaded, the host does.
  EXPECT_LE(optimizer("z1/memory.rank0.jsonl", "device"), optimizer("single/memory.jsonl", "device") / 2 + 16384);
  EXPECT_EQ(optimizer("z3_cpu/memory.rank0.jsonl", "device"), 0);
  EXPECT_EQ(optimizer("z3_cpu/memory.rank0.jsonl", "host"), optimizer("z3/memory.rank0.jsonl", "device"));
  core::Checkpoint shard = core::Checkpoint::open(base + "/z3/checkpoint-10/optimizer.rank1.safetensors");
  EXPECT_EQ(shard.get("zero.block_align").to_ints().at(0), 256);
  const std::string layer = "language_model.model.layers.0";
  EXPECT_EQ(shard.get(layer + ".trainable.absmax2").numel() * 256, shard.get(layer + ".trainable.state2").numel());
  EXPECT_TRUE(shard.contains(layer + ".trainable_f32.exp_avg_sq")) << "the norms keep f32 moments";
  EXPECT_TRUE(shard.contains("language_model.model.embed_tokens.exp_avg")) << "so does the table";
  // One process at stage 1 continues from the two-rank ZeRO-3 checkpoint.
  const std::string out = base + "/resumed";
  fs::create_directories(out);
  fs::copy(base + "/z3/checkpoint-10", out + "/checkpoint-10", fs::copy_options::recursive);
  CmdResult b = train(1, cfg, out, eight + " --resume --set memory.zero_stage=1");
  ASSERT_EQ(b.status, 0) << b.output;
  EXPECT_NE(b.output.find("resumed from"), std::string::npos) << b.output;
  const auto got = losses(out + "/memory.jsonl");
  ASSERT_EQ(got.size(), 10u);
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], ref[10 + i], kLossTolerance) << "step " << 11 + i;
  // Every stage's final model is, bit for bit, the one two ranks write at stage 0 (the ZeRO-3 ones consolidated).
  core::Checkpoint want = core::Checkpoint::open(base + "/z0/checkpoint-20/model.safetensors");
  for (const char* run_name : {"z1", "z2", "z3", "z3_cpu", "z0_cpu"}) {
    const std::string ckpt = str(base, "/", run_name, "/checkpoint-20"),
                      path = str(base, "/", run_name, ".safetensors");
    CmdResult c = run(str(HR_HEADROOM_BIN, " ckpt consolidate ", ckpt, " --out ", path));
    ASSERT_EQ(c.status, 0) << c.output;
    core::Checkpoint got = core::Checkpoint::open(path);
    ASSERT_EQ(got.names().size(), want.names().size()) << run_name;
    for (const std::string& n : want.names()) {
      ASSERT_TRUE(got.contains(n)) << run_name << " " << n;
      EXPECT_EQ(got.get(n).to_floats(), want.get(n).to_floats()) << run_name << " " << n;
    }
  }
}

TEST(Mpi, TheLlavaFamilyUnderZeroMatchesASingleProcess) {
  // The planner, ZeRO, LoRA/QLoRA and the memory log see parameters and groups, not architectures: Qwen2's q/k/v
  // biases, SigLIP's tower and a tied lm_head are sharded, gathered and predicted like every other parameter (the
  // tied head borrows the embedding's group: gathered for it, its gradient reduced when it ends, at stages 2 and 3).
  struct Member {
    std::string name, sets;
    int stage;
  };
  const std::string siglip =
      " --set model.vision.model_type=siglip_vision_model --set model.vision.select_feature=cls_patch";
  const Member family[] = {
      {"qwen2", "", 3},
      {"mistral", "", 3},
      {"siglip_qwen2", siglip, 3},
      {"siglip_qwen2_tied", siglip + " --set model.llm.tie_word_embeddings=true", 3},
      // A global batch of 16 from micro-batches of 4: two micro-batches a step on each of two ranks.
      {"qwen2_tied_offload",
       " --set model.llm.tie_word_embeddings=true --set memory.offload_optimizer=cpu --set train.global_batch_size=16",
       2},
      // LoRA on the biased projections (the biases stay frozen with the base), and QLoRA's 4-bit base beside them.
      {"qwen2_lora", " --set lora.enable=true --set lora.r=4 --set lora.alpha=8 --set lora.dropout=0", 3},
      {"mistral_qlora", " --set lora.enable=true --set lora.r=4 --set lora.dropout=0 --set lora.base_bits=4", 3},
  };
  for (const Member& m : family) {
    const std::string decoder = m.name.find("qwen2") != std::string::npos ? "qwen2" : "mistral";
    const std::string base = fresh_dir("mpi_" + m.name);
    const std::string cfg = config(base);
    const std::string sets = str(" --set model.llm.model_type=", decoder,
                                 " --set model.llm.rope_theta=1000000 --set train.max_steps=6", m.sets);
    CmdResult single = train(1, cfg, base + "/single", sets);
    ASSERT_EQ(single.status, 0) << single.output;
    const auto ref = losses(base + "/single/memory.jsonl");
    ASSERT_EQ(ref.size(), 6u);
    EXPECT_LT(ref.back(), ref.front()) << m.name;
    const std::string out = str(base, "/z", m.stage);
    CmdResult r = train(2, cfg, out, str(sets, " --set memory.zero_stage=", m.stage));
    ASSERT_EQ(r.status, 0) << m.name << "\n" << r.output;
    expect_exact_and_like_single(out, 2, ref, m.name);
  }
}

TEST(Mpi, QloraUnderZero3MatchesASingleProcessAndMerges) {
  // A 4-bit base is a part of its own in each layer ("<layer>.quantized"): ZeRO-3 shards and gathers its bytes.
  // Its checkpoint holds them as shards; lora merge consolidates them by the model as it trained, then
  // dequantizes.
  const std::string base = fresh_dir("mpi_qlora");
  const std::string cfg = config(base);
  const std::string qlora =
      " --set lora.enable=true --set lora.r=4 --set lora.alpha=8 --set lora.dropout=0 "
      "--set lora.base_bits=4 --set train.max_steps=6";
  CmdResult single = train(1, cfg, base + "/single", qlora);
  ASSERT_EQ(single.status, 0) << single.output;
  const auto ref = losses(base + "/single/memory.jsonl");
  CmdResult z3 = train(2, cfg, base + "/z3", qlora + " --set memory.zero_stage=3");
  ASSERT_EQ(z3.status, 0) << z3.output;
  for (int rank = 0; rank < 2; ++rank) {
    const auto got = losses(str(base, "/z3/memory.rank", rank, ".jsonl"));
    ASSERT_EQ(got.size(), ref.size());
    for (std::size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(got[i], ref[i], kLossTolerance) << "step " << i + 1;
    for (const json& l : jsonl(str(base, "/z3/memory.rank", rank, ".jsonl")))
      EXPECT_EQ(l["peak_allocated"], l["predicted_peak"]) << "rank " << rank << " step " << l["step"];
  }
  EXPECT_FALSE(fs::exists(base + "/z3/checkpoint-6/model.safetensors")) << "ZeRO-3 saves shards";
  for (const char* run : {"single", "z3"}) {
    CmdResult m = hr::testing_cli::run(
        str(HR_HEADROOM_BIN, " lora merge ", base, "/", run, "/checkpoint-6 --out ", base, "/", run, "-merged"));
    ASSERT_EQ(m.status, 0) << run << "\n" << m.output;
  }
  const core::SafetensorsFile a = core::SafetensorsFile::open(base + "/single-merged/model.safetensors");
  const core::SafetensorsFile b = core::SafetensorsFile::open(base + "/z3-merged/model.safetensors");
  const std::string w = "language_model.model.layers.0.mlp.down_proj.weight";
  ASSERT_EQ(a.dtype(w), core::DType::F32);
  ASSERT_EQ(a.shape(w), b.shape(w));
  const std::vector<float> x = a.get(w).to_floats(), y = b.get(w).to_floats();
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], y[i], 1e-4) << w << " " << i;
}

TEST(Mpi, APlanForTwoRanksIsWhatEachRankMeasures) {
  // Fixed shapes run whole, so every step is the planned worst case. `headroom plan --world-size 2` runs in one process
  // and sizes each rank's workspaces for the threads that rank will have (oneDNN's scratchpads depend on it).
  const std::string base = fresh_dir("mpi_plan");
  const std::string cfg = config(base);
  const std::string sets =
      " --set data.pad_to_max_length=true --set data.max_seq_len=40 --set train.max_steps=3"
      " --set train.padding_free=false";
  for (int stage : {0, 3}) {
    const std::string stage_set = str(" --set memory.zero_stage=", stage);
    CmdResult p = run(str(HR_HEADROOM_BIN, " plan ", cfg, " --world-size 2 --json", sets, stage_set));
    ASSERT_EQ(p.status, 0) << p.output;
    const json plan = json::parse(p.output);
    const std::string out = str(base, "/z", stage);
    CmdResult r = train(2, cfg, out, sets + stage_set);
    ASSERT_EQ(r.status, 0) << r.output;
    for (int rank = 0; rank < 2; ++rank)
      for (const json& l : jsonl(str(out, "/memory.rank", rank, ".jsonl"))) {
        EXPECT_EQ(l["peak_allocated"], plan["ranks"][0]["peak_allocated"]) << "stage " << stage << " rank " << rank;
        EXPECT_EQ(l["peak_reserved"], plan["ranks"][0]["peak_reserved"]) << "stage " << stage << " rank " << rank;
      }
  }
}

namespace {

// A 2-rank run with `sets` whose every step on every rank must equal its dry run, rank 0's losses, and the
// events of `headroom plan --world-size 2 --trace` for the same config.
struct TracedRun {
  std::vector<double> losses;
  json events;
};

TracedRun traced_run(const std::string& cfg, const std::string& out, const std::string& sets) {
  TracedRun t;
  CmdResult r = train(2, cfg, out, sets);
  EXPECT_EQ(r.status, 0) << r.output;
  if (r.status != 0) return t;
  for (int rank = 0; rank < 2; ++rank)
    for (const json& l : jsonl(str(out, "/memory.rank", rank, ".jsonl"))) {
      EXPECT_EQ(l["peak_allocated"], l["predicted_peak"]) << sets << " rank " << rank << " step " << l["step"];
      EXPECT_EQ(l["peak_reserved"], l["predicted_reserved"]) << sets << " rank " << rank << " step " << l["step"];
    }
  t.losses = losses(out + "/memory.rank0.jsonl");
  const std::string trace = out + "/plan_trace.json";
  CmdResult p = run(str(HR_HEADROOM_BIN, " plan ", cfg, " --world-size 2 --trace ", trace, sets));
  EXPECT_EQ(p.status, 0) << p.output;
  std::ifstream f(trace);
  t.events = json::parse(f)["traceEvents"];
  return t;
}

// A decoder layer of the tiny LLaMA (hidden 32, 4 heads / 2 kv heads of 8, MLP 64) in f32 bytes: q, k, v, o, gate,
// up, down and two norms.
constexpr int64_t kTinyLayerBytes = 4 * (32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 64 + 2 * 32);

const std::string kFixedShapes = " --set data.pad_to_max_length=true --set data.max_seq_len=40 --set train.max_steps=4";

}  // namespace

// ZeRO-3 with parallel.prefetch_groups: 1 (the default) starts the next group's all-gather (MPI_Iallgather) before
// the current group computes. The arithmetic is the same as without prefetching (the same losses, bit for bit),
// every rank's peaks still equal its dry run, and in the dry run's timeline the next decoder layer's all-gather
// starts inside the current layer's forward, whose parameters in memory then include the next layer's.
TEST(Mpi, Zero3PrefetchKeepsTheNextGroupGatheredWhileOneComputesAndThePlanSaysSo) {
  const std::string base = fresh_dir("mpi_prefetch");
  const std::string cfg = config(base);
  const std::string layer0 = "forward language_model.model.layers.0";
  std::map<int, TracedRun> runs;
  std::map<int, int64_t> params_in_layer0;
  std::map<int, bool> started_inside;
  for (int prefetch : {0, 1}) {
    runs[prefetch] =
        traced_run(cfg, str(base, "/p", prefetch),
                   str(kFixedShapes, " --set memory.zero_stage=3 --set parallel.prefetch_groups=", prefetch));
    walk_slices(runs[prefetch].events, [&](const json& e, const std::vector<std::string>& open) {
      const std::string ph = e.value("ph", ""), name = e.value("name", "");
      if (ph == "B" && name == "all_gather start language_model.model.layers.1" && inside(open, layer0))
        started_inside[prefetch] = true;
      if (ph == "C" && name == "device params" && inside(open, layer0))
        params_in_layer0[prefetch] = std::max(params_in_layer0[prefetch], e["args"]["bytes"].get<int64_t>());
    });
  }
  EXPECT_EQ(runs[1].losses, runs[0].losses);
  EXPECT_TRUE(started_inside[1]) << "layer 1's all-gather did not start during layer 0's forward";
  EXPECT_FALSE(started_inside[0]);
  // With prefetching, all of layer 1 is gathered beside layer 0 while layer 0 computes.
  EXPECT_GE(params_in_layer0[1] - params_in_layer0[0], kTinyLayerBytes)
      << "parameters in memory during layer 0's forward: " << params_in_layer0[0] << " B without prefetching, "
      << params_in_layer0[1] << " B with";
}

// parallel.overlap_comm (the default) at ZeRO-2: a group's gradient reduce-scatter (MPI_Ireduce_scatter_block)
// runs while the next group's backward computes and is finished after it. The losses are those of the blocking
// reduce-scatter, bit for bit; every rank's peaks equal its dry run; in the dry run's timeline layer 1's
// reduce-scatter is waited for inside layer 0's backward, with its buffers alive as that backward starts.
TEST(Mpi, Zero2OverlappedReduceScatterRunsUnderTheNextGroupsBackwardAndThePlanSaysSo) {
  const std::string base = fresh_dir("mpi_overlap");
  const std::string cfg = config(base);
  const std::string layer0 = "backward language_model.model.layers.0";
  std::map<bool, TracedRun> runs;
  std::map<bool, bool> waited_in_layer0;
  std::map<bool, int64_t> comm_in_layer0;
  for (bool overlap : {false, true}) {
    runs[overlap] = traced_run(
        cfg, str(base, overlap ? "/on" : "/off"),
        str(kFixedShapes, " --set memory.zero_stage=2 --set parallel.overlap_comm=", overlap ? "true" : "false"));
    int64_t comm_now = 0;
    walk_slices(runs[overlap].events, [&](const json& e, const std::vector<std::string>& open) {
      const std::string ph = e.value("ph", ""), name = e.value("name", "");
      if (ph == "C" && name == "device comm") comm_now = e["args"]["bytes"].get<int64_t>();
      if (ph == "B" && name == "reduce_scatter wait language_model.model.layers.1" && inside(open, layer0))
        waited_in_layer0[overlap] = true;
      // What the comm buffers hold as layer 0's backward begins (its own collectives come after its compute).
      if (ph == "B" && name == layer0) comm_in_layer0[overlap] = std::max(comm_in_layer0[overlap], comm_now);
    });
  }
  EXPECT_EQ(runs[true].losses, runs[false].losses);
  EXPECT_TRUE(waited_in_layer0[true]) << "layer 1's reduce-scatter was not finished during layer 0's backward";
  EXPECT_FALSE(waited_in_layer0[false]);
  // Layer 1's reduce-scatter buffers (its whole gradients, f32, and this rank's half) are alive as layer 0's
  // backward starts computing.
  EXPECT_GE(comm_in_layer0[true] - comm_in_layer0[false], kTinyLayerBytes)
      << "comm bytes as layer 0's backward starts: " << comm_in_layer0[false] << " blocking, " << comm_in_layer0[true]
      << " overlapped";
}

// parallel.overlap_comm (the default) at ZeRO-0: the step's last micro-batch all-reduces its gradients bucket by
// bucket (MPI_Iallreduce) as the groups' backwards end, each bucket while the next group's backward computes,
// instead of all at once after the backward. With buckets of about one decoder layer and two micro-batches per
// step, the losses are those of the blocking all-reduce, bit for bit; every rank's peaks equal its dry run; in
// the dry run's timeline buckets start inside the decoder layers' backwards, and a bucket's buffer is alive as
// layer 0's backward starts.
TEST(Mpi, Zero0BucketedAllReduceRunsUnderTheLastBackwardAndThePlanSaysSo) {
  const std::string base = fresh_dir("mpi_buckets");
  const std::string cfg = config(base);
  const std::string layer0 = "backward language_model.model.layers.0",
                    layer1 = "backward language_model.model.layers.1";
  std::map<bool, TracedRun> runs;
  std::map<bool, int> started_in_layers;
  std::map<bool, int64_t> comm_in_layer0;
  for (bool overlap : {false, true}) {
    runs[overlap] = traced_run(
        cfg, str(base, overlap ? "/on" : "/off"),
        str(kFixedShapes, " --set train.global_batch_size=16 --set parallel.bucket_size=", kTinyLayerBytes + 4096,
            " --set parallel.overlap_comm=", overlap ? "true" : "false"));
    int64_t comm_now = 0;
    walk_slices(runs[overlap].events, [&](const json& e, const std::vector<std::string>& open) {
      const std::string ph = e.value("ph", ""), name = e.value("name", "");
      if (ph == "C" && name == "device comm") comm_now = e["args"]["bytes"].get<int64_t>();
      if (ph == "B" && name.rfind("all_reduce start gradients", 0) == 0 &&
          (inside(open, layer0) || inside(open, layer1)))
        ++started_in_layers[overlap];
      if (ph == "B" && name == layer0) comm_in_layer0[overlap] = std::max(comm_in_layer0[overlap], comm_now);
    });
  }
  ASSERT_EQ(runs[true].losses.size(), 4u);
  EXPECT_EQ(runs[true].losses, runs[false].losses);
  // Layer 1's and layer 0's gradients each close a bucket inside their own backward, on the last micro-batch only.
  EXPECT_EQ(started_in_layers[true], 2);
  EXPECT_EQ(started_in_layers[false], 0);
  EXPECT_EQ(comm_in_layer0[false], 0);
  EXPECT_GE(comm_in_layer0[true], kTinyLayerBytes) << "no gradient bucket in flight as layer 0's backward starts";
}

// memory.offload_optimizer: cpu at ZeRO-2: on the step's last micro-batch each group's reduced gradient shard
// leaves for the host (on a GPU, on the side stream) as soon as its reduction ends, under the backward still to
// come, and the host update reads it there. Every rank's peaks equal its dry run; the losses are those of the
// optimizer on the device within the usual tolerance; in the dry run's timeline the host receives layer 1's
// gradients during layer 0's backward on the last micro-batch, and no gradients on the first.
TEST(Mpi, OffloadedGradientsLeaveForTheHostDuringTheLastBackward) {
  const std::string base = fresh_dir("mpi_offload_side");
  const std::string cfg = config(base);
  const std::string layer0 = "backward language_model.model.layers.0";
  const std::string sets = str(kFixedShapes, " --set train.global_batch_size=16 --set memory.zero_stage=2");
  const TracedRun offload = traced_run(cfg, base + "/offload", sets + " --set memory.offload_optimizer=cpu");
  const TracedRun device = traced_run(cfg, base + "/device", sets);
  ASSERT_EQ(offload.losses.size(), 4u);
  ASSERT_EQ(device.losses.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i)
    EXPECT_NEAR(offload.losses[i], device.losses[i], kLossTolerance) << "step " << i + 1;
  std::vector<int64_t> at_start, most;  // host gradient bytes as each of layer 0's backwards starts, and the most in it
  int64_t host_now = 0;
  walk_slices(offload.events, [&](const json& e, const std::vector<std::string>& open) {
    const std::string ph = e.value("ph", ""), name = e.value("name", "");
    if (ph == "C" && name == "host grads") {
      host_now = e["args"]["bytes"].get<int64_t>();
      if (inside(open, layer0) && !most.empty()) most.back() = std::max(most.back(), host_now);
    }
    if (ph == "B" && name == layer0) at_start.push_back(host_now), most.push_back(host_now);
  });
  ASSERT_EQ(most.size(), 2u) << "one backward of layer 0 per micro-batch";
  EXPECT_EQ(most[0], 0) << "gradients left for the host before the last micro-batch";
  // Layer 1's shard (half its f32 gradients) arrives on the host while layer 0's backward runs.
  EXPECT_GE(most[1] - at_start[1], kTinyLayerBytes / 2);
}

TEST(Mpi, EvaluationIsShardedAcrossRanksAndMergesToOneProcesssResult) {
  // 9 samples in batches of 2: rank 0 evaluates 5, rank 1 4, so rank 1's third batch is a filler; at ZeRO-3
  // the ranks still gather every group together.
  const std::string base = fresh_dir("mpi_eval");
  const std::string cfg = config(base);
  const std::string sets = "--set data.synthetic.eval=9 --set train.eval_batch_size=2 --set train.max_steps=6";
  CmdResult single = train(1, cfg, base + "/single", sets);
  ASSERT_EQ(single.status, 0) << single.output;
  CmdResult two = train(2, cfg, base + "/two", sets + " --set memory.zero_stage=3");
  ASSERT_EQ(two.status, 0) << two.output;
  const json a = last_line(base + "/single/eval.jsonl"), b = last_line(base + "/two/eval.jsonl");
  EXPECT_EQ(b["samples"], 9);
  EXPECT_EQ(a["samples"], b["samples"]);
  EXPECT_NEAR(a["loss"].get<double>(), b["loss"].get<double>(), kLossTolerance);
  const auto pa = jsonl(base + "/single/eval_predictions.jsonl"), pb = jsonl(base + "/two/eval_predictions.jsonl");
  ASSERT_EQ(pa.size(), 9u);
  ASSERT_EQ(pb.size(), 9u);
  for (std::size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i]["id"], pb[i]["id"]) << "merged predictions are in eval-set order";
    EXPECT_EQ(pa[i]["prediction"], pb[i]["prediction"]) << pa[i]["id"];
  }
  EXPECT_EQ(a["accuracy"], b["accuracy"]);
}

TEST(Mpi, ShardedCheckpointsResumeAtAnotherWorldSizeAndConsolidate) {
  const std::string base = fresh_dir("mpi_ckpt");
  const std::string cfg = config(base);
  CmdResult a =
      train(2, cfg, base + "/a", "--set memory.zero_stage=3 --set train.save_steps=10 --set train.save_total_limit=3");
  ASSERT_EQ(a.status, 0) << a.output;
  ASSERT_TRUE(fs::exists(base + "/a/checkpoint-10/optimizer.rank1.safetensors"));
  EXPECT_FALSE(fs::exists(base + "/a/checkpoint-10/model.safetensors")) << "ZeRO-3 parameters live in the shards";
  const auto ref = losses(base + "/a/memory.rank0.jsonl");
  // One process at stage 2, and two ranks at stage 1, continue from the two-rank ZeRO-3 checkpoint.
  for (const auto& [ranks, stage] : {std::pair<int, int>{1, 2}, {2, 1}}) {
    const std::string out = str(base, "/b", ranks, stage);
    fs::create_directories(out);
    fs::copy(base + "/a/checkpoint-10", out + "/checkpoint-10", fs::copy_options::recursive);
    CmdResult b = train(ranks, cfg, out, str("--resume --set memory.zero_stage=", stage));
    ASSERT_EQ(b.status, 0) << b.output;
    EXPECT_NE(b.output.find("resumed from"), std::string::npos) << b.output;
    const auto got = losses(out + (ranks == 1 ? "/memory.jsonl" : "/memory.rank0.jsonl"));
    ASSERT_EQ(got.size(), 10u);
    for (std::size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], ref[10 + i], kLossTolerance) << ranks << " ranks, stage " << stage << ", step " << 11 + i;
  }
  // The consolidated ZeRO-3 model equals the one a stage-0 run writes.
  CmdResult z0 = train(2, cfg, base + "/z0", "");
  ASSERT_EQ(z0.status, 0) << z0.output;
  CmdResult c = run(std::string(HR_HEADROOM_BIN) + " ckpt consolidate " + base + "/a/checkpoint-20 --out " + base +
                    "/full.safetensors");
  ASSERT_EQ(c.status, 0) << c.output;
  core::Checkpoint full = core::Checkpoint::open(base + "/full.safetensors");
  core::Checkpoint want = core::Checkpoint::open(base + "/z0/checkpoint-20/model.safetensors");
  ASSERT_EQ(full.names().size(), want.names().size());
  for (const std::string& n : want.names()) {
    ASSERT_TRUE(full.contains(n)) << n;
    const auto x = full.get(n).to_floats(), y = want.get(n).to_floats();
    ASSERT_EQ(x.size(), y.size()) << n;
    double worst = 0;
    for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, double(std::abs(x[i] - y[i])));
    EXPECT_LT(worst, 1e-4) << n;
  }
}

TEST(Mpi, AKilledRankEndsEveryRankWithinAMinute) {
  const std::string base = fresh_dir("mpi_kill");
  const std::string cfg = config(base);
  const pid_t launcher =
      spawn("exec " + kMpirun + "2 " + HR_HEADROOM_BIN + " train " + cfg + " --set run.output_dir=" + base +
                "/run --set train.max_steps=1000000 --set memory.zero_stage=3",
            base + "/log.txt");
  ASSERT_GT(launcher, 0);
  // Wait until rank 1 is training, then kill it.
  ASSERT_TRUE(wait_for_lines(base + "/run/memory.rank1.jsonl", 1, 60)) << read_file(base + "/log.txt");
  const std::vector<pid_t> ranks = ranks_of(launcher);
  ASSERT_EQ(ranks.size(), 2u);
  const JobEnd end = signal_rank(launcher, ranks, 1, SIGKILL, 60);
  ASSERT_TRUE(end.ended) << "the job was still running 60 s after a rank was killed";
  EXPECT_TRUE(!WIFEXITED(end.status) || WEXITSTATUS(end.status) != 0) << "mpirun exited 0";
  EXPECT_TRUE(process_gone(ranks[0])) << "rank 0 still alive";
  const std::string text = read_file(base + "/log.txt");
  EXPECT_NE(text.find("rank 1"), std::string::npos) << text;
  std::printf("job ended %.1f s after rank 1 was killed\n", end.seconds);
}

// parallel.timeout (PyTorch's and DeepSpeed's timeout): a rank stopped with SIGSTOP kept the other waiting in a
// collective without a word for as long as it stayed stopped (over 180 s). Past the timeout the waiting rank names
// itself and the collective, and the job ends.
TEST(Mpi, AStoppedRankEndsTheJobAfterTheTimeoutNamingTheCollective) {
  const std::string base = fresh_dir("mpi_timeout");
  const std::string cfg = config(base);
  const pid_t launcher =
      spawn("exec " + kMpirun + "2 " + HR_HEADROOM_BIN + " train " + cfg + " --set run.output_dir=" + base +
                "/run --set train.max_steps=1000000 --set parallel.timeout=3",
            base + "/log.txt");
  ASSERT_GT(launcher, 0);
  ASSERT_TRUE(wait_for_lines(base + "/run/memory.rank1.jsonl", 2, 120)) << read_file(base + "/log.txt");
  const std::vector<pid_t> ranks = ranks_of(launcher);
  ASSERT_EQ(ranks.size(), 2u);
  const JobEnd end = signal_rank(launcher, ranks, 1, SIGSTOP, 60);
  for (pid_t r : ranks) kill(r, SIGKILL);  // whatever is left of the stopped rank
  const std::string log = read_file(base + "/log.txt");
  ASSERT_TRUE(end.ended) << "the job was still waiting 60 s after rank 1 stopped:\n" << log;
  EXPECT_TRUE(!WIFEXITED(end.status) || WEXITSTATUS(end.status) != 0) << log;
  // The rank is named once, by the prefix every rank's error gets.
  EXPECT_NE(log.find("headroom: rank 0: [mpi] "), std::string::npos) << log;
  EXPECT_EQ(log.find("[mpi] rank 0: "), std::string::npos) << log;
  EXPECT_NE(log.find(" did not finish within 3 s (parallel.timeout): another rank stopped, hung or died"),
            std::string::npos)
      << log;
  EXPECT_LT(end.seconds, 30.0) << log;
  std::printf("job ended %.1f s after rank 1 stopped (timeout 3 s)\n", end.seconds);
}

// A scheduler's SIGTERM reaching only one rank stops every rank after the same step, with one checkpoint of
// it, and the job exits 0.
TEST(Mpi, SigtermToOneRankStopsEveryRankAfterTheSameStep) {
  const std::string base = fresh_dir("mpi_sigterm");
  const std::string cfg = config(base);
  const pid_t launcher = testing_cli::spawn("exec " + kMpirun + "2 " + HR_HEADROOM_BIN + " train " + cfg +
                                                " --set run.output_dir=" + base +
                                                "/run --set train.max_steps=1000000 --set memory.zero_stage=2",
                                            base + "/log.txt");
  ASSERT_GT(launcher, 0);
  ASSERT_TRUE(testing_cli::wait_for_lines(base + "/run/memory.rank1.jsonl", 3, 120))
      << testing_cli::read_file(base + "/log.txt");
  const std::vector<pid_t> ranks = ranks_of(launcher);
  ASSERT_EQ(ranks.size(), 2u);
  const JobEnd end = signal_rank(launcher, ranks, 1, SIGTERM, 60);
  ASSERT_TRUE(end.ended) << "the job was still running 60 s after SIGTERM";
  const int status = end.status;
  const std::string log = testing_cli::read_file(base + "/log.txt");
  ASSERT_TRUE(WIFEXITED(status)) << log;
  EXPECT_EQ(WEXITSTATUS(status), 0) << log;
  const int64_t step0 = last_line(base + "/run/memory.rank0.jsonl")["step"];
  const int64_t step1 = last_line(base + "/run/memory.rank1.jsonl")["step"];
  EXPECT_EQ(step0, step1);
  EXPECT_TRUE(fs::exists(str(base, "/run/checkpoint-", step0))) << log;
  EXPECT_NE(log.find(str("saving the checkpoint of step ", step0)), std::string::npos) << log;
}

// Exposed communication (memory.jsonl's comm_exposed_s) is the time a rank stood still for the others: with rank
// 1 stopped for 2 s in the middle of a run, one step of rank 0 holds those 2 s, and its other steps little.
TEST(Mpi, ARankWaitingForAnotherReportsItAsExposedCommunication) {
  const std::string base = fresh_dir("mpi_exposed");
  const std::string cfg = config(base);
  const pid_t launcher =
      spawn("exec " + kMpirun + "2 " + HR_HEADROOM_BIN + " train " + cfg + " --set run.output_dir=" + base +
                "/run --set train.max_steps=1000000 --set memory.zero_stage=2 "
                "--set log.logging_steps=1",
            base + "/log.txt");
  ASSERT_GT(launcher, 0);
  const JobEnd end = pause_rank_then_stop(launcher, base + "/run", 2);
  const std::string log = read_file(base + "/log.txt");
  ASSERT_TRUE(end.ended) << log;
  ASSERT_TRUE(WIFEXITED(end.status) && WEXITSTATUS(end.status) == 0) << log;
  const std::size_t waited = expect_rank0_waited_once(base + "/run", 2.0);
  EXPECT_NE(log.find(str("step ", waited + 1, "/")), std::string::npos) << log;
  EXPECT_NE(log.find(" exposed | "), std::string::npos) << log;
}

// Ranks with different room (here device.memory_limit per rank, as a GPU another process already fills would be)
// all plan with the least of it, so that `auto` decides alike on every rank: rank 0 alone would take micro-batches
// of 4, rank 1 only fits 2, and both train with 2, every step predicted exactly. With too little room on rank 1,
// every rank stops with the same account before any collective of the step.
TEST(Mpi, EveryRankPlansWithTheLeastRoomOfAnyRank) {
  const std::string base = fresh_dir("mpi_least_room");
  const std::string cfg = config(base);
  const std::string common =
      str(HR_HEADROOM_BIN, " train ", cfg, " --set data.pad_to_max_length=true --set data.max_seq_len=256",
          " --set train.micro_batch_size=auto --set train.max_steps=3 --set memory.allocator=caching",
          " --set run.output_dir=");
  auto two = [&](const std::string& out, const char* room0, const char* room1) {
    return run(str(kMpirun, "1 ", common, out, " --set device.memory_limit=", room0, " : -np 1 ", common, out,
                   " --set device.memory_limit=", room1));
  };
  CmdResult ok = two(base + "/fits", "64MiB", "8MiB");
  ASSERT_EQ(ok.status, 0) << ok.output;
  EXPECT_NE(ok.output.find("planned with rank 1's room"), std::string::npos) << ok.output;
  std::ifstream plan_file(base + "/fits/plan.json");
  const json plan = json::parse(plan_file);
  EXPECT_EQ(plan["decisions"]["micro_batch_size"], 2) << plan.dump();
  for (int rank = 0; rank < 2; ++rank) {
    const auto lines = jsonl(str(base, "/fits/memory.rank", rank, ".jsonl"));
    ASSERT_EQ(lines.size(), 3u) << rank;
    for (const json& l : lines)
      EXPECT_EQ(l["peak_allocated"], l["predicted_peak"]) << "rank " << rank << " " << l.dump();
  }
  CmdResult no = two(base + "/tight", "64MiB", "1MiB");
  EXPECT_NE(no.status, 0) << no.output;
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_NE(no.output.find(str("headroom: rank ", rank, ": [plan] the run does not fit")), std::string::npos)
        << "rank " << rank << "\n"
        << no.output;
  EXPECT_NE(no.output.find("rank 1's room: every rank plans with the least"), std::string::npos) << no.output;
}

// memory.on_oom: shrink_micro_batch cannot work across ranks (the rank that ran out would redo its step alone):
// every rank refuses it at start, with the reason.
TEST(Mpi, ShrinkingOnOutOfMemoryIsRefusedByEveryRank) {
  const std::string base = fresh_dir("mpi_shrink");
  CmdResult r = train(2, config(base), base + "/run", "--set memory.on_oom=shrink_micro_batch");
  EXPECT_NE(r.status, 0) << r.output;
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_NE(r.output.find(str("rank ", rank, ": [config] memory.on_oom: shrink_micro_batch")), std::string::npos)
        << rank << "\n"
        << r.output;
}

// device.type: cuda under mpirun on a machine without a GPU: every rank stops with the reason, printed by each
// before the job ends (on a machine with GPUs this trains instead, and is skipped).
TEST(Mpi, RanksOnCudaWithoutAGpuEachSaySo) {
  if (!core::query_cuda().gpus.empty()) GTEST_SKIP() << "this machine has a GPU";
  const std::string base = fresh_dir("mpi_no_gpu");
  CmdResult r = train(2, config(base), base + "/run", "--set device.type=cuda");
  EXPECT_NE(r.status, 0) << r.output;
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_NE(r.output.find(str("rank ", rank, ": [device] device.type cuda: this machine has no GPU to train on")),
              std::string::npos)
        << rank << "\n"
        << r.output;
}
