// The process's MPI: initialised once, on first use, with
// MPI_THREAD_MULTIPLE (the network's receiver threads, its scheduler and a
// node server's threads each call MPI), and finalised once at exit, after
// every user of it has stopped. The rank and size come from the launcher's
// environment, so a program can choose its role before MPI_Init runs: a
// node forks its children first, and MPI starts threads. Any thread.
#pragma once

#include <cstdint>

#include "simpler/status.h"

namespace simpler::dist {

// OMPI_COMM_WORLD_RANK / _SIZE (or PMIX_RANK / PMI_SIZE); 0 and 1 outside mpirun.
int launcher_rank();
int launcher_size();
// MPI_Init_thread(MULTIPLE) on first call (and MPI_COMM_WORLD's errors
// returned, not fatal); refuses a library without MPI_THREAD_MULTIPLE and a
// process mpirun did not launch. Later calls return the first answer.
Status ensure_mpi();
// Holds off MPI_Finalize (at exit) while a user of MPI runs; the finaliser
// waits for every hold to be released.
class MpiUse {
 public:
  MpiUse();
  ~MpiUse();
  MpiUse(const MpiUse&) = delete;
  MpiUse& operator=(const MpiUse&) = delete;
};
// True once exit began finalising: a user's thread stops calling MPI.
bool mpi_finalizing();

}  // namespace simpler::dist
