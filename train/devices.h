// The devices a run plans for and trains on, in one place: the presets the planner sizes for (capacity, the runtime
// reserve no allocator sees: CUDA context, cuBLAS/cuDNN workspaces, NCCL buffers; datasheet throughputs for the
// step-time cost model), and the choice of each rank's device (device.type, the local rank, GPUs shared or not,
// the least room of any rank) with its set-up.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/memory/device_memory.h"
#include "parallel/comm.h"
#include "train/config.h"

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

// ---- The run's device ----

// The device a run trains on (device.type): cpu, or cuda:N ("cuda" is cuda:0). Under several ranks a GPU's index
// is offset by the rank's local rank: rank r of a machine trains on cuda:local_rank (cuda:N+local_rank for
// device.type cuda:N); with parallel.backend: mpi ranks share the GPUs from cuda:N on, in turn.
core::Device run_device_of(const RunConfig& config, int local_rank = 0);
// The device preset a run on this machine plans for: cpu with device.memory_limit (or the machine's memory), or
// the GPU rank `local_rank` of the machine trains on, measured (what the context and other processes hold).
DevicePreset run_device(const RunConfig& config, int local_rank = 0);
// The device `headroom eval` and `headroom generate` run on: device.type's GPU, set up as training sets it up
// (device.memory_limit, memory.allocator, the host pinned beside it), or the CPU.
core::Device inference_device(const RunConfig& config);

// What a training rank runs on, chosen alike on every rank (a collective).
struct RunDevice {
  core::Device device;  // cpu or cuda:N, this rank's
  // What every rank plans with: its device with the least usable room of any rank (a GPU another process already
  // holds memory on), so that the ranks decide alike and a plan that does not fit fails on every rank with the
  // same account.
  DevicePreset preset;
  int tightest_rank = 0;  // the rank whose room that is
  // Several ranks on GPUs: ZeRO's collectives on device tensors, over NCCL (or MPI through host memory). Made
  // before the GPU's memory is measured: NCCL's buffers are part of the runtime reserve.
  std::unique_ptr<parallel::Communicator> gpu_comm;
};
// Ranks that share a GPU (parallel.backend: mpi) each get an equal share of it, as a device.memory_limit in `config`.
RunDevice choose_run_device(RunConfig& config, parallel::Communicator& comm);

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
// Sets the OpenMP threads of a rank of this run on the CPU: device.threads, or with several ranks the
// machine's cores shared among the ranks on it (mpirun's local size, else `world`). oneDNN's scratchpads
// depend on the thread count, so the trainer and `headroom plan` both set it before planning: a plan is
// sized for the threads the ranks will run with.
void use_cpu_threads(const RunConfig& config, int world);

}  // namespace hr::train
