// NcclComm: collectives over NCCL for device tensors. Bootstrapped over another communicator (MPI): rank 0
// creates the unique id, the bootstrap broadcasts it, every rank calls ncclCommInitRank on its local GPU.
// Host tensors (ZeRO's gradient flags, scalars) go through the bootstrap.
// Each collective runs on the communicator's own stream, after the work the compute stream has queued (an
// event): a blocking one is waited for before returning; a started one (all_reduce_start, all_gather_start,
// reduce_scatter_start) returns at once, and its wait() makes the compute stream wait for it without blocking the
// host, so that a buffer freed after wait() is reused only by work ordered after the collective.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "core/memory/category.h"
#include "parallel/comm.h"

#define HR_NCCL_CHECK(call)                                                                         \
  do {                                                                                              \
    const ncclResult_t hr_nccl_rc_ = (call);                                                        \
    if (hr_nccl_rc_ != ncclSuccess)                                                                 \
      throw ::hr::Error(::hr::str("[nccl] ", #call, " failed: ", ncclGetErrorString(hr_nccl_rc_))); \
  } while (0)
#define HR_CUDA_RT_CHECK(call)                                                                      \
  do {                                                                                              \
    const cudaError_t hr_cuda_rc_ = (call);                                                         \
    if (hr_cuda_rc_ != cudaSuccess)                                                                 \
      throw ::hr::Error(::hr::str("[cuda] ", #call, " failed: ", cudaGetErrorString(hr_cuda_rc_))); \
  } while (0)

namespace hr::parallel {

using namespace hr::core;

namespace {

ncclDataType_t nccl_type(const Tensor& t) {
  switch (t.dtype()) {
    case DType::F32:
      return ncclFloat32;
    case DType::BF16:
      return ncclBfloat16;
    case DType::F16:
      return ncclFloat16;
    case DType::I32:
      return ncclInt32;
    case DType::I64:
      return ncclInt64;
    case DType::U8:
      return ncclUint8;
  }
  return ncclUint8;
}

// The compute stream of the CUDA back-end (core/backend/cuda/cuda_common.h): the legacy default stream.
constexpr cudaStream_t kComputeStream = nullptr;

// The compute stream's stalls: pairs of timing events (where a stall may start, where it is over), read once
// the second has passed. Events are reused.
class Stalls {
 public:
  Stalls() = default;
  Stalls(const Stalls&) = delete;
  Stalls& operator=(const Stalls&) = delete;
  ~Stalls() {
    for (auto [a, b] : open_) cudaEventDestroy(a), cudaEventDestroy(b);
    for (cudaEvent_t e : spare_) cudaEventDestroy(e);
  }
  cudaEvent_t event() {
    if (!spare_.empty()) {
      cudaEvent_t e = spare_.back();
      spare_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    HR_CUDA_RT_CHECK(cudaEventCreate(&e));  // with timing
    return e;
  }
  // Both events recorded; `begin` on the compute stream, `end` once the stall is over.
  void add(cudaEvent_t begin, cudaEvent_t end) { open_.emplace_back(begin, end); }
  // The seconds of every stall so far (waits for the ones still in flight).
  double seconds() {
    for (auto [a, b] : open_) {
      HR_CUDA_RT_CHECK(cudaEventSynchronize(b));
      float ms = 0;
      HR_CUDA_RT_CHECK(cudaEventElapsedTime(&ms, a, b));
      total_ += std::max(0.0, double(ms) / 1e3);
      spare_.push_back(a), spare_.push_back(b);
    }
    open_.clear();
    return total_;
  }

 private:
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> open_;
  std::vector<cudaEvent_t> spare_;
  double total_ = 0;
};

class NcclPending final : public PendingCollective {
 public:
  NcclPending(cudaStream_t comm_stream, Stalls& stalls) : stalls_(stalls) {
    HR_CUDA_RT_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    HR_CUDA_RT_CHECK(cudaEventRecord(done_, comm_stream));
  }
  ~NcclPending() override {
    if (!waited_) cudaStreamWaitEvent(kComputeStream, done_, 0);
    cudaEventDestroy(done_);
  }
  // The compute stream waits for the collective, between two timing events: how long it stood still.
  void wait() override {
    if (waited_) return;
    cudaEvent_t begin = stalls_.event(), end = stalls_.event();
    HR_CUDA_RT_CHECK(cudaEventRecord(begin, kComputeStream));
    HR_CUDA_RT_CHECK(cudaStreamWaitEvent(kComputeStream, done_, 0));
    HR_CUDA_RT_CHECK(cudaEventRecord(end, kComputeStream));
    stalls_.add(begin, end);
    waited_ = true;
  }

 private:
  Stalls& stalls_;
  cudaEvent_t done_ = nullptr;
  bool waited_ = false;
};

class NcclComm final : public Communicator {
 public:
  NcclComm(Communicator& bootstrap, int device) : bootstrap_(bootstrap), device_(device) {
    HR_CUDA_RT_CHECK(cudaSetDevice(device_));
    // Every connection and its buffers made at initialisation (NCCL makes them at a collective's first use
    // otherwise, since 2.22), so that the GPU memory measured after it holds them: the plan's runtime reserve.
    setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (bootstrap.rank() == 0) HR_NCCL_CHECK(ncclGetUniqueId(&id));
    Tensor buf = Tensor::empty({int64_t(sizeof id)}, DType::U8, Device::host());
    std::memcpy(buf.data_ptr(), &id, sizeof id);
    bootstrap.broadcast(buf, 0);
    std::memcpy(&id, buf.data_ptr(), sizeof id);
    HR_NCCL_CHECK(ncclCommInitRank(&comm_, bootstrap.world(), id, bootstrap.rank()));
    HR_CUDA_RT_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    HR_CUDA_RT_CHECK(cudaEventCreateWithFlags(&inputs_ready_, cudaEventDisableTiming));
  }
  ~NcclComm() override {
    if (inputs_ready_) cudaEventDestroy(inputs_ready_);
    if (stream_) cudaStreamDestroy(stream_);
    if (comm_) ncclCommDestroy(comm_);
  }
  const char* name() const override { return "nccl"; }
  int rank() const override { return bootstrap_.rank(); }
  int world() const override { return bootstrap_.world(); }
  int local_rank() const override { return bootstrap_.local_rank(); }

  void all_reduce(const Tensor& t) override {
    if (on_host(t)) return on_bootstrap([&] { bootstrap_.all_reduce(t); });
    start_all_reduce(t);
    wait("all_reduce");
  }
  std::unique_ptr<PendingCollective> all_reduce_start(const Tensor& t) override {
    if (on_host(t)) return bootstrap_.all_reduce_start(t);
    start_all_reduce(t);
    return std::make_unique<NcclPending>(stream_, stalls_);
  }
  void reduce_scatter(const Tensor& in, const Tensor& out) override {
    if (on_host(in)) return on_bootstrap([&] { bootstrap_.reduce_scatter(in, out); });
    start_reduce_scatter(in, out);
    wait("reduce_scatter");
  }
  void all_gather(const Tensor& in, const Tensor& out) override {
    if (on_host(out)) return on_bootstrap([&] { bootstrap_.all_gather(in, out); });
    start_all_gather(in, out);
    wait("all_gather");
  }
  std::unique_ptr<PendingCollective> all_gather_start(const Tensor& in, const Tensor& out) override {
    if (on_host(out)) return bootstrap_.all_gather_start(in, out);
    start_all_gather(in, out);
    return std::make_unique<NcclPending>(stream_, stalls_);
  }
  std::unique_ptr<PendingCollective> reduce_scatter_start(const Tensor& in, const Tensor& out) override {
    if (on_host(in)) return bootstrap_.reduce_scatter_start(in, out);
    start_reduce_scatter(in, out);
    return std::make_unique<NcclPending>(stream_, stalls_);
  }
  void broadcast(const Tensor& t, int root) override {
    if (on_host(t)) return on_bootstrap([&] { bootstrap_.broadcast(t, root); });
    check_device("broadcast", t);
    after_compute();
    HR_NCCL_CHECK(
        ncclBroadcast(t.data_ptr(), t.data_ptr(), std::size_t(t.numel()), nccl_type(t), root, comm_, stream_));
    wait("broadcast");
  }
  void barrier() override {
    on_bootstrap([&] { bootstrap_.barrier(); });
  }
  double sum(double v) override {
    double out = 0;
    on_bootstrap([&] { out = bootstrap_.sum(v); });
    return out;
  }
  std::vector<double> gather(const std::vector<double>& mine) override {
    std::vector<double> all;
    on_bootstrap([&] { all = bootstrap_.gather(mine); });
    return all;
  }
  double exposed_seconds() override { return stalls_.seconds() + host_exposed_; }
  // The host collectives go through the bootstrap, which keeps the same deadline.
  void set_timeout(double seconds) override {
    timeout_ = seconds;
    bootstrap_.set_timeout(seconds);
  }

 private:
  static bool on_host(const Tensor& t) { return t.device().runs_cpu_kernels(); }
  // A blocking collective of host values through the bootstrap. Its time is exposed when the compute stream had
  // nothing left to run as it began; otherwise the GPU worked meanwhile, and a stall it caused is the events'.
  // (Host collectives started and waited for later, all_reduce_start on a host tensor, are not counted.)
  template <class F>
  void on_bootstrap(F&& collective) {
    const bool idle = cudaStreamQuery(kComputeStream) == cudaSuccess;
    const double before = bootstrap_.exposed_seconds();
    collective();
    if (idle) host_exposed_ += bootstrap_.exposed_seconds() - before;
  }
  // The collective's inputs were written by kernels queued on the compute stream: the NCCL stream waits for them.
  void after_compute() {
    HR_CHECK(comm_ != nullptr, "[nccl] the communicator was aborted after an earlier collective failed");
    HR_CUDA_RT_CHECK(cudaEventRecord(inputs_ready_, kComputeStream));
    HR_CUDA_RT_CHECK(cudaStreamWaitEvent(stream_, inputs_ready_, 0));
  }
  void start_all_reduce(const Tensor& t) {
    check_device("all_reduce", t);
    after_compute();
    HR_NCCL_CHECK(
        ncclAllReduce(t.data_ptr(), t.data_ptr(), std::size_t(t.numel()), nccl_type(t), ncclSum, comm_, stream_));
  }
  void start_all_gather(const Tensor& in, const Tensor& out) {
    check_device("all_gather", out);
    check_blocks("all_gather", out, in, world());
    after_compute();
    HR_NCCL_CHECK(ncclAllGather(in.data_ptr(), out.data_ptr(), std::size_t(in.numel()), nccl_type(in), comm_, stream_));
  }
  void start_reduce_scatter(const Tensor& in, const Tensor& out) {
    check_device("reduce_scatter", in);
    check_blocks("reduce_scatter", in, out, world());
    after_compute();
    HR_NCCL_CHECK(ncclReduceScatter(in.data_ptr(), out.data_ptr(), std::size_t(out.numel()), nccl_type(out), ncclSum,
                                    comm_, stream_));
  }
  static void check_device(const char* op, const Tensor& t) {
    HR_CHECK(t.device().type == DeviceType::CUDA, "[", op, "] NcclComm moves device tensors; ", t.describe(),
             " is not on a CUDA device (use MpiComm)");
    HR_CHECK(t.is_contiguous(), "[", op, "] ", t.describe(), " is not contiguous");
  }
  // A blocking collective: the compute stream stands still from where the collective's inputs are ready to where
  // the collective ends (the host waits for it and queues nothing meanwhile).
  // Nothing was queued on the compute stream since the collective started, so `begin` marks where its inputs are
  // ready.
  void wait(const char* op) {
    cudaEvent_t begin = stalls_.event(), end = stalls_.event();
    HR_CUDA_RT_CHECK(cudaEventRecord(begin, kComputeStream));
    HR_CUDA_RT_CHECK(cudaEventRecord(end, stream_));
    stalls_.add(begin, end);
    wait_for_stream(op);
  }
  // Waits for the NCCL stream, checking NCCL's asynchronous errors meanwhile (a peer that died or hung up): the
  // communicator is aborted (ncclCommAbort frees what its kernels hold) and the error thrown, so that this rank
  // reports it and the launcher ends the job instead of every rank spinning in a collective that cannot finish. So
  // does a collective still running after parallel.timeout (a peer stopped or hung: NCCL reports no error then).
  void wait_for_stream(const char* op) {
    const auto deadline =
        std::chrono::steady_clock::now() +
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_));
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (std::chrono::steady_clock::now() >= deadline) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        throw Error(str("[nccl] ", op, " did not finish within ", timeout_,
                        " s (parallel.timeout): another rank stopped, hung or died before reaching it; the "
                        "communicator was aborted"));
      }
      if (q != cudaErrorNotReady) HR_CUDA_RT_CHECK(q);
      ncclResult_t async = ncclSuccess;
      HR_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
      if (async != ncclSuccess && async != ncclInProgress) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        throw Error(str("[nccl] a collective failed on rank ", rank(), ": ", ncclGetErrorString(async),
                        " (a peer rank died or lost its connection); the communicator was aborted"));
      }
      std::this_thread::yield();
    }
  }

  Communicator& bootstrap_;
  int device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t inputs_ready_ = nullptr;
  Stalls stalls_;
  double host_exposed_ = 0;  // seconds of on_bootstrap collectives begun with the compute stream idle
  double timeout_ = kDefaultCollectiveTimeout;  // parallel.timeout
};

}  // namespace

std::unique_ptr<Communicator> make_nccl(Communicator& bootstrap, int device_index) {
  return std::make_unique<NcclComm>(bootstrap, device_index);
}
bool have_nccl() {
  return true;
}

}  // namespace hr::parallel
