// DeepSpeed's JSON config (`--deepspeed FILE`, the `deepspeed:` key) read onto headroom's keys, as the
// Hugging Face Trainer integration does: "auto" takes the value the rest of the config gives, a number or
// setting overrides it, DeepSpeed's batch-triplet rule holds, and every key read but not acted on is listed.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace hr::train {

struct DeepSpeedConfig {
  std::vector<std::pair<std::string, std::string>> sets;  // headroom key -> YAML value, in file order
  std::vector<std::string> not_acted_on;                  // DeepSpeed keys read and left alone (dotted paths)
};

// Reads `path`. A key headroom cannot honour (NVMe offload, a static fp16 loss scale, another optimizer or
// scheduler) and an unknown key are errors naming the file and the key; `world_size` checks the batch triplet.
DeepSpeedConfig read_deepspeed(const std::string& path, int world_size);
// The same on the file's text already in memory; `name` names it in errors (as the path does).
DeepSpeedConfig deepspeed_from_text(const std::string& text, const std::string& name, int world_size);

}  // namespace hr::train
