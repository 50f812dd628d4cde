// The NCCL communicator in a build without NCCL.
#include "parallel/comm.h"

namespace hr::parallel {

std::unique_ptr<Communicator> make_nccl(Communicator&, int) {
  throw Error(
      "[parallel] this build has no NCCL (it needs the CUDA toolkit and libnccl); device collectives "
      "are unavailable");
}
bool have_nccl() {
  return false;
}

}  // namespace hr::parallel
