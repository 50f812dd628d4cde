// MpiComm: collectives over MPI_COMM_WORLD for host tensors, using MPI's own algorithms. bf16 and f16 sums
// go through user-defined MPI operations (MPI has no 16-bit float types).
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <string>
#include <thread>

#include "core/dtype.h"
#include "parallel/comm.h"

#define HR_MPI_CHECK(call)                                                     \
  do {                                                                         \
    const int hr_mpi_rc_ = (call);                                             \
    if (hr_mpi_rc_ != MPI_SUCCESS) {                                           \
      char hr_mpi_msg_[MPI_MAX_ERROR_STRING];                                  \
      int hr_mpi_len_ = 0;                                                     \
      MPI_Error_string(hr_mpi_rc_, hr_mpi_msg_, &hr_mpi_len_);                 \
      throw ::hr::Error(::hr::str("[mpi] ", #call, " failed: ", hr_mpi_msg_)); \
    }                                                                          \
  } while (0)

namespace hr::parallel {

using namespace hr::core;

namespace {

template <DType T>
void sum_half(void* in, void* inout, int* len, MPI_Datatype*) {
  if constexpr (T == DType::BF16) {
    auto* a = static_cast<bf16*>(in);
    auto* b = static_cast<bf16*>(inout);
    for (int i = 0; i < *len; ++i) b[i] = to_bf16(to_f32(a[i]) + to_f32(b[i]));
  } else {
    auto* a = static_cast<f16*>(in);
    auto* b = static_cast<f16*>(inout);
    for (int i = 0; i < *len; ++i) b[i] = to_f16(to_f32(a[i]) + to_f32(b[i]));
  }
}

// Adds the time from its construction to its end to `total` (seconds): the host's time inside an MPI call.
class Inside {
 public:
  explicit Inside(double& total) : total_(total), t0_(std::chrono::steady_clock::now()) {}
  ~Inside() { total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  Inside(const Inside&) = delete;
  Inside& operator=(const Inside&) = delete;

 private:
  double& total_;
  std::chrono::steady_clock::time_point t0_;
};

// What a collective's wait needs to report a timeout: the deadline's length (the collective is named by the caller;
// the rank by the prefix every rank's error gets).
struct Deadline {
  double seconds = kDefaultCollectiveTimeout;
};

// Runs `request` to its end by polling it (MPI_Test makes it progress, as MPI_Wait would) until `d.seconds` have
// passed; then throws naming the collective (`what`), which ends the job: a rank stopped (SIGSTOP), hung
// or gone would otherwise keep every other rank waiting without a word. After the first millisecond the poll yields
// the core between tests, as Open MPI's own waits do when idle.
void finish(MPI_Request& request, const Deadline& d, const std::string& what) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(d.seconds));
  for (;;) {
    int done = 0;
    HR_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    const auto now = Clock::now();
    if (now >= deadline)
      throw Error(str("[mpi] ", what, " did not finish within ", d.seconds,
                      " s (parallel.timeout): another rank stopped, hung or died before reaching it; ending the job"));
    if (now - start > std::chrono::milliseconds(1)) std::this_thread::yield();
  }
}

// A non-blocking MPI collective: MPI_Test moves it along, wait() ends it (within the deadline). The time in both is
// exposed communication, added to the communicator's total (which outlives its collectives).
class MpiPending final : public PendingCollective {
 public:
  MpiPending(double& exposed, const Deadline& deadline, std::string what)
      : exposed_(exposed), deadline_(deadline), what_(std::move(what)) {}
  MPI_Request* request() { return &request_; }
  void wait() override {
    if (request_ == MPI_REQUEST_NULL) return;
    Inside inside(exposed_);
    finish(request_, deadline_, what_);
  }
  void poll() override {
    if (request_ == MPI_REQUEST_NULL) return;
    Inside inside(exposed_);
    int done = 0;
    HR_MPI_CHECK(MPI_Test(&request_, &done, MPI_STATUS_IGNORE));
  }
  ~MpiPending() override {
    // While an error unwinds (a collective that timed out, a rank's own failure), the collective may never finish:
    // waiting here would keep the error from being reported. It is left as it is; the command line aborts the job.
    if (request_ == MPI_REQUEST_NULL || std::uncaught_exceptions() > 0) return;
    Inside inside(exposed_);
    MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }

 private:
  double& exposed_;
  Deadline deadline_;
  std::string what_;
  MPI_Request request_ = MPI_REQUEST_NULL;
};

class MpiComm final : public Communicator {
 public:
  MpiComm() {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      HR_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
      owns_ = true;
    }
    HR_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    HR_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_));
    // The rank among the ranks of this machine (any launcher: Open MPI, MPICH's Hydra, srun): its GPU.
    MPI_Comm node = MPI_COMM_NULL;
    HR_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
    HR_MPI_CHECK(MPI_Comm_rank(node, &local_rank_));
    MPI_Comm_free(&node);
    HR_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &half_));
    HR_MPI_CHECK(MPI_Type_commit(&half_));
    HR_MPI_CHECK(MPI_Op_create(&sum_half<DType::BF16>, 1, &sum_bf16_));
    HR_MPI_CHECK(MPI_Op_create(&sum_half<DType::F16>, 1, &sum_f16_));
  }
  ~MpiComm() override {
    MPI_Op_free(&sum_bf16_);
    MPI_Op_free(&sum_f16_);
    MPI_Type_free(&half_);
    int finalized = 0;
    MPI_Finalized(&finalized);
    // Destroyed while an error unwinds: MPI_Finalize would wait for ranks that are still inside a collective,
    // so the error would never be reported. Leave MPI up; the command line reports it and aborts every rank.
    if (std::uncaught_exceptions() > 0) return;
    if (owns_ && !finalized) MPI_Finalize();
  }
  const char* name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  int local_rank() const override { return local_rank_; }

  // The blocking collectives are the non-blocking ones run to their end within the deadline (finish()).
  void all_reduce(const Tensor& t) override { all_reduce_start(t)->wait(); }
  void reduce_scatter(const Tensor& in, const Tensor& out) override { reduce_scatter_start(in, out)->wait(); }
  void all_gather(const Tensor& in, const Tensor& out) override { all_gather_start(in, out)->wait(); }
  std::unique_ptr<PendingCollective> all_reduce_start(const Tensor& t) override {
    check_host("all_reduce", t);
    auto pending = std::make_unique<MpiPending>(exposed_, deadline_, named("all_reduce", t));
    Inside inside(exposed_);  // starting may move data too
    HR_MPI_CHECK(
        MPI_Iallreduce(MPI_IN_PLACE, t.data_ptr(), count(t), type(t), op(t), MPI_COMM_WORLD, pending->request()));
    return pending;
  }
  std::unique_ptr<PendingCollective> all_gather_start(const Tensor& in, const Tensor& out) override {
    check_host("all_gather", out);
    check_blocks("all_gather", out, in, world_);
    const bool in_place =
        static_cast<char*>(in.data_ptr()) == static_cast<char*>(out.data_ptr()) + in.nbytes() * std::size_t(rank_);
    auto pending = std::make_unique<MpiPending>(exposed_, deadline_, named("all_gather", in));
    Inside inside(exposed_);  // starting may move data too
    HR_MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : in.data_ptr(), count(in), type(in), out.data_ptr(), count(in),
                                type(out), MPI_COMM_WORLD, pending->request()));
    return pending;
  }
  std::unique_ptr<PendingCollective> reduce_scatter_start(const Tensor& in, const Tensor& out) override {
    check_host("reduce_scatter", in);
    check_blocks("reduce_scatter", in, out, world_);
    auto pending = std::make_unique<MpiPending>(exposed_, deadline_, named("reduce_scatter", out));
    Inside inside(exposed_);  // starting may move data too
    HR_MPI_CHECK(MPI_Ireduce_scatter_block(in.data_ptr(), out.data_ptr(), count(out), type(out), op(out),
                                           MPI_COMM_WORLD, pending->request()));
    return pending;
  }
  void broadcast(const Tensor& t, int root) override {
    check_host("broadcast", t);
    Inside inside(exposed_);
    MPI_Request request = MPI_REQUEST_NULL;
    HR_MPI_CHECK(MPI_Ibcast(t.data_ptr(), count(t), type(t), root, MPI_COMM_WORLD, &request));
    finish(request, deadline_, named(str("broadcast from rank ", root).c_str(), t));
  }
  void barrier() override {
    Inside inside(exposed_);
    MPI_Request request = MPI_REQUEST_NULL;
    HR_MPI_CHECK(MPI_Ibarrier(MPI_COMM_WORLD, &request));
    finish(request, deadline_, named("barrier"));
  }
  double sum(double v) override {
    Inside inside(exposed_);
    double out = 0;
    MPI_Request request = MPI_REQUEST_NULL;
    HR_MPI_CHECK(MPI_Iallreduce(&v, &out, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &request));
    finish(request, deadline_, named("all_reduce of a host value"));
    return out;
  }

  std::vector<double> gather(const std::vector<double>& mine) override {
    Inside inside(exposed_);
    std::vector<double> all(mine.size() * std::size_t(world_));
    MPI_Request request = MPI_REQUEST_NULL;
    HR_MPI_CHECK(MPI_Iallgather(mine.data(), int(mine.size()), MPI_DOUBLE, all.data(), int(mine.size()), MPI_DOUBLE,
                                MPI_COMM_WORLD, &request));
    finish(request, deadline_, named("all_gather of host values"));
    return all;
  }
  double exposed_seconds() override { return exposed_; }
  void set_timeout(double seconds) override {
    HR_CHECK(std::isfinite(seconds) && seconds > 0, "[mpi] parallel.timeout ", seconds, " must be a positive number");
    deadline_.seconds = seconds;
  }

 private:
  static void check_host(const char* op, const Tensor& t) {
    HR_CHECK(t.device().runs_cpu_kernels(), "[", op, "] MpiComm moves host tensors; ", t.describe(),
             " is on a device (use NcclComm)");
    HR_CHECK(t.is_contiguous(), "[", op, "] ", t.describe(), " is not contiguous");
  }
  static int count(const Tensor& t) {
    HR_CHECK(t.numel() < (int64_t(1) << 31), "[mpi] ", t.describe(), " has more elements than one MPI call takes");
    return int(t.numel());
  }
  MPI_Datatype type(const Tensor& t) const {
    switch (t.dtype()) {
      case DType::F32:
        return MPI_FLOAT;
      case DType::BF16:
      case DType::F16:
        return half_;
      case DType::I32:
        return MPI_INT32_T;
      case DType::I64:
        return MPI_INT64_T;
      case DType::U8:
        return MPI_UINT8_T;
    }
    return MPI_BYTE;
  }
  MPI_Op op(const Tensor& t) const {
    if (t.dtype() == DType::BF16) return sum_bf16_;
    if (t.dtype() == DType::F16) return sum_f16_;
    return MPI_SUM;
  }
  // "all_reduce #12 (4096 elements, f32)": the collective and its number among this rank's, for a timeout's message.
  std::string named(const char* op, const Tensor& t) {
    return str(op, " #", ++collectives_, " (", t.numel(), " elements, ", dtype_name(t.dtype()), ")");
  }
  std::string named(const char* op) { return str(op, " #", ++collectives_); }
  int rank_ = 0, world_ = 1, local_rank_ = 0;
  bool owns_ = false;
  Deadline deadline_;
  int64_t collectives_ = 0;
  double exposed_ = 0;  // seconds inside MPI calls: exposed_seconds()
  MPI_Datatype half_{};
  MPI_Op sum_bf16_{}, sum_f16_{};
};

}  // namespace

std::unique_ptr<Communicator> make_mpi() {
  return std::make_unique<MpiComm>();
}

void abort_all(int code) {
  int inited = 0, finalized = 0, world = 1;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (!inited || finalized) return;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world > 1) MPI_Abort(MPI_COMM_WORLD, code);
}

void barrier_all() {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) MPI_Barrier(MPI_COMM_WORLD);
}

std::string rank_prefix() {
  int inited = 0, finalized = 0, world = 1, rank = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (!inited || finalized) return "";
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return world > 1 ? str("rank ", rank, ": ") : "";
}
bool have_mpi() {
  return true;
}

}  // namespace hr::parallel
