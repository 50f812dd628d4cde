// StagedComm (parallel.backend: mpi on GPUs): collectives on device tensors through another communicator (MPI) by
// way of host memory. Each collective copies its input to host tensors (the host allocator's, under `comm`, so
// the bytes are accounted like every other buffer), runs there, and copies the result back. Blocking, with no
// overlap: what it is for is ranks that share a GPU, which NCCL refuses ("Duplicate GPU detected"), so that one
// GPU can run several ranks and check their arithmetic and memory, and machines without NCCL.
#include "core/memory/category.h"
#include "core/ops/copy.h"
#include "parallel/comm.h"

namespace hr::parallel {

using namespace hr::core;

namespace {

class StagedComm final : public Communicator {
 public:
  explicit StagedComm(Communicator& via) : via_(via) {}
  const char* name() const override { return "staged"; }
  int rank() const override { return via_.rank(); }
  int world() const override { return via_.world(); }
  void set_timeout(double seconds) override { via_.set_timeout(seconds); }
  int local_rank() const override { return via_.local_rank(); }

  void all_reduce(const Tensor& t) override {
    if (on_host(t)) return via_.all_reduce(t);
    MemoryScope scope(Category::Comm, "staged");
    Tensor h = t.to(Device::host());
    via_.all_reduce(h);
    copy_(t, h);
  }
  void reduce_scatter(const Tensor& in, const Tensor& out) override {
    if (on_host(in) && on_host(out)) return via_.reduce_scatter(in, out);
    check_blocks("reduce_scatter", in, out, world());
    MemoryScope scope(Category::Comm, "staged");
    Tensor hin = in.to(Device::host());
    Tensor hout = Tensor::empty(out.shape(), out.dtype(), Device::host());
    via_.reduce_scatter(hin, hout);
    copy_(out, hout);
  }
  void all_gather(const Tensor& in, const Tensor& out) override {
    if (on_host(in) && on_host(out)) return via_.all_gather(in, out);
    check_blocks("all_gather", out, in, world());
    MemoryScope scope(Category::Comm, "staged");
    // `in` may be this rank's block of `out`: it is read (copied) before `out` is written.
    Tensor hin = in.to(Device::host());
    Tensor hout = Tensor::empty(out.shape(), out.dtype(), Device::host());
    via_.all_gather(hin, hout);
    copy_(out, hout);
  }
  void broadcast(const Tensor& t, int root) override {
    if (on_host(t)) return via_.broadcast(t, root);
    MemoryScope scope(Category::Comm, "staged");
    Tensor h = t.to(Device::host());
    via_.broadcast(h, root);
    copy_(t, h);
  }
  void barrier() override { via_.barrier(); }
  double sum(double v) override { return via_.sum(v); }
  std::vector<double> gather(const std::vector<double>& mine) override { return via_.gather(mine); }
  // The host's time in the other communicator's collectives (the copies are not counted).
  double exposed_seconds() override { return via_.exposed_seconds(); }

 private:
  // The host device: what the other communicator reads directly. Every other device's tensors are staged (on a
  // GPU, and on the CPU device too, which is how the staging is tested without a GPU).
  static bool on_host(const Tensor& t) { return t.device().type == DeviceType::Host; }
  Communicator& via_;
};

}  // namespace

std::unique_ptr<Communicator> make_staged(Communicator& via) {
  return std::make_unique<StagedComm>(via);
}

}  // namespace hr::parallel
