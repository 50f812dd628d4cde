// What the fuzz targets and the seed generator share: the sharded checkpoint whose index seeds the index target, the
// synthetic dataset whose images fuzzed dataset entries name, and the model inputs they are processed for.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "core/io/safetensors.h"
#include "data/batch.h"
#include "data/synth.h"

namespace hr::fuzz {

// Five 1 KiB tensors in three shards of at most 2 KiB (model-0000{1,2,3}-of-00003.safetensors).
inline core::NamedTensors shard_tensors() {
  core::NamedTensors ts;
  for (int i = 0; i < 5; ++i)
    ts.emplace_back("w" + std::to_string(i),
                    core::Tensor::full({256}, float(i), core::DType::F32, core::Device::cpu()));
  return ts;
}
constexpr std::size_t kShardBytes = 2048;

// A small synthetic VQA set: train.json, eval.json and images/train-*.png, eval-*.png.
inline data::SynthOptions synth_options(const std::string& dir) {
  data::SynthOptions o;
  o.out_dir = dir;
  o.train = 6;
  o.eval = 2;
  o.seed = 1;
  o.image_size = 16;
  o.questions = 2;
  o.captions = 0.5;
  return o;
}

// Tiny model inputs: 8-pixel images of 4 tokens each, byte-level vocabulary.
inline data::InputSpec input_spec() {
  data::InputSpec in;
  in.vocab = 300;
  in.image_size = 8;
  in.tokens_per_image = 4;
  in.image_token_id = 299;
  return in;
}

// A fresh folder under the system temp dir, named per process so parallel runs do not collide; removed when
// the process exits normally (a crashing run leaves it for inspection).
inline std::string scratch_dir(const std::string& name) {
  static std::vector<std::filesystem::path> made;
  const auto d = std::filesystem::temp_directory_path() / ("hr_fuzz_" + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  if (made.empty())
    std::atexit([] {
      std::error_code ec;
      for (const auto& p : made) std::filesystem::remove_all(p, ec);
    });
  made.push_back(d);
  return d.string();
}

}  // namespace hr::fuzz
