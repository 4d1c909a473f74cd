#include "neighbours.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace simpler::bench {
namespace {

uint64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// Runs in the forked child of a possibly multi-threaded parent: only
// async-signal-safe calls, then _exit.
[[noreturn]] void busy_loop(pid_t parent, uint64_t until_ns) {
  // Dies with the benchmark even when it is killed before it can reap us.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(0);
  volatile uint64_t sink = 0;
  for (uint64_t i = 1;; ++i) {
    sink = sink + i;
    if ((i & 0xfffff) == 0 && monotonic_ns() >= until_ns) _exit(0);
  }
}

}  // namespace

Status Neighbours::start(uint32_t count, uint64_t deadline_ns) {
  const pid_t parent = getpid();
  const uint64_t until = monotonic_ns() + deadline_ns;
  for (uint32_t i = 0; i < count; ++i) {
    const pid_t pid = fork();
    if (pid == 0) busy_loop(parent, until);
    if (pid < 0) {
      const int err = errno;
      stop();
      return Status(StatusCode::kInternal, fmt::format("fork of busy neighbour {}: {}", i, std::strerror(err)));
    }
    pids_.push_back(pid);
  }
  return Status();
}

uint32_t Neighbours::stop() {
  uint32_t running = 0;
  for (const pid_t pid : pids_) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) continue;  // ended by itself (its deadline)
    ++running;
    kill(pid, SIGKILL);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  pids_.clear();
  return running;
}

}  // namespace simpler::bench
