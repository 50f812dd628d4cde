// `headroom demo oom`: a stack of linear layers on a capped CPU device, growing the batch until the device
// runs out; prints the out-of-memory report (by category and owner) and the memory summary.
#include <cstdio>

#include "core/memory/device_memory.h"
#include "core/ops/elementwise.h"
#include "core/ops/linear.h"
#include "train/commands.h"

namespace hr::train {

using namespace hr::core;

namespace {

constexpr int kLayers = 4;
constexpr int64_t kWidth = 512;

int demo_oom(std::size_t capacity) {
  configure_device(Device::cpu(), {capacity});
  auto alloc = allocator_for(Device::cpu());
  std::printf("capped CPU device: %s, %d linear layers of %lld x %lld\n", format_bytes(double(capacity)).c_str(),
              kLayers, (long long)kWidth, (long long)kWidth);
  std::vector<Tensor> weights;
  for (int l = 0; l < kLayers; ++l) {
    MemoryScope scope(Category::Params, str("layers.", l, ".fc"));
    weights.push_back(Tensor::full({kWidth, kWidth}, 0.01f, DType::F32, Device::cpu()));
  }
  for (int64_t batch = 256;; batch *= 2) {
    try {
      std::vector<Tensor> saved;  // activations kept for a backward pass
      {
        MemoryScope scope(Category::IO, "batch");
        saved.push_back(Tensor::full({batch, kWidth}, 1.f, DType::F32, Device::cpu()));
      }
      for (int l = 0; l < kLayers; ++l) {
        MemoryScope scope(Category::Activations, str("layers.", l, ".fc"));
        saved.push_back(gelu(linear_forward(saved.back(), weights[l], Tensor())));
      }
      std::printf("batch %6lld: ok, peak allocated %s\n", (long long)batch,
                  format_bytes(double(alloc->stats().allocated_bytes.peak)).c_str());
    } catch (const OutOfMemory& e) {
      std::printf("batch %6lld: out of memory\n\n%s\n\n", (long long)batch, e.what());
      break;
    }
  }
  std::printf("%s", alloc->memory_summary().c_str());
  return 0;
}

}  // namespace

int cmd_demo(const std::vector<std::string>& args) {
  HR_CHECK(!args.empty() && args[0] == "oom", "[demo] usage: headroom demo oom [--capacity BYTES]");
  std::size_t capacity = 64_MiB;
  for (std::size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--capacity" && i + 1 < args.size())
      capacity = parse_bytes(args[++i], "demo --capacity");
    else
      throw Error(str("[demo] unknown option '", args[i], "'; allowed: --capacity BYTES"));
  }
  return demo_oom(capacity);
}

}  // namespace hr::train
