// Communicators: the collectives data parallelism and ZeRO need (all_reduce, reduce_scatter, all_gather,
// broadcast, barrier) over one process, MPI (host tensors), NCCL (device tensors) or a planned world (meta).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace hr::parallel {

using core::Tensor;

// A collective started and not yet finished: wait() completes it, and until then the tensors it was given stay
// alive and untouched. poll() lets it progress without waiting (MPI moves a non-blocking collective's data
// only inside MPI calls). A handle destroyed unfinished waits for it.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual void wait() = 0;
  virtual void poll() {}
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual const char* name() const = 0;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual int local_rank() const { return rank(); }

  // Sum over ranks, in place. Contiguous tensors of one dtype (f32, bf16, f16, i64).
  virtual void all_reduce(const Tensor& t) = 0;
  // `in` holds world() equal blocks; rank r receives the sum over ranks of block r in `out`.
  virtual void reduce_scatter(const Tensor& in, const Tensor& out) = 0;
  // Rank r's `in` becomes block r of `out` on every rank. `in` may be that block of `out` (in place).
  virtual void all_gather(const Tensor& in, const Tensor& out) = 0;
  // all_reduce, started and left running where the communicator can (MPI_Iallreduce); the default runs it to the
  // end at once.
  virtual std::unique_ptr<PendingCollective> all_reduce_start(const Tensor& t);
  // all_gather, started and left running where the communicator can (MPI_Iallgather). Every rank starts its collectives
  // in the same order, blocking ones included.
  virtual std::unique_ptr<PendingCollective> all_gather_start(const Tensor& in, const Tensor& out);
  // reduce_scatter, started and left running where the communicator can (MPI_Ireduce_scatter_block).
  virtual std::unique_ptr<PendingCollective> reduce_scatter_start(const Tensor& in, const Tensor& out);
  virtual void broadcast(const Tensor& t, int root) = 0;
  virtual void barrier() = 0;
  // Host scalars (losses, norms, flags): the sum over ranks.
  virtual double sum(double v) = 0;
  // Host values of every rank in one collective: each rank's `mine` (the same length on every rank),
  // concatenated in rank order, on every rank.
  virtual std::vector<double> gather(const std::vector<double>& mine) = 0;
  // Exposed communication: the seconds this rank's work stood still for collectives since the communicator was
  // made. MPI: the host's time inside blocking collectives and inside the waits and polls of started ones (on the
  // CPU the host is the compute). NCCL: the compute stream's stalls behind the communication stream (timing
  // events around each wait, read here, after they have passed), plus the host's time in its bootstrap's
  // collectives of host values begun while the compute stream was idle. The
  // difference of two reads around a step is that step's exposed communication; what overlap hid is not in it.
  virtual double exposed_seconds() { return 0; }
  // parallel.timeout: a collective that has not finished after `seconds` (a rank stopped, hung or gone) throws an
  // error naming this rank and the collective, which ends the job, as PyTorch's and DeepSpeed's timeout does.
  // Nothing for communicators that never wait (one process, the planner's world).
  virtual void set_timeout(double seconds) {}
};

// The default of parallel.timeout: PyTorch's and DeepSpeed's 30 minutes.
constexpr double kDefaultCollectiveTimeout = 1800;

// One process: collectives are copies or nothing.
std::unique_ptr<Communicator> make_single_process();
// A planned world of `world` ranks seen from `rank`, for dry runs on the meta device: no data moves.
std::unique_ptr<Communicator> make_planned(int world, int rank);
// MPI_COMM_WORLD (initialises MPI). Throws in a build without MPI.
std::unique_ptr<Communicator> make_mpi();
// NCCL over the ranks of `bootstrap` (an MPI communicator carries the unique id). Throws without NCCL.
std::unique_ptr<Communicator> make_nccl(Communicator& bootstrap, int device_index);
// Collectives on tensors of any device through `via` (MPI), staged in host tensors of the host allocator
// (category comm): blocking, for ranks that share a GPU (NCCL takes one GPU per rank).
std::unique_ptr<Communicator> make_staged(Communicator& via);

// An error every rank throws at the same point, having agreed on it in a collective (a rank without a GPU of its
// own, a plan that fits no rank's room): the command line lets every rank print it before it ends the job.
class EveryRankError : public Error {
 public:
  using Error::Error;
};
// MPI_Barrier over every rank of an MPI job; nothing in a single process or a build without MPI.
void barrier_all();

// Whether this process was started by an MPI launcher (mpirun/srun set their rank variables).
bool launched_by_mpi();
// The communicator for this process: MPI when launched by mpirun, else a single process.
std::unique_ptr<Communicator> make_default();
// In a multi-rank MPI job: ends every rank (MPI_Abort) so none waits forever in a collective. Otherwise
// nothing. Called by the command line on a fatal error; library code never calls it.
void abort_all(int code);
// "rank R: " in a multi-rank MPI job, else "".
std::string rank_prefix();
// Whether this build has MPI / NCCL.
bool have_mpi();
bool have_nccl();

// Checks the layout a collective needs and names the collective and the tensors when it does not hold.
void check_blocks(const char* op, const Tensor& whole, const Tensor& block, int world);

}  // namespace hr::parallel
