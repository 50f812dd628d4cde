// Run configuration: defaults, --set overrides typed as YAML, unknown keys with suggestions, bad values with
// the allowed ones, global batch inference.
#include <gtest/gtest.h>

#include <fstream>

#include "core/backend/device_info.h"
#include "models/anyres.h"
#include "train/config.h"
#include "train/planner.h"

using namespace hr;
using namespace hr::train;

namespace {
std::string write(const std::string& text) {
  const std::string path = testing::TempDir() + "/cfg.yaml";
  std::ofstream(path) << text;
  return path;
}
std::string error_of(const std::string& path, const std::vector<std::string>& sets = {}, int world = 1) {
  try {
    load_config(path, sets, world);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Config, DefaultsAndOverrides) {
  RunConfig c = load_config(write("model:\n  preset: tiny\ntrain:\n  micro_batch_size: 2\n"),
                            {"train.learning_rate=3e-4", "memory.precision=bf16",
                             "memory.gradient_checkpointing=selective", "data.synthetic.train=10"});
  EXPECT_EQ(c.micro_batch_size, 2);
  EXPECT_FLOAT_EQ(c.learning_rate, 3e-4f);
  EXPECT_EQ(c.precision, Precision::BF16);
  EXPECT_EQ(c.vision_ckpt.kind, models::CheckpointKind::Selective);
  EXPECT_EQ(c.llm_ckpt.kind, models::CheckpointKind::Selective);
  EXPECT_EQ(c.synth_train, 10);
  EXPECT_EQ(c.model.config.llm.hidden, 32);  // the tiny preset
  EXPECT_NE(c.resolved_yaml.find("learning_rate: 3e-4"), std::string::npos) << c.resolved_yaml;
  EXPECT_NE(c.resolved_yaml.find("gradient_accumulation_steps: 1"), std::string::npos);
}

// memory.offload_activations: one value for both groups, or one per group (as memory.gradient_checkpointing);
// none | cpu | auto, resolved per group.
TEST(Config, ActivationOffloadIsOneValueOrOnePerGroup) {
  RunConfig both = load_config(write("model:\n  preset: tiny\nmemory:\n  offload_activations: cpu\n"), {});
  EXPECT_TRUE(both.vision_ckpt.offload && both.llm_ckpt.offload);
  EXPECT_NE(both.resolved_yaml.find("offload_activations:\n    vision: cpu\n    llm: cpu"), std::string::npos)
      << both.resolved_yaml;
  RunConfig llm = load_config(write("model:\n  preset: tiny\nmemory:\n  offload_activations: {llm: cpu}\n"), {});
  EXPECT_TRUE(llm.llm_ckpt.offload);
  EXPECT_FALSE(llm.vision_ckpt.offload);
  RunConfig chosen = load_config("", {"memory.offload_activations.llm=auto"});
  EXPECT_TRUE(chosen.llm_act_offload_auto);
  EXPECT_FALSE(chosen.vision_act_offload_auto);
  EXPECT_NE(error_of("", {"memory.offload_activations=gpu"})
                .find("memory.offload_activations: 'gpu' is not one of: "
                      "none, cpu, auto"),
            std::string::npos)
      << error_of("", {"memory.offload_activations=gpu"});
  // DeepSpeed's activation_checkpointing.cpu_checkpointing maps onto it.
  const std::string ds = testing::TempDir() + "/ds_cpu_checkpointing.json";
  std::ofstream(ds) << R"({"activation_checkpointing": {"partition_activations": false, "cpu_checkpointing": true}})";
  const RunConfig from_ds = load_config("", {"deepspeed=" + ds});
  EXPECT_TRUE(from_ds.llm_ckpt.offload && from_ds.vision_ckpt.offload);
}

TEST(Config, UnknownKeysNameTheClosestValidKey) {
  const std::string p = write("memory:\n  gradient_checkpoint: full\n");
  EXPECT_NE(error_of(p).find("unknown key 'memory.gradient_checkpoint'; did you mean 'memory.gradient_checkpointing'?"),
            std::string::npos)
      << error_of(p);
  EXPECT_NE(error_of(p).find(p), std::string::npos) << "the error names the file";
  EXPECT_NE(error_of("", {"train.micro_batch=4"}).find("did you mean 'train.micro_batch_size'?"), std::string::npos);
  EXPECT_NE(error_of(write("trian:\n  max_steps: 1\n")).find("unknown section 'trian'; did you mean 'train'?"),
            std::string::npos);
}

TEST(Config, BadValuesNameTheKeyAndWhatItAccepts) {
  EXPECT_NE(error_of("", {"memory.precision=fp8"}).find("memory.precision: 'fp8' is not one of: fp32, bf16, fp16"),
            std::string::npos)
      << error_of("", {"memory.precision=fp8"});
  EXPECT_NE(error_of("", {"train.micro_batch_size=many"}).find("train.micro_batch_size: 'many' is not an integer"),
            std::string::npos);
  EXPECT_NE(error_of("", {"train.micro_batch_size=0"}).find("an integer >= 1"), std::string::npos);
  EXPECT_NE(error_of("", {"train.optimizer=lion"}).find("one of: adamw, sgd, adafactor, adamw_8bit"),
            std::string::npos);
  EXPECT_NE(error_of("", {"parallel.backend=gloo"}).find("parallel.backend: 'gloo' is not one of: nccl, mpi"),
            std::string::npos)
      << error_of("", {"parallel.backend=gloo"});
  EXPECT_NE(error_of("", {"device.memory_limit=lots"}).find("device.memory_limit"), std::string::npos);
  EXPECT_NE(
      error_of("", {"data.synthetic.captions=1.5"}).find("data.synthetic.captions: '1.5' is not a fraction in [0, 1]"),
      std::string::npos)
      << error_of("", {"data.synthetic.captions=1.5"});
}

TEST(Config, GlobalBatchIsInferredOrChecked) {
  RunConfig a = load_config(write("train:\n  micro_batch_size: 4\n  global_batch_size: 32\n"), {}, 2);
  EXPECT_EQ(a.gradient_accumulation_steps, 4);
  RunConfig b = load_config(write("train:\n  gradient_accumulation_steps: 2\n  global_batch_size: 32\n"), {}, 2);
  EXPECT_EQ(b.micro_batch_size, 8);
  EXPECT_NE(
      error_of(write("train:\n  micro_batch_size: 4\n  gradient_accumulation_steps: 2\n  global_batch_size: 32\n"))
          .find("disagrees"),
      std::string::npos);
}

TEST(Config, DuplicateKeysNameTheKeyAndBothLines) {
  // yaml-cpp would keep the first `train:` and drop the second section silently.
  const std::string p = write("train:\n  max_steps: 5\nmemory:\n  precision: bf16\ntrain:\n  learning_rate: 0.1\n");
  EXPECT_NE(error_of(p).find(p + ": duplicate key 'train' at lines 1 and 5"), std::string::npos) << error_of(p);
  const std::string q = write("train:\n  max_steps: 5\n  learning_rate: 0.1\n  max_steps: 7\n");
  EXPECT_NE(error_of(q).find("duplicate key 'train.max_steps' at lines 2 and 4"), std::string::npos) << error_of(q);
  EXPECT_NE(error_of("", {"train={max_steps: 1, max_steps: 2}"})
                .find("--set train={max_steps: 1, max_steps: 2}: "
                      "duplicate key 'train.max_steps' at lines 1 and 1"),
            std::string::npos)
      << error_of("", {"train={max_steps: 1, max_steps: 2}"});
}

TEST(Config, KeysMustBeNamesAndAliasesCannotExplode) {
  const std::string p = write("train:\n  ? [a, b]\n  : 1\n");
  EXPECT_NE(error_of(p).find(p + ": line 2: a key under 'train' is not a plain name"), std::string::npos)
      << error_of(p);
  // Nine levels of ten aliases each stand for 10^9 nodes; the loader must refuse, not copy them.
  std::string bomb = "model:\n  l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 9; ++i) {
    bomb += "  l" + std::to_string(i) + ": &l" + std::to_string(i) + " [";
    for (int k = 0; k < 10; ++k) bomb += (k ? ", *l" : "*l") + std::to_string(i - 1);
    bomb += "]\n";
  }
  EXPECT_NE(error_of(write(bomb)).find("more than 100000 YAML nodes"), std::string::npos) << error_of(write(bomb));
}

TEST(Config, AModelSectionOfTheWrongShapeIsAConfigError) {
  const std::string p = write("model: 5\n");
  EXPECT_NE(error_of(p).find(p + ": model must be a mapping, not '5'"), std::string::npos) << error_of(p);
  const std::string q = write("model:\n  weights: {a: 1}\n");
  EXPECT_NE(error_of(q).find("[config] model.weights: "), std::string::npos) << error_of(q);
  EXPECT_NE(error_of(q).find("is not a string"), std::string::npos) << error_of(q);
}

// Counts held as ints are bounded before they narrow: 40,000 loader threads ended in std::terminate, 100,000 OpenMP
// threads segfaulted in libgomp, -1 was taken, and 4294967297 wrapped to 1.
TEST(Config, CountsAreBoundedNamingTheKey) {
  for (const char* set :
       {"data.num_workers=40000", "data.num_workers=-1", "data.num_workers=4294967297", "device.threads=100000",
        "device.threads=-1", "device.threads=4294967297", "data.prefetch=-1", "memory.loss_scale.hysteresis=4294967297",
        "memory.gradient_checkpointing.every=4294967297"}) {
    const std::string key = std::string(set).substr(0, std::string(set).find('='));
    const std::string e = error_of("", {set});
    EXPECT_NE(e.find("[config] " + key + ": "), std::string::npos) << set << ": " << e;
    EXPECT_NE(e.find("is not an integer from"), std::string::npos) << set << ": " << e;
  }
  const RunConfig ok = load_config("", {"data.num_workers=0", "device.threads=4", "memory.loss_scale.hysteresis=3"});
  EXPECT_EQ(ok.num_workers, 0);
  EXPECT_EQ(ok.threads, 4);
  EXPECT_EQ(ok.loss_scale_hysteresis, 3);
}

// Values no run can mean are refused by name instead of training one step or reaching the optimizer.
TEST(Config, NonsenseValuesAreRefusedNamingTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"train.num_train_epochs=.inf", "train.num_train_epochs"},
      {"train.num_train_epochs=1e300", "train.num_train_epochs"},
      {"train.num_train_epochs=.nan", "train.num_train_epochs"},
      {"train.num_train_epochs=-1", "train.num_train_epochs"},
      {"train.num_train_epochs=0", "train.num_train_epochs"},
      {"train.adam_epsilon=-1", "train.adam_epsilon"},
      {"train.adam_beta1=1", "train.adam_beta1"},
      {"train.adam_beta2=-0.1", "train.adam_beta2"},
      {"train.adam_beta2=1.5", "train.adam_beta2"},
      {"train.weight_decay=-0.1", "train.weight_decay"},
      {"train.momentum=-1", "train.momentum"},
      {"train.learning_rate=.inf", "train.learning_rate"},
      {"train.learning_rate=.nan", "train.learning_rate"},
      {"train.warmup_ratio=2", "train.warmup_ratio"},
      {"memory.loss_scale.min=0", "memory.loss_scale.min"},
      {"lora.alpha=.inf", "lora.alpha"},
      {"model.llm.rope_theta=.nan", "model.llm.rope_theta"},
      {"model.llm.rms_norm_eps=.nan", "model.llm.rms_norm_eps"},
      {"model.llm.rms_norm_eps=-1", "model.llm.rms_norm_eps"},
      {"model.vision.layer_norm_eps=.inf", "model.vision.layer_norm_eps"},
      {"run.output_dir=", "run.output_dir"},
      {"parallel.timeout=0", "parallel.timeout"},
      {"parallel.timeout=.nan", "parallel.timeout"},
      {"device.memory_limit=1e30GiB", "device.memory_limit"}};
  for (const auto& [set, key] : cases) {
    const std::string e = error_of(write("model:\n  preset: tiny\n"), {set});
    EXPECT_NE(e.find(key), std::string::npos) << set << ": " << e;
    EXPECT_EQ(e.find("unknown key"), std::string::npos) << set << ": " << e;
  }
  // An empty text key means none, not a file named "null".
  EXPECT_EQ(load_config("", {"data.train_json="}).train_json, "");
  EXPECT_EQ(load_config("", {"parallel.timeout=5"}).collective_timeout_s, 5.0);
  EXPECT_EQ(load_config("", {}).collective_timeout_s, 1800.0);  // PyTorch's and DeepSpeed's 30 minutes
}

// yaml-cpp's Load reads a file's first document and drops the rest without a word: a config is one document.
// yaml-cpp 0.7's LoadAll collects empty documents without end where a ',' or a flow end stands where a document
// would start (the fuzzer's ",[" took 2 GiB in seconds); it is refused naming the place.
TEST(Config, AYamlTextYamlCppCannotReadIsRefusedNotLoadedForever) {
  for (const char* text : {",[", ",", "- a\n,", "# c\n, x", "a: 1\n...\n,"}) {
    const std::string e = error_of(write(text));
    EXPECT_NE(e.find("cannot begin a YAML document"), std::string::npos) << text << ": " << e;
  }
  EXPECT_NE(error_of(write("- a\n,")).find("line 2, column 1: ','"), std::string::npos);
}

TEST(Config, LaterYamlDocumentsAreRefused) {
  const std::string p = write("train:\n  max_steps: 3\n---\ntrain:\n  max_steps: 5\n");
  const std::string e = error_of(p);
  EXPECT_NE(e.find(p + ": holds 2 YAML documents"), std::string::npos) << e;
  EXPECT_NE(e.find("document 2, after a '---' line, begins at line 4"), std::string::npos) << e;
  EXPECT_EQ(load_config(write("train:\n  max_steps: 3\n---\n"), {}).max_steps, 3);  // an empty one after it
}

// Every model dimension is checked at load, naming the key: 0 made the kernels divide by zero (SIGFPE), and sizes
// whose bytes overflow 64 bits printed negative dimensions.
TEST(Config, ModelDimensionsAreValidatedNamingTheKey) {
  const std::string tiny = write("model:\n  preset: tiny\n");
  for (const char* key : {"model.llm.intermediate_size", "model.llm.vocab_size", "model.llm.num_hidden_layers",
                          "model.llm.num_key_value_heads", "model.vision.intermediate_size",
                          "model.vision.num_channels", "model.vision.num_hidden_layers", "model.vision.patch_size"}) {
    const std::string e = error_of(tiny, {std::string(key) + "=0"});
    EXPECT_NE(e.find(std::string(key) + " 0 must be positive"), std::string::npos) << key << ": " << e;
    EXPECT_NE(e.find(tiny), std::string::npos) << "the file is named: " << e;
  }
  const std::string huge = error_of(
      tiny, {"model.llm.hidden_size=6000000000", "model.llm.num_attention_heads=2", "model.llm.num_key_value_heads=2"});
  EXPECT_NE(huge.find("overflow 64-bit byte counts"), std::string::npos) << huge;
  EXPECT_NE(huge.find("model.llm.hidden_size 6000000000"), std::string::npos) << huge;
  // An image side whose patch count would overflow (found by fuzz_config_values): refused, naming both keys.
  const std::string wide = error_of(tiny, {"model.vision.image_size=39268272420", "model.vision.patch_size=4"});
  EXPECT_NE(wide.find("model.vision.image_size 39268272420 over model.vision.patch_size 4"), std::string::npos) << wide;
  // Large but countable: accepted here (the planner's arithmetic refuses what no device holds).
  EXPECT_EQ(load_config(tiny, {"model.llm.num_hidden_layers=100000000"}).model.config.llm.layers, 100000000);
}

// LLaVA-NeXT's AnyRes keys: pinpoints that tile the tower's size, a merge type, image_newline counted as a parameter.
TEST(Config, AnyresPinpointsAreCheckedAgainstTheTower) {
  const int64_t plain = load_config(write("model:\n  preset: tiny\n"), {}).model.config.parameter_count();
  // (write() reuses one file: each config is read before the next is written)
  const std::string next = write("model:\n  preset: tiny\n  image_grid_pinpoints: [[8, 16], [16, 8], [16, 16]]\n");
  const models::LlavaConfig c = load_config(next, {}).model.config;
  ASSERT_TRUE(c.anyres.on());
  EXPECT_EQ(c.anyres.pinpoints[1], (data::Resolution{16, 8}));
  EXPECT_TRUE(c.image_newline());
  EXPECT_EQ(c.parameter_count(), plain + c.llm.hidden);
  const models::LlavaConfig flat = load_config(next, {"model.mm_patch_merge_type=flat"}).model.config;
  EXPECT_FALSE(flat.image_newline());
  EXPECT_EQ(flat.parameter_count(), plain);
  const std::string cls = error_of(next, {"model.vision.select_feature=cls_patch"});
  EXPECT_NE(cls.find("AnyRes lays each crop's features out as its 2 x 2 patches, but the tower hands 5"),
            std::string::npos)
      << cls;
  EXPECT_NE(error_of(next, {"model.mm_patch_merge_type=grid"}).find("mm_patch_merge_type 'grid' is not one of"),
            std::string::npos);
  const std::string odd = error_of(write("model:\n  preset: tiny\n  image_grid_pinpoints: [[8, 12]]\n"));
  EXPECT_NE(odd.find("model.image_grid_pinpoints[0] = [8, 12] is not a positive multiple of the tower's 8 px"),
            std::string::npos)
      << odd;
  const std::string many = error_of(write("model:\n  preset: tiny\n  image_grid_pinpoints: [[8, 16], [72, 64]]\n"));
  EXPECT_NE(many.find("model.image_grid_pinpoints[1] = [72, 64] makes 72 tiles of 8 px; at most 64"), std::string::npos)
      << many;
  const std::string pair = error_of(write("model:\n  preset: tiny\n  image_grid_pinpoints: [[8, 16, 24]]\n"));
  EXPECT_NE(pair.find("model.image_grid_pinpoints[0] is not a [height, width] pair"), std::string::npos) << pair;
}

// model.fused_kernels: auto by default, off for both parts of the model; anything else is named with its file.
TEST(Config, FusedKernelsAreAutoOrOff) {
  const std::string tiny = write("model:\n  preset: tiny\n");
  const models::LlavaConfig fused = load_config(tiny, {}).model.config;
  EXPECT_TRUE(fused.llm.fused() && fused.vision.fused());
  const models::LlavaConfig off = load_config(tiny, {"model.fused_kernels=off"}).model.config;
  EXPECT_FALSE(off.llm.fused() || off.vision.fused());
  const std::string bad = error_of(tiny, {"model.fused_kernels=on"});
  EXPECT_NE(bad.find(": model.fused_kernels 'on' is not one of: auto, off"), std::string::npos) << bad;
  EXPECT_NE(bad.find(tiny), std::string::npos) << bad;
}

// data.max_image_tokens bounds AnyRes images (and the planner's worst case), never below the base image's tokens.
TEST(Config, MaxImageTokensBoundsAnyresImagesAndThePlannedLayout) {
  const std::string tiny = write("model:\n  preset: tiny\n");
  EXPECT_NE(error_of(tiny, {"data.max_image_tokens=100"}).find("data.max_image_tokens bounds AnyRes images"),
            std::string::npos);
  const std::vector<std::string> next = {"model.image_grid_pinpoints=[[8, 16], [16, 8], [16, 16], [24, 8], [8, 24]]"};
  std::vector<std::string> low = next;
  low.push_back("data.max_image_tokens=13");  // an 8 x 16 image's layout: 4 + 2 x (4 + 1), at any size
  EXPECT_NE(error_of(tiny, low).find(
                "data.max_image_tokens 13 is below the 14 tokens of the smallest layout (an image of 8 x 16 px)"),
            std::string::npos)
      << error_of(tiny, low);
  const RunConfig unbounded = load_config(tiny, next);
  const models::LlavaConfig& m = unbounded.model.config;
  auto tokens = [&](data::Resolution r) { return models::anyres_tokens(r, m.anyres, 8, 2); };
  EXPECT_EQ(tokens(planned_image(unbounded)), 24);  // 16 x 16: the base image and 2 x 2 crops, rows ended
  // The worst layout under the bound: the most crops (each goes through the tower), then the most tokens.
  for (const int64_t bound : {14, 16, 20, 24}) {
    std::vector<std::string> sets = next;
    sets.push_back(str("data.max_image_tokens=", bound));
    const data::Resolution r = planned_image(load_config(tiny, sets));
    EXPECT_LE(tokens(r), bound) << r.height << " x " << r.width;
    EXPECT_EQ(r, models::anyres_worst_image(m.anyres, 8, 2, bound));
  }
}

// model.llm.model_type picks the decoder; Mistral's window applies to every layer, Qwen2's from max_window_layers on,
// at any sequence length (the attention kernels apply it).
TEST(Config, DecoderTypeAndSlidingWindow) {
  const std::string tiny = write("model:\n  preset: tiny\n");
  EXPECT_EQ(load_config(tiny, {"model.llm.model_type=qwen2"}).model.config.llm.decoder, models::Decoder::Qwen2);
  EXPECT_NE(error_of(tiny, {"model.llm.model_type=gemma"}).find("model.llm.model_type 'gemma' is not one of"),
            std::string::npos);
  const std::vector<std::string> mistral = {"model.llm.model_type=mistral", "model.llm.sliding_window=1024"};
  std::vector<std::string> long_seq = mistral;
  long_seq.push_back("data.max_seq_len=4096");  // sequences longer than the window
  const models::LlmConfig ml = load_config(tiny, long_seq).model.config.llm;
  EXPECT_EQ(ml.sliding_window, 1024);
  for (int64_t i = 0; i < ml.layers; ++i) EXPECT_EQ(ml.window_of(i), 1024) << "Mistral layer " << i;
  const std::string llama = error_of(tiny, {"model.llm.sliding_window=1024"});
  EXPECT_NE(llama.find("a sliding window belongs to the mistral and qwen2 decoders, not llama"), std::string::npos)
      << llama;
  // Qwen2: the window from max_window_layers on; a max_window_layers at or past the last layer leaves none.
  const std::vector<std::string> qwen2 = {"model.llm.model_type=qwen2", "model.llm.sliding_window=64",
                                          "model.llm.max_window_layers=1", "data.max_seq_len=128"};
  const models::LlmConfig ql = load_config(tiny, qwen2).model.config.llm;
  ASSERT_GE(ql.layers, 2);
  EXPECT_EQ(ql.window_of(0), 0);
  for (int64_t i = 1; i < ql.layers; ++i) EXPECT_EQ(ql.window_of(i), 64) << "Qwen2 layer " << i;
  std::vector<std::string> unwindowed = qwen2;
  unwindowed[2] = "model.llm.max_window_layers=" + std::to_string(ql.layers);
  const models::LlmConfig none = load_config(tiny, unwindowed).model.config.llm;
  EXPECT_EQ(none.sliding_window, 64);
  EXPECT_FALSE(none.windowed());
  for (int64_t i = 0; i < none.layers; ++i) EXPECT_EQ(none.window_of(i), 0);
  std::vector<std::string> on_mistral = mistral;
  on_mistral.push_back("model.llm.max_window_layers=1");
  const std::string m = error_of(tiny, on_mistral);
  EXPECT_NE(m.find("max_window_layers 1: the layers without a window are the qwen2 decoder's setting"),
            std::string::npos)
      << m;
}

// `headroom info`'s GPU query never throws: on a machine without a driver or a GPU it says why; with GPUs each
// has a name, a compute capability and memory.
TEST(Info, CudaQueryDescribesTheGpusOrWhyThereAreNone) {
  const core::CudaInfo info = core::query_cuda(core::FreeMemory::Query);
  if (info.gpus.empty()) {
    EXPECT_FALSE(info.absent.empty());
  } else {
    EXPECT_TRUE(info.absent.empty());
    for (const core::GpuInfo& g : info.gpus) {
      EXPECT_FALSE(g.name.empty());
      EXPECT_GE(g.major, 3);
      EXPECT_GT(g.total_bytes, 0);
      EXPECT_LE(g.free_bytes, g.total_bytes);
    }
  }
  EXPECT_EQ(core::cuda_version_text(13000), "13.0");
  EXPECT_EQ(core::cuda_version_text(12080), "12.8");
  EXPECT_EQ(core::cuda_version_text(0), "none");
}

// memory.grad_accum_dtype: auto keeps a bf16 model's gradients in f32 (and an fp16 or f32 model's in its own dtype);
// DeepSpeed's data_types.grad_accum_dtype maps onto it; the resolved config says what was chosen.
TEST(Config, GradientsOfBf16RunsAccumulateInF32UnlessSaidOtherwise) {
  EXPECT_EQ(load_config("", {"memory.precision=bf16"}).grad_accum, GradAccum::Fp32);
  EXPECT_EQ(load_config("", {"memory.precision=fp16"}).grad_accum, GradAccum::Model);
  EXPECT_EQ(load_config("", {"memory.precision=fp32"}).grad_accum, GradAccum::Model);
  EXPECT_EQ(load_config("", {"memory.precision=bf16", "memory.grad_accum_dtype=model"}).grad_accum, GradAccum::Model);
  EXPECT_EQ(load_config("", {"memory.precision=fp16", "memory.grad_accum_dtype=fp32"}).grad_accum, GradAccum::Fp32);
  EXPECT_NE(load_config("", {"memory.precision=bf16"}).resolved_yaml.find("grad_accum_dtype: fp32"), std::string::npos);
  EXPECT_NE(error_of("", {"memory.grad_accum_dtype=bf16"})
                .find("memory.grad_accum_dtype: 'bf16' is not one of: auto, fp32, model"),
            std::string::npos)
      << error_of("", {"memory.grad_accum_dtype=bf16"});
  auto ds = [](const std::string& json) {
    const std::string path = testing::TempDir() + "/ds.json";
    std::ofstream(path) << json;
    return path;
  };
  const std::string bf16_accum = ds(R"({"bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "bf16"}})");
  EXPECT_EQ(load_config("", {"deepspeed=" + bf16_accum}).grad_accum, GradAccum::Model);
  const std::string fp32_accum = ds(R"({"fp16": {"enabled": true}, "data_types": {"grad_accum_dtype": "fp32"}})");
  EXPECT_EQ(load_config("", {"deepspeed=" + fp32_accum}).grad_accum, GradAccum::Fp32);
  EXPECT_NE(error_of("", {"deepspeed=" + ds(R"({"data_types": {"grad_accum_dtype": "int8"}})")})
                .find("data_types.grad_accum_dtype"),
            std::string::npos);
}

// train.padding_free: auto is on for the CPU and off on CUDA; true on CUDA is refused by name (cuDNN would meet a
// sequence length per packed row, which the planner does not predict); a bad value names the key.
TEST(Config, PaddingFreeIsOnForTheCpuAndRefusedOnCuda) {
  EXPECT_EQ(load_config("", {}).padding_free, PaddingFree::On);
  EXPECT_EQ(load_config("", {"train.padding_free=false"}).padding_free, PaddingFree::Off);
  EXPECT_EQ(load_config("", {"device.type=cuda:0"}).padding_free, PaddingFree::Off);
  EXPECT_EQ(load_config("", {"device.type=cuda", "train.padding_free=off"}).padding_free, PaddingFree::Off);
  EXPECT_NE(
      error_of("", {"device.type=cuda", "train.padding_free=true"}).find("train.padding_free: true is for the CPU"),
      std::string::npos);
  EXPECT_NE(error_of("", {"train.padding_free=sometimes"}).find("train.padding_free"), std::string::npos);
}

// data.pad_to_multiple_of: auto pads to 64 on a GPU (a few shapes for cuDNN's graphs, tensor-core friendly) and
// not at all on the CPU; a value must be a positive integer.
TEST(Config, BatchesPadToAMultipleOf64OnAGpuByDefault) {
  EXPECT_EQ(load_config("", {}).pad_to_multiple_of, 1);
  EXPECT_EQ(load_config("", {"device.type=cuda:0"}).pad_to_multiple_of, 64);
  EXPECT_EQ(load_config("", {"device.type=cuda", "data.pad_to_multiple_of=8"}).pad_to_multiple_of, 8);
  for (const char* bad : {"0", "-8", "eight"})
    EXPECT_NE(error_of("", {std::string("data.pad_to_multiple_of=") + bad}).find("data.pad_to_multiple_of"),
              std::string::npos)
        << bad;
}
