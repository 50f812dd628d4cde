// The MPI communicator in a build without MPI.
#include "parallel/comm.h"

namespace hr::parallel {

std::unique_ptr<Communicator> make_mpi() {
  throw Error("[parallel] this build has no MPI (install libopenmpi-dev and rebuild); it runs as one process");
}
bool have_mpi() {
  return false;
}
void abort_all(int) {}
void barrier_all() {}
std::string rank_prefix() {
  return "";
}

}  // namespace hr::parallel
