// The single-process and planned (meta) communicators, and which communicator a process gets.
#include "parallel/comm.h"

#include <cstdlib>

#include "core/ops/copy.h"

namespace hr::parallel {

using namespace hr::core;

void check_blocks(const char* op, const Tensor& whole, const Tensor& block, int world) {
  HR_CHECK(whole.is_contiguous() && block.is_contiguous(), "[", op, "] tensors must be contiguous");
  HR_CHECK(whole.dtype() == block.dtype(), "[", op, "] dtypes differ: ", dtype_name(whole.dtype()), " and ",
           dtype_name(block.dtype()));
  HR_CHECK(whole.numel() == block.numel() * world, "[", op, "] the whole tensor has ", whole.numel(),
           " elements; it needs world size ", world, " x block ", block.numel());
}

namespace {

class Finished final : public PendingCollective {
 public:
  void wait() override {}
};

}  // namespace

std::unique_ptr<PendingCollective> Communicator::all_reduce_start(const Tensor& t) {
  all_reduce(t);
  return std::make_unique<Finished>();
}

std::unique_ptr<PendingCollective> Communicator::all_gather_start(const Tensor& in, const Tensor& out) {
  all_gather(in, out);
  return std::make_unique<Finished>();
}

std::unique_ptr<PendingCollective> Communicator::reduce_scatter_start(const Tensor& in, const Tensor& out) {
  reduce_scatter(in, out);
  return std::make_unique<Finished>();
}

namespace {

class SingleProcess final : public Communicator {
 public:
  const char* name() const override { return "single"; }
  int rank() const override { return 0; }
  int world() const override { return 1; }
  void all_reduce(const Tensor&) override {}
  void reduce_scatter(const Tensor& in, const Tensor& out) override {
    check_blocks("reduce_scatter", in, out, 1);
    if (in.data_ptr() != out.data_ptr()) copy_(out, in.view(out.shape()));
  }
  void all_gather(const Tensor& in, const Tensor& out) override {
    check_blocks("all_gather", out, in, 1);
    if (in.data_ptr() != out.data_ptr()) copy_(out, in.view(out.shape()));
  }
  void broadcast(const Tensor&, int) override {}
  void barrier() override {}
  double sum(double v) override { return v; }
  std::vector<double> gather(const std::vector<double>& mine) override { return mine; }
};

class Planned final : public Communicator {
 public:
  Planned(int world, int rank) : world_(world), rank_(rank) {}
  const char* name() const override { return "planned"; }
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  void all_reduce(const Tensor&) override {}
  void reduce_scatter(const Tensor& in, const Tensor& out) override { check_blocks("reduce_scatter", in, out, world_); }
  void all_gather(const Tensor& in, const Tensor& out) override { check_blocks("all_gather", out, in, world_); }
  void broadcast(const Tensor&, int) override {}
  void barrier() override {}
  double sum(double v) override { return v * world_; }
  std::vector<double> gather(const std::vector<double>& mine) override {  // every rank as this one
    std::vector<double> all;
    for (int r = 0; r < world_; ++r) all.insert(all.end(), mine.begin(), mine.end());
    return all;
  }

 private:
  int world_, rank_;
};

}  // namespace

std::unique_ptr<Communicator> make_single_process() {
  return std::make_unique<SingleProcess>();
}
std::unique_ptr<Communicator> make_planned(int world, int rank) {
  HR_CHECK(world >= 1 && rank >= 0 && rank < world, "[parallel] rank ", rank, " of world size ", world);
  return std::make_unique<Planned>(world, rank);
}

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE"})
    if (std::getenv(v)) return true;
  return false;
}

std::unique_ptr<Communicator> make_default() {
  return launched_by_mpi() ? make_mpi() : make_single_process();
}

}  // namespace hr::parallel
