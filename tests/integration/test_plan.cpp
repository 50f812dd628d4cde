// The planner against real runs on a capped CPU device: the dry run's peaks equal the measured ones byte for
// byte over many strategy combinations; pre-flight refuses what does not fit and names fixes; auto picks the
// checkpoint policy and micro-batch memory allows; --max-micro-batch agrees with real runs at that size and
// one above (which runs out of memory); memory.on_oom: shrink_micro_batch recovers without losing a sample.
#include <gtest/gtest.h>

#include <map>

#include "core/check.h"
#include "integration/cli.h"

using namespace hr;
using namespace hr::testing_cli;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const char* kConfig = R"(model:
  preset: small
data:
  synthetic: {train: 48, eval: 4, image_size: 32}
  system_prompt: ""
  max_seq_len: 112
  pad_to_max_length: true
  num_workers: 1
train:
  stage: full
  # Every step the planned worst case: the fixed shapes of pad_to_max_length run whole (padding-free steps are
  # smaller than the plan; one combination below).
  padding_free: false
  micro_batch_size: 2
  max_steps: 2
  learning_rate: 0.001
  max_new_tokens: 2
device:
  memory_limit: 512MiB
log:
  logging_steps: 1
  progress_bar: false
)";

std::string config(const std::string& dir) {
  return write_config(dir, kConfig);
}

CmdResult headroom(const std::string& args) {
  return run(std::string(HR_HEADROOM_BIN) + " " + args);
}

json plan_json(const std::string& cfg, const std::string& sets) {
  CmdResult r = headroom("plan " + cfg + " --json " + sets);
  EXPECT_TRUE(r.status == 0 || WEXITSTATUS(r.status) == 3) << r.output;
  return json::parse(r.output);
}

}  // namespace

// Accumulation of 4 or more: the dry run records the later micro-batches as repetitions (Predictor::step).
std::vector<std::string> strategy_combinations() {
  return {
      "--set memory.precision=fp32",
      "--set memory.precision=bf16 --set memory.gradient_checkpointing=selective --set "
      "train.gradient_accumulation_steps=2",
      "--set memory.precision=fp16 --set memory.gradient_checkpointing=full --set train.micro_batch_size=1 --set "
      "train.gradient_accumulation_steps=7",
      "--set train.stage=finetune --set memory.gradient_checkpointing.llm=selective --set train.micro_batch_size=4",
      "--set train.stage=pretrain --set memory.precision=bf16 --set memory.gradient_checkpointing.llm=full",
      "--set memory.gradient_checkpointing.vision=selective --set memory.offload_optimizer=cpu --set "
      "train.gradient_accumulation_steps=5",
      "--set memory.precision=bf16 --set memory.gradient_checkpointing.vision=full --set "
      "memory.gradient_checkpointing.llm=selective --set memory.zero_stage=1 --set train.micro_batch_size=1",
      "--set memory.zero_stage=2 --set train.gradient_accumulation_steps=4",
      "--set memory.precision=bf16 --set memory.zero_stage=3 --set train.micro_batch_size=1 --set "
      "train.gradient_accumulation_steps=5",
      "--set memory.gradient_checkpointing=full --set memory.zero_stage=3 --set memory.offload_optimizer=cpu --set "
      "memory.offload_params=cpu --set train.micro_batch_size=4",
      "--set train.stage=finetune --set memory.precision=bf16 --set memory.vision_precision=fp32 --set "
      "memory.gradient_checkpointing.llm=full --set train.gradient_accumulation_steps=2",
      "--set train.stage=pretrain --set memory.precision=fp16 --set memory.offload_optimizer=cpu",
      "--set memory.gradient_checkpointing=full --set memory.gradient_checkpointing.every=2 --set train.optimizer=sgd",
      "--set lora.enable=true --set lora.r=8 --set lora.alpha=16",
      "--set lora.enable=true --set lora.r=8 --set memory.precision=bf16 --set memory.gradient_checkpointing=full "
      "--set train.gradient_accumulation_steps=4",
      "--set lora.enable=true --set lora.r=8 --set lora.base_bits=8 --set memory.gradient_checkpointing=selective",
      "--set lora.enable=true --set lora.r=8 --set lora.base_bits=4 --set memory.precision=bf16 --set "
      "train.gradient_accumulation_steps=2",
      "--set lora.enable=true --set lora.r=8 --set lora.base_bits=8 --set memory.precision=bf16",
      "--set lora.enable=true --set lora.r=8 --set lora.base_bits=4 --set lora.quant_type=fp4 --set "
      "memory.gradient_checkpointing=full",
      "--set train.padding_free=true --set memory.precision=fp32",
  };
}

TEST(Plan, DryRunPeaksEqualMeasuredPeaksForEveryStrategyCombination) {
  const std::string base = fresh_dir("plan_exact");
  const std::string cfg = config(base);
  const std::vector<std::string> combos = strategy_combinations();
  int i = 0, repeated = 0, last_block_kept = 0;
  for (const std::string& sets : combos) {
    const std::string out = str(base, "/c", i++);
    CmdResult r = headroom(str("train ", cfg, " --set run.output_dir=", out, " ", sets));
    ASSERT_EQ(r.status, 0) << sets << "\n" << r.output;
    const json plan = json::parse(std::ifstream(out + "/plan.json"));
    const auto steps = jsonl(out + "/memory.jsonl");
    ASSERT_EQ(steps.size(), 2u) << sets;
    // The final evaluation: each loss pass and generation measured its dry run's peak.
    const auto evals = jsonl(out + "/eval.jsonl");
    ASSERT_EQ(evals.size(), 1u) << sets;
    EXPECT_GT(evals[0]["memory"]["loss_pass"]["passes"], 0) << sets;
    for (const char* pass : {"loss_pass", "generation"}) {
      const json& m = evals[0]["memory"][pass];
      EXPECT_EQ(m["mismatches"], 0) << sets << " " << pass;
      EXPECT_EQ(m["peak_allocated"], m["predicted_peak"]) << sets << " " << pass;
    }
    const bool padding_free = sets.find("padding_free=true") != std::string::npos;
    int below_plan = 0;
    for (const json& s : steps) {
      // Fixed shapes (pad_to_max_length): every step is the planned worst case. Padding-free, the LLM runs only
      // the labelled rows' positions: at most the plan (a batch labelled to its end packs nothing), and still
      // predicted exactly by its dry run.
      below_plan += s["peak_allocated"] < plan["ranks"][0]["peak_allocated"];
      if (padding_free) {
        EXPECT_LE(s["peak_allocated"], plan["ranks"][0]["peak_allocated"]) << sets << " step " << s["step"];
      } else {
        EXPECT_EQ(s["peak_allocated"], plan["ranks"][0]["peak_allocated"]) << sets << " step " << s["step"];
        EXPECT_EQ(s["peak_reserved"], plan["ranks"][0]["peak_reserved"]) << sets << " step " << s["step"];
      }
      EXPECT_EQ(s["peak_allocated"], s["predicted_peak"]) << sets;
      EXPECT_EQ(s["peak_reserved"], s["predicted_reserved"]) << sets;
    }
    if (padding_free) {
      EXPECT_GT(below_plan, 0) << sets << ": no step packed";
    }
    EXPECT_EQ(r.output.find("WARNING"), std::string::npos) << r.output;
    // Micro-batches 0, 1 and 2 run; from 4 on, the later ones are repetitions of the third.
    const int accumulation = plan["decisions"]["gradient_accumulation_steps"];
    EXPECT_EQ(plan["ranks"][0]["micro_batches_repeated"], std::max(0, accumulation - 3)) << sets;
    repeated += accumulation > 3;
    last_block_kept += plan["decisions"]["llm_last_block_kept"].get<bool>();
  }
  EXPECT_GE(i, 12);
  EXPECT_GE(repeated, 4);
  // Checkpointed combinations whose LLM's last block ran whole (keep_last_block_if_free).
  EXPECT_GE(last_block_kept, 3);
}

TEST(Plan, ThePlannedAllocatorReservesWhatItsPlanSaysForEveryStrategyCombination) {
  // memory.allocator: planned: every step takes its transient buffers from the arena its dry run laid out; the
  // measured peaks equal the plan's and each step's prediction, and reserved is within 2% of peak allocated.
  const std::string base = fresh_dir("plan_planned");
  const std::string cfg = config(base);
  int i = 0;
  for (const std::string& combo : strategy_combinations()) {
    const std::string sets = combo + " --set memory.allocator=planned";
    const std::string out = str(base, "/c", i++);
    CmdResult r = headroom(str("train ", cfg, " --set run.output_dir=", out, " ", sets));
    ASSERT_EQ(r.status, 0) << sets << "\n" << r.output;
    const json plan = json::parse(std::ifstream(out + "/plan.json"));
    EXPECT_EQ(plan["ranks"][0]["allocator"], "planned") << sets;
    const auto steps = jsonl(out + "/memory.jsonl");
    ASSERT_EQ(steps.size(), 2u) << sets;
    const bool padding_free = sets.find("padding_free=true") != std::string::npos;  // at most the plan
    for (const json& s : steps) {
      EXPECT_EQ(s["allocator"], "planned") << sets;
      if (padding_free) {
        EXPECT_LE(s["peak_reserved"], plan["ranks"][0]["peak_reserved"]) << sets << " step " << s["step"];
      } else {
        EXPECT_EQ(s["peak_allocated"], plan["ranks"][0]["peak_allocated"]) << sets << " step " << s["step"];
        EXPECT_EQ(s["peak_reserved"], plan["ranks"][0]["peak_reserved"]) << sets << " step " << s["step"];
      }
      EXPECT_EQ(s["peak_allocated"], s["predicted_peak"]) << sets;
      EXPECT_EQ(s["peak_reserved"], s["predicted_reserved"]) << sets;
      EXPECT_LE(s["peak_reserved"].get<double>(), 1.02 * s["peak_allocated"].get<double>()) << sets;
    }
    EXPECT_EQ(r.output.find("WARNING"), std::string::npos) << r.output;
  }
}

TEST(Plan, AutoTakesTheAllocatorThatReservesLeast) {
  const std::string cfg = config(fresh_dir("plan_auto_allocator"));
  const json p = plan_json(cfg, "--set memory.allocator=auto");
  const json& a = p["ranks"][0]["allocators"];
  ASSERT_EQ(a.size(), 3u);
  int64_t least = INT64_MAX;
  for (const char* k : {"caching", "expandable", "planned"}) {
    least = std::min(least, a[k]["peak_reserved"].get<int64_t>());
    EXPECT_EQ(a[k]["peak_allocated"], a["planned"]["peak_allocated"]) << k;  // the same requests
  }
  EXPECT_EQ(p["ranks"][0]["peak_reserved"], least);
  EXPECT_EQ(a[p["ranks"][0]["allocator"].get<std::string>()]["peak_reserved"], least);
  EXPECT_LT(a["planned"]["peak_reserved"].get<int64_t>(), a["caching"]["peak_reserved"].get<int64_t>());
  CmdResult bad = headroom("plan " + cfg + " --set memory.allocator=buddy");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.output.find("memory.allocator"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("caching, expandable, planned, auto"), std::string::npos) << bad.output;
}

TEST(Plan, ADryRunRecordsLaterMicroBatchesAsRepetitionsAtAnyAccumulation) {
  // Accumulation 100,000 used to run 100,000 micro-batches on the meta device (what a fix suggested for
  // train.micro_batch_size: 100000 costs): three run, the rest are repetitions with the same peaks.
  const std::string cfg = config(fresh_dir("plan_repeat"));
  auto at = [&](int accumulation) {
    return plan_json(cfg, str("--set train.micro_batch_size=1 --set train.gradient_accumulation_steps=", accumulation,
                              " --set train.global_batch_size=", accumulation));
  };
  const json many = at(100000), four = at(4);
  EXPECT_EQ(many["ranks"][0]["micro_batches_repeated"], 99997);
  EXPECT_EQ(four["ranks"][0]["micro_batches_repeated"], 1);
  EXPECT_EQ(many["ranks"][0]["peak_allocated"], four["ranks"][0]["peak_allocated"]);
  EXPECT_EQ(many["ranks"][0]["peak_reserved"], four["ranks"][0]["peak_reserved"]);
  // The planned allocator's arena: laid out periodically, the same at any accumulation of 4 or more, never
  // below the step's live peak, and its peak within 2% of peak allocated (the caching allocator's cache and
  // split blocks are far more).
  for (const json* j : {&many, &four}) {
    const json& arena = (*j)["ranks"][0]["arena"];
    const json& planned = (*j)["ranks"][0]["allocators"]["planned"];
    EXPECT_GE(arena["arena"].get<int64_t>(), arena["live_peak"].get<int64_t>());
    EXPECT_LE(planned["peak_reserved"].get<double>(), 1.02 * planned["peak_allocated"].get<double>());
    EXPECT_LT(planned["peak_reserved"].get<int64_t>(),
              (*j)["ranks"][0]["allocators"]["caching"]["peak_reserved"].get<int64_t>());
  }
  EXPECT_EQ(many["ranks"][0]["arena"]["live_peak"], four["ranks"][0]["arena"]["live_peak"]);
  EXPECT_EQ(many["ranks"][0]["allocators"]["planned"], four["ranks"][0]["allocators"]["planned"]);
}

TEST(Plan, PreflightRefusesWhatDoesNotFitAndNamesTheCheapestFixes) {
  const std::string base = fresh_dir("plan_refuse");
  const std::string cfg = config(base);
  // The planned allocator throughout: its reserved bytes are its allocated ones, so the gap below is the
  // checkpointing's, not a caching allocator's rounding (which moves with every kernel's scratch sizes).
  const std::string sets = "--set memory.budget=1.0 --set memory.allocator=planned";
  // The least a decoder without checkpointing needs: the tower fully checkpointed (the search may choose that).
  const json none = plan_json(cfg, sets +
                                       " --set memory.gradient_checkpointing.llm=none "
                                       "--set memory.gradient_checkpointing.vision=full");
  const json full = plan_json(cfg, sets + " --set memory.gradient_checkpointing=full");
  // Between what full checkpointing reserves and what no checkpointing needs allocated (even with every
  // cached block released, it cannot fit).
  const int64_t a = full["ranks"][0]["peak_reserved"], b = none["ranks"][0]["peak_allocated"];
  ASSERT_LT(a, b);
  const int64_t cap = (a + b) / 2;
  CmdResult r =
      headroom(str("train ", cfg, " --set run.output_dir=", base, "/run ", sets, " --set device.memory_limit=", cap));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("does not fit"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--set memory.gradient_checkpointing"), std::string::npos) << r.output;
  // 8-bit AdamW states, after the fixes that keep the arithmetic.
  EXPECT_GT(r.output.find("--set train.optimizer=adamw_8bit"), r.output.find("--set memory.gradient_checkpointing"))
      << r.output;
  EXPECT_NE(r.output.find("--set train.optimizer=adamw_8bit"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(base + "/run/memory.jsonl")) << "the run must not start";
  CmdResult p = headroom(str("plan ", cfg, " ", sets, " --capacity ", cap));
  EXPECT_EQ(WEXITSTATUS(p.status), 3) << p.output;
  EXPECT_NE(p.output.find("DOES NOT FIT"), std::string::npos) << p.output;
}

TEST(Plan, ACudaConfigPlansForThisMachinesGpuOrAsksForAPreset) {
  const std::string base = fresh_dir("plan_cuda");
  const std::string cfg = config(base);
  CmdResult own = headroom(str("plan ", cfg, " --set device.type=cuda:0"));
  if (own.status == 0) {
    // A GPU is here: the plan is for it, its runtime reserve measured.
    EXPECT_NE(own.output.find("cuda:0 ("), std::string::npos) << own.output;
  } else {
    // None (or a build without the CUDA back-end): the error says why and how to plan for a GPU anyway; it never
    // plans for the CPU's memory instead.
    EXPECT_NE(own.output.find("cuda:0"), std::string::npos) << own.output;
    EXPECT_EQ(own.output.find("DOES NOT FIT"), std::string::npos) << own.output;
    EXPECT_NE(own.output.find("name one with --device (a100-40g, a100-80g, h100-80g"), std::string::npos) << own.output;
  }
  const json preset = plan_json(cfg, "--set device.type=cuda:0 --device h100-80g");
  EXPECT_TRUE(preset["fits"].get<bool>()) << preset.dump();
}

TEST(Plan, PreflightOffersLoraWhenNoFullFineTuneFitsAndNeverPicksItItself) {
  const std::string base = fresh_dir("plan_lora_fix");
  const std::string cfg = config(base);
  // A finetune of the language model already at its most frugal (bf16, full checkpointing, micro-batch 1, the
  // optimizer on the host, the planned allocator): no memory fix is left, while LoRA over a 4-bit base drops the
  // gradients and most of the weights' bytes.
  const std::string stage =
      "--set memory.allocator=planned --set memory.budget=1.0 --set train.stage=finetune --set memory.precision=bf16 "
      "--set "
      "memory.gradient_checkpointing=full --set train.micro_batch_size=1 --set memory.offload_optimizer=cpu";
  const json frugal = plan_json(cfg, stage);
  const json qlora =
      plan_json(cfg, stage + " --set lora.enable=true --set lora.r=8 --set lora.alpha=16 --set lora.base_bits=4");
  const int64_t a = qlora["ranks"][0]["peak_reserved"], b = frugal["ranks"][0]["peak_allocated"];
  ASSERT_LT(a, b);
  const int64_t cap = (a + b) / 2;
  CmdResult p = headroom(str("plan ", cfg, " ", stage, " --capacity ", cap));
  EXPECT_EQ(WEXITSTATUS(p.status), 3) << p.output;
  EXPECT_NE(p.output.find("--set lora.enable=true --set lora.r=8 --set lora.alpha=16"), std::string::npos)
      << p.output;  // hidden 256 / 32
  EXPECT_NE(p.output.find("trains adapters, not the language model"), std::string::npos) << p.output;
  // auto searches the memory strategies only: it still does not fit, and nothing switches LoRA on.
  const json automatic = plan_json(
      cfg, stage + str(" --capacity ", cap, " --set memory.zero_stage=auto --set memory.gradient_checkpointing=auto"));
  EXPECT_FALSE(automatic["fits"].get<bool>());
  EXPECT_EQ(automatic["params_trainable"], frugal["params_trainable"]);
}

TEST(Plan, PreflightRefusesARunWhoseEvaluationDoesNotFitBeforeItsFirstStep) {
  const std::string base = fresh_dir("plan_refuse_eval");
  const std::string cfg = config(base);
  const std::string big_eval = "--set memory.budget=1.0 --set data.synthetic.eval=64 --set train.eval_batch_size=64";
  const json p = plan_json(cfg, big_eval);
  // A cap between what the training step reserves and what evaluation allocates: the step fits, evaluation not.
  const int64_t step = p["ranks"][0]["peak_reserved"], eval = p["evaluation"]["loss_pass"]["peak_allocated"];
  ASSERT_LT(step, eval);
  EXPECT_EQ(p["evaluation"]["rows"], 64);
  const int64_t cap = (step + eval) / 2;
  CmdResult r = headroom(
      str("train ", cfg, " --set run.output_dir=", base, "/run ", big_eval, " --set device.memory_limit=", cap));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("the training step fits but evaluation does not"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--set train.eval_batch_size="), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(base + "/run/memory.jsonl")) << "the run must not start";
  // Its generation (preset small: 4 layers, 4 KV heads of 32; f32): the KV cache is 2 x layers x kv_heads x
  // head_dim x rows x positions (max_seq_len 112 + max_new_tokens 2 - 1) x 4 B, the next-token logits [64, 512].
  const json g = p["evaluation"]["generation"];
  EXPECT_EQ(g["kv_cache_bytes"], int64_t(2) * 4 * 4 * 32 * 64 * (112 + 2 - 1) * 4);
  EXPECT_EQ(g["logits_bytes"], 64 * 512 * 4);
  EXPECT_GT(g["peak_allocated"], p["ranks"][0]["persistent"].get<int64_t>() + g["kv_cache_bytes"].get<int64_t>());
}

TEST(Plan, AutoPicksSelectiveWhenNoneDoesNotFitAndALargerMicroBatchWhenMemoryAllows) {
  const std::string base = fresh_dir("plan_auto");
  const std::string cfg = config(base);
  // The search's choices under one allocator: the capacities below sit between the planned arena's figures. (Not
  // caching's: where the CPU has no oneDNN brgemm (AVX2 only), the packed GEMM's scratchpads round its segments up
  // so far that selective's reserve (92 MB) passes none's allocation (73 MB) on this model.)
  auto plan_json = [](const std::string& c, const std::string& sets) {
    return ::plan_json(c, "--set memory.allocator=planned " + sets);
  };
  // The least a decoder without checkpointing needs: the tower fully checkpointed (the search may choose that).
  const json none = plan_json(cfg,
                              "--set memory.budget=1.0 --set memory.gradient_checkpointing.llm=none "
                              "--set memory.gradient_checkpointing.vision=full");
  const json sel = plan_json(cfg, "--set memory.budget=1.0 --set memory.gradient_checkpointing=selective");
  const int64_t a = sel["ranks"][0]["peak_reserved"], b = none["ranks"][0]["peak_allocated"];
  ASSERT_LT(a, b);
  const json pick =
      plan_json(cfg, str("--set memory.budget=1.0 --set memory.gradient_checkpointing=auto --capacity ", (a + b) / 2));
  EXPECT_TRUE(pick["fits"].get<bool>());
  EXPECT_EQ(pick["decisions"]["gradient_checkpointing"]["llm"], "selective") << pick.dump();
  const json roomy = plan_json(cfg, "--set memory.gradient_checkpointing=auto --capacity 4GiB");
  EXPECT_EQ(roomy["decisions"]["gradient_checkpointing"]["llm"], "none") << "the fastest plan when everything fits";
  // Micro-batch: the global batch of 8 stays; memory decides how it is split.
  const std::string micro = "--set train.micro_batch_size=auto --set train.global_batch_size=8 --set memory.budget=1.0";
  const json big = plan_json(cfg, micro + " --capacity 4GiB");
  EXPECT_EQ(big["decisions"]["micro_batch_size"], 8) << big.dump();
  const json m1 = plan_json(cfg, "--set train.micro_batch_size=1 --set memory.budget=1.0");
  const json m2 = plan_json(cfg, "--set train.micro_batch_size=2 --set memory.budget=1.0");
  ASSERT_LT(m1["ranks"][0]["peak_reserved"].get<int64_t>(), m2["ranks"][0]["peak_allocated"].get<int64_t>());
  const int64_t cap =
      (m1["ranks"][0]["peak_reserved"].get<int64_t>() + m2["ranks"][0]["peak_allocated"].get<int64_t>()) / 2;
  const json small = plan_json(cfg, str(micro, " --capacity ", cap));
  EXPECT_EQ(small["decisions"]["micro_batch_size"], 1) << small.dump();
  EXPECT_EQ(small["decisions"]["gradient_accumulation_steps"], 8);
}

// memory.offload_activations: auto beside gradient_checkpointing: auto. A deep language model whose kept activations
// do not fit under selective checkpointing: the search keeps selective's cheaper recompute and sends what it keeps
// to the host (its copies hide under the blocks' compute) rather than recompute everything under full; without
// the offload to choose it takes full. With room, activations stay on the device (moving them gains nothing). The
// pick trains with every step's peak its dry run's.
TEST(Plan, AutoOffloadsActivationsWhereThatSavesRecomputing) {
  const std::string base = fresh_dir("plan_act_offload");
  const std::string cfg = write_config(base, kTinyTrainConfig);
  const std::string deep =
      "--set train.stage=full --set model.llm.num_hidden_layers=12 --set model.llm.hidden_size=64 "
      "--set train.micro_batch_size=8 --set train.gradient_accumulation_steps=1 --set memory.allocator=planned "
      "--set memory.budget=1.0 --set train.eval_batch_size=1 --set train.max_new_tokens=1 ";
  const json sel = plan_json(cfg, deep + "--set memory.gradient_checkpointing=selective");
  const json sel_off =
      plan_json(cfg, deep + "--set memory.gradient_checkpointing=selective --set memory.offload_activations=cpu");
  const json full = plan_json(cfg, deep + "--set memory.gradient_checkpointing=full");
  const int64_t s = sel["ranks"][0]["peak_reserved"], so = sel_off["ranks"][0]["peak_reserved"],
                f = full["ranks"][0]["peak_reserved"];
  ASSERT_LT(so, f);
  ASSERT_LT(f, s);
  EXPECT_GT(sel_off["step_time"]["activation_offload_s"].get<double>(), 0);
  EXPECT_EQ(sel_off["step_time"]["activation_offload_exposed_s"].get<double>(), 0) << "hidden under compute";
  EXPECT_LT(sel_off["step_time"]["total_s"].get<double>(), full["step_time"]["total_s"].get<double>());
  const std::string cap = str("--capacity ", (f + s) / 2, " --set memory.gradient_checkpointing=auto ");
  const json pick = plan_json(cfg, deep + cap + "--set memory.offload_activations=auto");
  EXPECT_TRUE(pick["fits"].get<bool>()) << pick.dump();
  EXPECT_EQ(pick["decisions"]["gradient_checkpointing"]["llm"], "selective") << pick.dump();
  EXPECT_EQ(pick["decisions"]["offload_activations"]["llm"], "cpu") << pick.dump();
  const json kept = plan_json(cfg, deep + cap + "--set memory.offload_activations=none");
  EXPECT_EQ(kept["decisions"]["gradient_checkpointing"]["llm"], "full") << kept.dump();
  const json roomy = plan_json(cfg, deep +
                                        "--set memory.gradient_checkpointing=selective --set "
                                        "memory.offload_activations=auto --capacity 4GiB");
  EXPECT_EQ(roomy["decisions"]["offload_activations"]["llm"], "none") << roomy.dump();
  // The pick, trained on a device capped there.
  CmdResult r =
      headroom(str("train ", cfg, " ", deep, "--set memory.gradient_checkpointing=auto ",
                   "--set memory.offload_activations=auto --set train.max_steps=2 --set run.output_dir=", base,
                   "/run --set device.memory_limit=", (f + s) / 2));
  ASSERT_EQ(r.status, 0) << r.output;
  for (const json& l : jsonl(base + "/run/memory.jsonl")) {
    EXPECT_EQ(l["peak_allocated"], l["predicted_peak"]) << "step " << l["step"];
    EXPECT_GT(l["host"]["by_category"]["activations"].get<int64_t>(), 0);
  }
}

// train.optimizer: auto: f32 AdamW where it fits, 8-bit AdamW's states where only they do, and those before
// recomputing (8-bit states cost the cost model no time, checkpointing does); with room, f32 AdamW (at equal time the
// exact states). The pre-flight of an f32 AdamW run that does not fit offers 8-bit AdamW with its peak.
TEST(Plan, AutoTakesEightBitStatesWhereOnlyTheyFitAndBeforeRecomputing) {
  const std::string cfg = config(fresh_dir("plan_optimizer_auto"));
  const std::string sets = "--set memory.budget=1.0 --set memory.allocator=planned ";
  const json f32 = plan_json(cfg, sets);
  const json eight = plan_json(cfg, sets + "--set train.optimizer=adamw_8bit");
  const int64_t a = f32["ranks"][0]["peak_reserved"], e = eight["ranks"][0]["peak_reserved"];
  ASSERT_LT(e, a);
  EXPECT_EQ(eight["decisions"]["optimizer"], "adamw_8bit");
  const std::string tight = str("--capacity ", (a + e) / 2, " --set train.optimizer=auto ");
  const json pick = plan_json(cfg, sets + tight + "--set memory.gradient_checkpointing=auto");
  EXPECT_TRUE(pick["fits"].get<bool>()) << pick.dump();
  EXPECT_EQ(pick["decisions"]["optimizer"], "adamw_8bit") << pick.dump();
  EXPECT_EQ(pick["decisions"]["gradient_checkpointing"]["llm"], "none") << "8-bit states before recomputing";
  const json roomy = plan_json(cfg, sets + "--capacity 4GiB --set train.optimizer=auto");
  EXPECT_EQ(roomy["decisions"]["optimizer"], "adamw") << roomy.dump();
  CmdResult over = headroom(str("plan ", cfg, " ", sets, "--capacity ", (a + e) / 2));
  EXPECT_EQ(WEXITSTATUS(over.status), 3) << over.output;
  EXPECT_NE(over.output.find("--set train.optimizer=adamw_8bit (8-bit AdamW states): peak"), std::string::npos)
      << over.output;
}

// memory.allocator defaults to auto: the chosen plan dry-run under each allocator, the one whose run reserves
// least (the step's or the evaluation's peak, whichever is larger) taken. Here that is planned, and its step
// reserves within 2% of what it allocates.
TEST(Plan, TheDefaultAllocatorIsTheOneWhoseRunReservesLeast) {
  const std::string cfg = config(fresh_dir("plan_default_allocator"));
  const json chosen = plan_json(cfg, "");
  std::map<std::string, int64_t> total;
  for (const char* kind : {"caching", "expandable", "planned"})
    total[kind] = plan_json(cfg, str("--set memory.allocator=", kind))["ranks"][0]["total"].get<int64_t>();
  const auto least =
      std::min_element(total.begin(), total.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  const json& rank = chosen["ranks"][0];
  EXPECT_EQ(rank["allocator"], least->first) << chosen.dump();
  EXPECT_EQ(rank["total"].get<int64_t>(), least->second);
  EXPECT_EQ(rank["allocator"], "planned") << chosen.dump();
  EXPECT_LE(double(rank["peak_reserved"].get<int64_t>()), 1.02 * double(rank["peak_allocated"].get<int64_t>()));
  EXPECT_LT(total["planned"], total["caching"]);
}

// parallel.prefetch_groups: auto at ZeRO-3 (2 ranks): prefetching one group when it fits (its gathers hide under
// compute), none where only that fits; never two (no faster in the cost model, and larger).
TEST(Plan, AutoPrefetchesOneGroupWhenItFitsAndNoneWhenOnlyThatFits) {
  const std::string cfg = config(fresh_dir("plan_prefetch"));
  const std::string z3 = "--world-size 2 --set memory.zero_stage=3 --set memory.budget=1.0";
  const json p0 = plan_json(cfg, z3 + " --set parallel.prefetch_groups=0");
  const json p1 = plan_json(cfg, z3 + " --set parallel.prefetch_groups=1");
  const int64_t r0 = p0["ranks"][0]["peak_reserved"], r1 = p1["ranks"][0]["peak_reserved"];
  ASSERT_LT(r0, r1);
  EXPECT_LT(p1["step_time"]["comm_exposed_s"].get<double>(), p0["step_time"]["comm_exposed_s"].get<double>());
  const json roomy = plan_json(cfg, z3 + " --set parallel.prefetch_groups=auto --capacity 4GiB");
  EXPECT_EQ(roomy["decisions"]["prefetch_groups"], 1) << roomy.dump();
  const json tight = plan_json(cfg, str(z3, " --set parallel.prefetch_groups=auto --capacity ", (r0 + r1) / 2));
  EXPECT_TRUE(tight["fits"].get<bool>());
  EXPECT_EQ(tight["decisions"]["prefetch_groups"], 0) << tight.dump();
  // Prefetching off is one of the fixes offered for a ZeRO-3 plan that does not fit.
  CmdResult over = headroom(str("plan ", cfg, " ", z3, " --capacity ", (r0 + r1) / 2));
  EXPECT_NE(over.output.find("--set parallel.prefetch_groups=0"), std::string::npos) << over.output;
}

// The LLaVA-1.5-7B preset on 8 x a100-80g plans at every ZeRO stage with the optimizer on the device or offloaded
// (large models fill many gradient buckets: a stage that buckets gradients it does not own would fail here),
// and offloading shrinks each stage's device peak. The cost model hides the offload's transfers where they overlap:
// gradients leaving during the backward at stages 2-3, updated shards going back during the host update at stage 3.
TEST(Plan, The7bPresetPlansEveryZeroStageWithAndWithoutOffloadOnEightGpus) {
  const std::string cfg = std::string(HR_SOURCE_DIR) + "/configs/llava-1.5-7b.yaml";
  std::map<int, double> hidden;
  for (int stage = 0; stage <= 3; ++stage) {
    std::map<std::string, int64_t> peak;
    for (const char* offload : {"none", "cpu"}) {
      const json p = plan_json(cfg, str("--world-size 8 --device a100-80g --set memory.zero_stage=", stage,
                                        " --set memory.offload_optimizer=", offload));
      peak[offload] = p["ranks"][0]["peak_allocated"];
      const json& t = p["step_time"];
      if (std::string(offload) == "none")
        EXPECT_EQ(t["offload_s"].get<double>(), 0.0) << "ZeRO " << stage;
      else
        hidden[stage] = t["offload_hidden_s"].get<double>();
      EXPECT_NEAR(t["total_s"].get<double>(),
                  t["compute_s"].get<double>() + t["comm_exposed_s"].get<double>() + t["offload_s"].get<double>(),
                  1e-9);
    }
    EXPECT_LT(peak["cpu"], peak["none"]) << "ZeRO " << stage;
  }
  EXPECT_EQ(hidden[0], 0.0);
  EXPECT_EQ(hidden[1], 0.0);
  EXPECT_GT(hidden[2], 0.0);
  EXPECT_GT(hidden[3], hidden[2]);  // the uploads too
}

// The closed form explains the dry run: at ZeRO-3 its parameters count the group gathered ahead and its comm row the
// reduce-scatter and all-gather buffers overlap keeps alive at the peak, to the byte but for shard padding; a trained
// tower's kept activations are counted by its checkpoint policy.
TEST(Plan, TheClosedFormAccountsForPrefetchOverlapAndATrainedTower) {
  auto rows = [](const json& p) {
    std::map<std::string, std::pair<double, double>> r;  // item: formula, dry run
    for (const json& row : p["closed_form"]) r[row["item"]] = {row["formula"], row["dry_run"]};
    return r;
  };
  for (const std::string prefetch : {"1", "2"})
    for (const std::string overlap : {"true", "false"}) {
      const auto r = rows(plan_json(std::string(HR_SOURCE_DIR) + "/configs/llava-1.5-7b.yaml",
                                    str("--world-size 8 --device a100-80g --set parallel.prefetch_groups=", prefetch,
                                        " --set parallel.overlap_comm=", overlap)));
      const std::string what = "prefetch " + prefetch + ", overlap " + overlap;
      EXPECT_NEAR(r.at("params").first, r.at("params").second, 64 << 10) << what;
      EXPECT_NEAR(r.at("comm").first, r.at("comm").second, 64 << 10) << what;
      EXPECT_GT(r.at("comm").second, 0) << what;
    }
  // The tower's share: training it (stage full) moves the closed form's activations exactly as far as the dry run's.
  auto activation_gap = [&](const std::string& stage, const char* vision) {
    const auto r = rows(plan_json(
        std::string(HR_SOURCE_DIR) + "/configs/llava-1.5-7b.yaml",
        str("--world-size 8 --device a100-80g --set train.stage=", stage,
            " --set memory.gradient_checkpointing.llm=full", " --set memory.gradient_checkpointing.vision=", vision)));
    return std::make_pair(r.at("activations").first - r.at("activations").second, r.at("activations").second);
  };
  const auto frozen = activation_gap("finetune", "full");
  for (const char* vision : {"none", "selective", "full"}) {
    const auto trained = activation_gap("full", vision);
    EXPECT_GT(trained.second, frozen.second + (64 << 20)) << vision << ": the tower's activations are not kept";
    EXPECT_NEAR(trained.first, frozen.first, 1 << 20) << vision;
  }
}

TEST(Plan, MaxMicroBatchAgreesWithRealRunsAndOnOomShrinksWithoutLosingASample) {
  const std::string base = fresh_dir("plan_max");
  const std::string cfg = config(base);
  const std::string cap = "--set memory.budget=1.0 --set device.memory_limit=160MiB";
  const json best = plan_json(cfg, "--max-micro-batch " + cap);
  ASSERT_TRUE(best["fits"].get<bool>()) << best.dump();
  const int64_t m = best["decisions"]["micro_batch_size"];
  ASSERT_GE(m, 2) << "pick a capacity that allows a few samples";
  CmdResult ok =
      headroom(str("train ", cfg, " --set run.output_dir=", base, "/ok --set train.micro_batch_size=", m, " ", cap));
  EXPECT_EQ(ok.status, 0) << ok.output;
  for (const json& s : jsonl(base + "/ok/memory.jsonl")) EXPECT_EQ(s["ooms"], 0);
  CmdResult over = headroom(str("train ", cfg, " --set run.output_dir=", base,
                                "/over --set train.micro_batch_size=", m + 1, " --set memory.preflight=false ", cap));
  EXPECT_NE(over.status, 0) << over.output;
  EXPECT_NE(over.output.find("out of memory"), std::string::npos) << over.output;
  // The same run with memory.on_oom: shrink_micro_batch trains on, over the same samples.
  const std::string steps = "--set train.max_steps=3 --set train.save_steps=3";
  CmdResult rec =
      headroom(str("train ", cfg, " --set run.output_dir=", base, "/recover --set train.micro_batch_size=", m + 1,
                   " --set memory.preflight=false --set memory.on_oom=shrink_micro_batch ", steps, " ", cap));
  ASSERT_EQ(rec.status, 0) << rec.output;
  EXPECT_NE(rec.output.find("redoing the step"), std::string::npos) << rec.output;
  const auto lines = jsonl(base + "/recover/memory.jsonl");
  ASSERT_EQ(lines.size(), 3u);
  for (const json& s : lines) EXPECT_EQ(s["peak_allocated"], s["predicted_peak"]);
  const json st = json::parse(std::ifstream(base + "/recover/checkpoint-3/trainer_state.json"));
  EXPECT_EQ(st["loader"]["offset"].get<int64_t>(), 3 * (m + 1)) << "every sample of every step was trained on";
}

// AnyRes: where the largest image layout does not fit, fewer tiles an image is among the fixes (the pinpoints of the
// most tiles dropped, as LLaVA-NeXT's smaller grids), and the plan names the layout it holds.
TEST(Plan, AnAnyresPlanThatDoesNotFitSuggestsSmallerPinpoints) {
  const std::string base = fresh_dir("plan_anyres");
  const std::string cfg = config(base);
  const std::string next =
      " --set 'model.image_grid_pinpoints=[[64, 128], [128, 64], [128, 128], [64, 192], [192, 64]]'"
      " --set data.max_seq_len=400 --set train.micro_batch_size=4 --set memory.gradient_checkpointing=none";
  const std::string four = "[[64, 128], [128, 64], [64, 192], [192, 64]]";
  const json all = plan_json(cfg, next + " --capacity 4GiB");
  const json fewer = plan_json(cfg, next + " --set 'model.image_grid_pinpoints=" + four + "' --capacity 4GiB");
  const int64_t a = fewer["ranks"][0]["peak_reserved"], b = all["ranks"][0]["peak_allocated"];
  ASSERT_LT(a, b) << "four tiles an image should need less than five";
  CmdResult p = headroom(str("plan ", cfg, next, " --set memory.budget=1.0 --capacity ", (a + b) / 2));
  EXPECT_EQ(WEXITSTATUS(p.status), 3) << p.output;
  EXPECT_NE(p.output.find("images: AnyRes, each planned as 128 x 128 px"), std::string::npos) << p.output;
  EXPECT_NE(p.output.find("--set model.image_grid_pinpoints=" + four), std::string::npos) << p.output;
}
