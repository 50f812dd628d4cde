// Device presets for planning: capacity, the runtime reserve no allocator sees (CUDA context, cuBLAS/cuDNN
// workspaces, NCCL buffers), and datasheet throughput figures for the step-time cost model.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/memory/device_memory.h"
#include "parallel/comm.h"

namespace hr::train {

struct DevicePreset {
  std::string name;
  std::size_t capacity = 0;         // bytes the device reports as total
  std::size_t runtime_reserve = 0;  // bytes taken before the first tensor (context, library workspaces)
  double tflops_bf16 = 0;           // dense tensor-core peak, TFLOP/s (fp16 when there is no bf16)
  double tflops_fp32 = 0;           // fp32 peak (tf32 tensor cores where they exist)
  double mem_gbps = 0;              // device memory bandwidth, GB/s
  double host_gbps = 0;             // host <-> device (PCIe), GB/s, each direction
  double link_gbps = 0;             // device <-> device bus bandwidth for collectives (NVLink or PCIe), GB/s
  bool bf16 = true;                 // has bf16 arithmetic
  bool cuda = true;                 // false: the CPU device
  int cuda_arch = 0;                // compute capability as major * 10 + minor (sm_90 = 90); 0 on the CPU
};

// Whose workspace sizes a run or a plan on `device` allocates (the meta device of its dry runs mirrors them).
core::SizingTarget sizing_target(const DevicePreset& device);

// a100-40g, a100-80g, h100-80g, h200-141g, l4-24g, rtx4090-24g, v100-32g, or cpu:<capacity> (e.g. cpu:16GiB;
// cpu alone is this machine's memory). Unknown names list the presets.
DevicePreset device_preset(const std::string& name);
std::vector<std::string> device_preset_names();
// This machine's cuda:`index` as the planner sees it: its memory (or `memory_limit`, a capped GPU), the runtime
// reserve measured at start-up (total - free once the context and library handles exist), bf16 from its compute
// capability, and the throughputs of the preset of the same part. Throws where there is no such GPU.
DevicePreset local_gpu_preset(int index, std::size_t memory_limit);
// Several ranks on GPUs: that this rank's cuda:`index` exists (NCCL refuses two ranks on one GPU) and that the
// build has NCCL. Every rank learns about every rank, so that all of them stop with the reason (naming the ranks
// and `device_key`, device.type) and none waits in a collective for one that failed.
void require_gpu_per_rank(int index, const std::string& device_key, parallel::Communicator& comm);
// Sets up `device` for a run (training, evaluation, generation): its caching allocator with `memory_limit` (0: the
// whole device) and allocator `kind`, its workspaces sized for the GPU's architecture; beside a GPU the host device
// pinned (cudaHostAlloc), so that batches copy in asynchronously and offloaded states move at full bus speed, unless
// the host already holds something (a process that runs twice).
void configure_run_device(core::Device device, std::size_t memory_limit, core::AllocatorKind kind);
// Ranks that share a GPU (parallel.backend: mpi): the bytes this rank may use of its cuda:`index`, the GPU's free
// memory once every rank has made its context there, divided by the ranks on it; 0 when the rank has it alone.
// A collective: every rank calls it.
std::size_t share_of_gpu(int index, parallel::Communicator& comm);

}  // namespace hr::train
