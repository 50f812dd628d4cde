// Device presets, and each rank's device chosen and set up. Capacities are what cudaMemGetInfo reports as total on
// each part (MiB from nvidia-smi); throughputs are dense datasheet peaks, not measurements.
#include "train/devices.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>

#include "core/backend/device_info.h"
#include "core/check.h"
#include "core/suggest.h"

namespace hr::train {

namespace {

constexpr std::size_t MiB = std::size_t(1) << 20;

const std::vector<DevicePreset>& presets() {
  static const std::vector<DevicePreset> v = {
      // name          capacity        reserve     bf16   fp32   mem   host  link  bf16   cuda  arch
      {"a100-40g", 40536 * MiB, 1024 * MiB, 312, 156, 1555, 25, 300, true, true, 80},
      {"a100-80g", 81920 * MiB, 1024 * MiB, 312, 156, 2039, 25, 300, true, true, 80},
      {"h100-80g", 81559 * MiB, 1280 * MiB, 989, 495, 3350, 50, 450, true, true, 90},
      {"h200-141g", 143771 * MiB, 1280 * MiB, 989, 495, 4800, 50, 450, true, true, 90},
      {"l4-24g", 23034 * MiB, 768 * MiB, 121, 60, 300, 25, 25, true, true, 89},
      {"rtx4090-24g", 24564 * MiB, 768 * MiB, 165, 83, 1008, 25, 25, true, true, 89},
      {"v100-32g", 32510 * MiB, 768 * MiB, 125, 15.7, 900, 12, 150, false, true, 70},
  };
  return v;
}

}  // namespace

std::vector<std::string> device_preset_names() {
  std::vector<std::string> n;
  for (const auto& p : presets()) n.push_back(p.name);
  n.push_back("cpu:<capacity>");
  return n;
}

DevicePreset device_preset(const std::string& name) {
  for (const auto& p : presets())
    if (p.name == name) return p;
  if (name == "cpu" || name.rfind("cpu:", 0) == 0) {
    DevicePreset p;
    p.name = name;
    p.cuda = false;
    p.bf16 = true;
    // Measured on this project's 2-core reference machine (tests/bench: f32 GEMM 146 GFLOP/s).
    p.tflops_bf16 = p.tflops_fp32 = 0.146;
    p.mem_gbps = 20;
    p.host_gbps = 10;
    p.link_gbps = 5;
    if (name.size() > 4)
      p.capacity = parse_bytes(name.substr(4), "--device");
    else
      p.capacity = std::size_t(sysconf(_SC_PHYS_PAGES)) * std::size_t(sysconf(_SC_PAGE_SIZE));
    return p;
  }
  std::vector<std::string> names = device_preset_names();
  throw Error(str("[plan] unknown device '", name, "'", did_you_mean(name, names), "; presets: a100-40g, a100-80g, ",
                  "h100-80g, h200-141g, l4-24g, rtx4090-24g, v100-32g, cpu:<capacity>"));
}

DevicePreset local_gpu_preset(int index, std::size_t memory_limit) {
  const core::CudaInfo info = core::query_cuda();
  const core::CudaMemInfo m = core::cuda_memory_after_start(index);  // leaves cuda:index current
  const auto g =
      std::find_if(info.gpus.begin(), info.gpus.end(), [&](const core::GpuInfo& x) { return x.index == index; });
  HR_CHECK(g != info.gpus.end(), "[device] cuda:", index, " did not answer cudaGetDeviceProperties");
  std::string name = g->name;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  // The throughputs of the preset of the same part (the cost model's rates), by the name the driver gives.
  const bool big = m.total_bytes > int64_t(48) << 30;
  const char* part = name.find("h200") != std::string::npos   ? "h200-141g"
                     : name.find("h100") != std::string::npos ? "h100-80g"
                     : name.find("a100") != std::string::npos ? (big ? "a100-80g" : "a100-40g")
                     : name.find("l4") != std::string::npos   ? "l4-24g"
                     : name.find("4090") != std::string::npos ? "rtx4090-24g"
                     : name.find("v100") != std::string::npos ? "v100-32g"
                                                              : "a100-40g";  // unknown parts: rates of an A100 40GB
  DevicePreset p = device_preset(part);
  p.name = str("cuda:", index, " (", g->name, ")");
  // Measured here: the context, the libraries' handles and any other process's memory. A capped GPU counts only
  // its allocator's segments against the cap, as the capped CPU device does.
  p.capacity =
      memory_limit ? std::min<std::size_t>(memory_limit, std::size_t(m.free_bytes)) : std::size_t(m.total_bytes);
  p.runtime_reserve = memory_limit ? 0 : std::size_t(m.total_bytes - m.free_bytes);
  p.bf16 = g->major >= 8;
  p.cuda = true;
  p.cuda_arch = g->major * 10 + g->minor;
  return p;
}

core::SizingTarget sizing_target(const DevicePreset& device) {
  return device.cuda ? core::SizingTarget(core::Backend::CUDA, device.cuda_arch) : core::SizingTarget();
}

void require_gpu_per_rank(int index, const std::string& device_key, parallel::Communicator& comm) {
  const core::CudaInfo cuda = core::query_cuda();
  const int gpus = int(cuda.gpus.size());
  const std::vector<double> ok = comm.gather({index < gpus ? 1.0 : 0.0});
  std::string bad;
  for (int r = 0; r < comm.world(); ++r)
    if (ok[std::size_t(r)] == 0) bad += str(bad.empty() ? "" : ", ", r);
  if (!bad.empty() && gpus == 0)
    throw parallel::EveryRankError(
        str("[device] device.type ", device_key, ": this machine has no GPU to train on (", cuda.absent, ")"));
  if (!bad.empty())
    throw parallel::EveryRankError(str("[device] rank(s) ", bad, " have no GPU of their own: each rank trains on ",
                                       "cuda:<local rank> (device.type ", device_key, "), and this machine has ", gpus,
                                       " GPU(s); start at most ", gpus, " ranks per machine, or let ranks share GPUs ",
                                       "with parallel.backend: mpi (collectives through host memory)"));
  HR_CHECK(parallel::have_nccl(),
           "[device] several ranks on GPUs need NCCL, and this build has none "
           "(configure found no nccl.h / libnccl); parallel.backend: mpi moves their tensors through MPI instead");
}

void configure_run_device(core::Device device, std::size_t memory_limit, core::AllocatorKind kind) {
  const bool gpu = device.type == core::DeviceType::CUDA;
  int arch = 0;
  if (gpu)
    for (const core::GpuInfo& g : core::query_cuda().gpus)
      if (g.index == device.index) arch = g.major * 10 + g.minor;
  core::configure_device(
      device, {memory_limit, core::SizingTarget(gpu ? core::Backend::CUDA : core::Backend::CPU, arch), kind});
  if (gpu && core::allocator_for(core::Device::host())->stats().allocated_bytes.current == 0)
    core::configure_device(core::Device::host(), {0, core::Backend::CPU, core::AllocatorKind::Caching, device.index});
}

std::size_t share_of_gpu(int index, parallel::Communicator& comm) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  // The machine as a number a double holds exactly, beside the GPU's index.
  const double machine = double(std::hash<std::string>{}(host) & ((uint64_t(1) << 52) - 1));
  const std::vector<double> all = comm.gather({machine, double(index)});
  int sharing = 0;
  for (int r = 0; r < comm.world(); ++r)
    sharing += all[std::size_t(2 * r)] == machine && all[std::size_t(2 * r + 1)] == double(index);
  if (sharing <= 1) return 0;
  comm.barrier();  // every rank's context exists: what is free now is what the ranks on this GPU split
  const core::CudaMemInfo m = core::cuda_memory_now(index);
  comm.barrier();  // nobody allocates before everyone has measured
  constexpr std::size_t kPage = std::size_t(2) << 20;
  return std::size_t(m.free_bytes) / std::size_t(sharing) / kPage * kPage;
}

// ---- The run's device ----

core::Device run_device_of(const RunConfig& c, int local_rank) {
  core::Device d = core::Device::parse(c.device);
  if (d.type != core::DeviceType::CUDA || local_rank == 0) return d;
  const int gpus = c.gpu_collectives_over_mpi ? int(core::query_cuda().gpus.size()) : 0;
  d.index += gpus > d.index ? local_rank % (gpus - d.index) : local_rank;
  return d;
}

DevicePreset run_device(const RunConfig& c, int local_rank) {
  const core::Device d = run_device_of(c, local_rank);
  if (d.type == core::DeviceType::CUDA) return local_gpu_preset(d.index, c.memory_limit);
  return device_preset(c.memory_limit ? str("cpu:", c.memory_limit) : std::string("cpu"));
}

core::Device inference_device(const RunConfig& c) {
  const core::Device d = run_device_of(c);
  if (d.type != core::DeviceType::CUDA) return core::Device::cpu();
  core::cuda_memory_after_start(d.index);  // names the device when it cannot be used
  configure_run_device(d, c.memory_limit, c.allocator);
  return d;
}

namespace {

// Several ranks on GPUs: the communicator for ZeRO's device tensors.
std::unique_ptr<parallel::Communicator> gpu_communicator(const RunConfig& c, core::Device d,
                                                         parallel::Communicator& comm) {
  std::unique_ptr<parallel::Communicator> gpu;
  if (c.gpu_collectives_over_mpi) {
    gpu = parallel::make_staged(comm);
  } else {
    require_gpu_per_rank(d.index, c.device, comm);
    gpu = parallel::make_nccl(comm, d.index);
  }
  gpu->set_timeout(c.collective_timeout_s);
  return gpu;
}

// Every rank's room gathered; this rank's preset takes the tightest rank's capacity and reserve.
void plan_with_least_room(const RunConfig& c, parallel::Communicator& comm, RunDevice& run) {
  DevicePreset& device = run.preset;
  const std::vector<double> all = comm.gather({double(device.capacity), double(device.runtime_reserve)});
  auto usable = [&](int r) { return double(c.budget) * all[std::size_t(2 * r)] - all[std::size_t(2 * r + 1)]; };
  int tightest = 0;
  for (int r = 1; r < comm.world(); ++r)
    if (usable(r) < usable(tightest)) tightest = r;
  if (usable(tightest) < usable(comm.rank())) {
    device.capacity = std::size_t(all[std::size_t(2 * tightest)]);
    device.runtime_reserve = std::size_t(all[std::size_t(2 * tightest + 1)]);
    device.name += str(", planned with rank ", tightest, "'s room (the least of the ranks)");
  }
  run.tightest_rank = tightest;
}

}  // namespace

RunDevice choose_run_device(RunConfig& c, parallel::Communicator& comm) {
  const int world = comm.world(), local = world > 1 ? comm.local_rank() : 0;
  RunDevice run;
  run.device = run_device_of(c, local);
  const bool gpu = run.device.type == core::DeviceType::CUDA;
  if (gpu && world > 1) run.gpu_comm = gpu_communicator(c, run.device, comm);  // before the GPU is measured below
  run.preset = run_device(c, local);
  if (world == 1) return run;
  if (gpu && c.gpu_collectives_over_mpi)
    if (const std::size_t share = share_of_gpu(run.device.index, comm)) {
      c.memory_limit = c.memory_limit ? std::min(c.memory_limit, share) : share;
      run.preset = run_device(c, local);
    }
  plan_with_least_room(c, comm, run);
  return run;
}

void use_cpu_threads(const RunConfig& c, int world) {
  if (c.threads > 0) {
    omp_set_num_threads(c.threads);
    return;
  }
  if (world == 1) return;
  int local = world;  // ranks on this machine
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (const char* s = std::getenv(v)) {
      local = std::max(1, std::atoi(s));
      break;
    }
  omp_set_num_threads(std::max(1, omp_get_num_procs() / local));
}

}  // namespace hr::train
