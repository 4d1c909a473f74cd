#include "dist/mpi_session.h"

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>

#include "base/errors.h"

namespace simpler::dist {

namespace {

int env_int(const char* const* names, int fallback) {
  for (const char* const* n = names; *n != nullptr; ++n) {
    if (const char* v = std::getenv(*n); v != nullptr && *v != '\0') return std::atoi(v);
  }
  return fallback;
}

struct Session {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<Status> init;
  int users = 0;
  std::atomic<bool> finalizing{false};
};

Session& session() {
  static Session* s = new Session;  // outlives every static destructor that might still hold an MpiUse
  return *s;
}

void finalize_at_exit() {
  Session& s = session();
  s.finalizing.store(true);
  std::unique_lock<std::mutex> lock(s.mu);
  // A user that does not stop within a few seconds is abandoned: MPI_Finalize
  // is what lets mpirun count this rank as ended.
  s.cv.wait_for(lock, std::chrono::seconds(5), [&] { return s.users == 0; });
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

int launcher_rank() {
  static const char* const names[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", nullptr};
  return env_int(names, 0);
}

int launcher_size() {
  static const char* const names[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", nullptr};
  return env_int(names, 1);
}

Status ensure_mpi() {
  Session& s = session();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.init) return *s.init;
  if (std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr && std::getenv("PMIX_RANK") == nullptr) {
    s.init = failed_precondition(
        "this process was not launched by mpirun (OMPI_COMM_WORLD_SIZE is unset): remote nodes need `mpirun -np N`");
    return *s.init;
  }
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
    s.init = internal_error("MPI_Init_thread failed");
    return *s.init;
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    s.init = failed_precondition("this MPI library provides thread level {}, remote nodes need MPI_THREAD_MULTIPLE",
                                 provided);
    return *s.init;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  std::atexit(finalize_at_exit);
  s.init = Status();
  return *s.init;
}

MpiUse::MpiUse() {
  std::lock_guard<std::mutex> lock(session().mu);
  ++session().users;
}

MpiUse::~MpiUse() {
  Session& s = session();
  std::lock_guard<std::mutex> lock(s.mu);
  --s.users;
  s.cv.notify_all();
}

bool mpi_finalizing() { return session().finalizing.load(); }

}  // namespace simpler::dist
