// Writes the seed corpora of the fuzz targets with headroom's own writers: safetensors files and a sharded
// index, the synthetic VQA set as JSON and JSON lines, the configs in configs/ with overrides, PNG and JPEG,
// Llama-shaped and byte-level tokenizer.json files with texts, and the inputs that once failed a target
// (tests/fuzz/regressions). Usage: fuzz_make_seeds OUT_DIR SOURCE_DIR
#include <stb/stb_image_write.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/image.h"
#include "fuzz_inputs.h"
#include "tiny_tokenizer.h"

using namespace hr;
using namespace hr::core;
namespace fs = std::filesystem;

namespace {

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void write(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

void safetensors_seeds(const fs::path& out, const fs::path& scratch) {
  save_safetensors((out / "mixed.safetensors").string(),
                   {{"a", Tensor::from_floats({1, 2, 3, 4, 5, 6}, {2, 3}, DType::F32, Device::cpu())},
                    {"b", Tensor::from_floats({1.5f, -2.25f}, {2}, DType::BF16, Device::cpu())},
                    {"c", Tensor::from_floats({0.5f}, {1, 1}, DType::F16, Device::cpu())},
                    {"d", Tensor::from_ints({7, -8, 9}, {3}, DType::I64, Device::cpu())},
                    {"e", Tensor::from_ints({1, 2}, {2}, DType::I32, Device::cpu())},
                    {"f", Tensor::from_ints({255}, {1}, DType::U8, Device::cpu())},
                    {"empty", Tensor::full({0, 4}, 0.f, DType::F32, Device::cpu())}},
                   {{"note", "seed"}});
  save_sharded(scratch.string(), fuzz::shard_tensors(), fuzz::kShardBytes);
  fs::copy_file(scratch / "model-00001-of-00003.safetensors", out / "shard.safetensors");
}

void index_seeds(const fs::path& out, const fs::path& scratch) {
  const std::string index = read(scratch / "model.safetensors.index.json");
  write(out / "index.json", index);
  nlohmann::json j = nlohmann::json::parse(index);
  j["weight_map"].erase("w4");  // a subset of the shards' tensors is a valid index too
  write(out / "subset.json", j.dump());
}

void dataset_seeds(const fs::path& out, const fs::path& scratch) {
  data::write_synthetic_vqa(fuzz::synth_options(scratch.string()));
  for (const char* split : {"train", "eval"}) {
    const std::string text = read(scratch / (std::string(split) + ".json"));
    write(out / (std::string(split) + ".json"), text);
    std::string lines;
    for (const auto& e : nlohmann::json::parse(text)) lines += e.dump() + "\n";
    write(out / (std::string(split) + ".jsonl"), lines);
  }
}

void config_seeds(const fs::path& out, const fs::path& source) {
  for (const auto& e : fs::directory_iterator(source / "configs"))
    if (e.path().extension() == ".yaml") fs::copy_file(e.path(), out / e.path().filename());
  // A config then NUL-separated --set overrides, as fuzz_config splits its input.
  const std::string sets[] = {
      "train.max_steps=5",          "memory.precision=bf16", "memory.gradient_checkpointing=selective",
      "train.global_batch_size=12", "model.preset=tiny",     "data.synthetic.train=10"};
  std::string text = read(source / "configs/quickstart.yaml");
  for (const std::string& s : sets) text += '\0' + s;
  write(out / "quickstart_sets.yaml", text);
  write(out / "sets_only.yaml", std::string("model:\n  preset: tiny\n") + '\0' + "memory.zero_stage=auto" + '\0' +
                                    "train.micro_batch_size=auto" + '\0' + "train.global_batch_size=6");
}

// --set records for fuzz_config_values: a key-choosing byte, then the value, NUL-separated; values at and past the
// bounds of the numeric keys.
void config_value_seeds(const fs::path& out) {
  const char* values[] = {
      "0",   "-1",     "1",     "4294967297",          "1e300", ".nan", ".inf", "-.inf", "0.999", "1", "",
      "6e9", "100000", "40000", "9223372036854775807", "2.5",   "1e-8", "abc"};
  for (int file = 0; file < 8; ++file) {
    std::string text;
    for (int i = 0; i < 6; ++i) {
      const unsigned char key = static_cast<unsigned char>(file * 37 + i * 11);
      text += std::string(1, char(key)) + values[(file * 6 + i) % (sizeof values / sizeof values[0])] + '\0';
    }
    write(out / ("values-" + std::to_string(file)), text);
  }
}

// trainer_state.json as checkpoints write it, and one of a run resumed mid-epoch under fp16.
void trainer_state_seeds(const fs::path& out) {
  write(
      out / "fresh.json",
      R"({"step": 8, "optimizer_steps": 8, "loader": {"epoch": 0, "offset": 64}, "loss_scaler": {"scale": 1.0,)"
      R"( "iter": 0, "last_overflow": -1, "hysteresis_left": 2}, "skipped_steps": 0, "world_size": 1, "zero_stage": 0})");
  write(
      out / "fp16.json",
      R"({"step": 1000, "optimizer_steps": 990, "loader": {"epoch": 3, "offset": 17}, "loss_scaler": {"scale": 32768.0,)"
      R"( "iter": 1000, "last_overflow": 990, "hysteresis_left": 1}, "skipped_steps": 10, "world_size": 8, "zero_stage": 3})");
}

void image_seeds(const fs::path& out) {
  constexpr int w = 12, h = 7;
  data::RgbImage img{w, h, std::vector<uint8_t>(w * h * 3)};
  for (std::size_t i = 0; i < img.pixels.size(); ++i) img.pixels[i] = uint8_t(i * 37 % 251);
  data::write_png((out / "rgb.png").string(), img);
  std::vector<uint8_t> rgba(w * h * 4), grey(w * h);
  for (std::size_t i = 0; i < rgba.size(); ++i) rgba[i] = uint8_t(i * 13 % 256);
  for (std::size_t i = 0; i < grey.size(); ++i) grey[i] = uint8_t(i * 3);
  stbi_write_png((out / "rgba.png").string().c_str(), w, h, 4, rgba.data(), w * 4);
  stbi_write_png((out / "grey.png").string().c_str(), w, h, 1, grey.data(), w);
  stbi_write_jpg((out / "rgb.jpg").string().c_str(), w, h, 3, img.pixels.data(), 90);
  stbi_write_jpg((out / "grey.jpg").string().c_str(), w, h, 1, grey.data(), 50);
}

}  // namespace

// tokenizer.json files as the Llama family writes them (legacy: Prepend + Replace normalizers; newer: Metaspace
// with prepend_scheme "first"), merges as strings and as pairs, and byte-level ones shaped as Qwen2's and
// GPT-2's, then NUL-separated texts for fuzz_tokenizer.
static void tokenizer_seeds(const fs::path& out) {
  using json = nlohmann::json;
  json legacy = testing_data::tiny_tokenizer_json();
  legacy["added_tokens"][3]["rstrip"] = true;
  json newer = legacy;
  newer["normalizer"] = nullptr;
  newer["pre_tokenizer"] = {
      {"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}, {"split", false}};
  newer["model"]["merges"] =
      json::array({json::array({"a", "b"}), json::array({"\u2581", "a"}), json::array({"b", "c"})});
  static const char raw[] = "\0abc abc\0  a\tb\n\0<s>ab</s>c<image> x\0\xc3\xa9\xe2\x96\x81\xff\0";
  const std::string texts(raw, sizeof raw - 1);
  // Qwen2's shape (NFC, Split with its regex, ByteLevel, special tokens and a normalized one) and GPT-2's
  // (ByteLevel alone, with its own regex and a prefix space).
  json qwen2 = testing_data::tiny_byte_level_tokenizer_json();
  json gpt2 = qwen2;
  gpt2["normalizer"] = nullptr;
  gpt2["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  gpt2["model"]["merges"] = json::array({"\u0120 w", "\u0120w o", "h i"});
  static const char byte_level_raw[] =
      "\0hi wo<|im_end|>\n\0cafe\xcc\x81 caf\xc3\xa9\0I'M  don't 123\t\t\n\n  "
      "x\0<|im_start|>user\n\xe4\xb8\xad\xf0\x9f\x98\x80\0";
  const std::string byte_level_texts(byte_level_raw, sizeof byte_level_raw - 1);
  int k = 0;
  for (const json* j : {&qwen2, &gpt2})
    std::ofstream(out / ("tokenizer-" + std::to_string(k++) + ".json"), std::ios::binary)
        << j->dump() << byte_level_texts;
  for (const json* j : {&legacy, &newer}) {
    std::ofstream(out / ("tokenizer-" + std::to_string(k++) + ".json"), std::ios::binary) << j->dump() << texts;
  }
}

// LLaVA's scripts/zero2.json, zero3.json and zero3_offload.json as published, and one with explicit values.
void deepspeed_seeds(const fs::path& out) {
  const std::string fp16 =
      R"("fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
                  "hysteresis": 2, "min_loss_scale": 1}, "bf16": {"enabled": "auto"},)";
  const std::string batch =
      R"("train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto", "gradient_accumulation_steps": "auto",)";
  write(out / "zero2.json", "{" + fp16 + batch + R"(
    "zero_optimization": {"stage": 2, "overlap_comm": true, "contiguous_gradients": true, "sub_group_size": 1e9,
                          "reduce_bucket_size": "auto"}})");
  write(out / "zero3.json", "{" + fp16 + batch + R"(
    "zero_optimization": {"stage": 3, "overlap_comm": true, "contiguous_gradients": true, "sub_group_size": 1e9,
                          "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                          "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
                          "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": true}})");
  write(out / "zero3_offload.json", "{" + fp16 + R"(
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": true},
                          "offload_param": {"device": "cpu", "pin_memory": true}, "overlap_comm": true,
                          "contiguous_gradients": true, "sub_group_size": 1e9, "reduce_bucket_size": "auto",
                          "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
                          "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
                          "gather_16bit_weights_on_model_save": true},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto", "steps_per_print": 1e5, "wall_clock_breakdown": false})");
  write(out / "explicit.json", R"({"bf16": {"enabled": true}, "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2, "train_batch_size": 16, "gradient_clipping": 1.0,
    "data_types": {"grad_accum_dtype": "fp32"},
    "optimizer": {"type": "AdamW", "params": {"lr": 2e-5, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0}},
    "zero_optimization": {"stage": 1, "reduce_bucket_size": 5e8}})");
}

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s OUT_DIR SOURCE_DIR\n", argv[0]);
    return 2;
  }
  const fs::path out = argv[1], source = argv[2];
  const fs::path scratch = fuzz::scratch_dir("seeds");
  fs::remove_all(out);
  for (const char* t : {"safetensors", "safetensors_index", "dataset", "config", "config_values", "trainer_state",
                        "image", "tokenizer", "deepspeed"})
    fs::create_directories(out / t);
  safetensors_seeds(out / "safetensors", scratch / "shards");
  index_seeds(out / "safetensors_index", scratch / "shards");
  dataset_seeds(out / "dataset", scratch / "synth");
  config_seeds(out / "config", source);
  config_value_seeds(out / "config_values");
  trainer_state_seeds(out / "trainer_state");
  image_seeds(out / "image");
  tokenizer_seeds(out / "tokenizer");
  deepspeed_seeds(out / "deepspeed");
  // Inputs that once failed a target (tests/fuzz/regressions/TARGET-*) are seeds of it: every run replays them.
  for (const auto& e : fs::directory_iterator(source / "tests/fuzz/regressions")) {
    const std::string name = e.path().filename().string();
    for (const char* t : {"safetensors_index", "safetensors", "dataset", "config_values", "config", "trainer_state",
                          "image", "tokenizer", "deepspeed"})
      if (name.rfind(std::string(t) + "-", 0) == 0) {
        fs::copy_file(e.path(), out / t / name, fs::copy_options::overwrite_existing);
        break;
      }
  }
  std::size_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(out)) n += e.is_regular_file();
  std::printf("fuzz seeds: %zu files in %s\n", n, out.c_str());
  return 0;
}
