#include "base/process_id.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>

namespace simpler {

namespace {

std::atomic<pid_t> g_pid{0};

void refresh_pid() { g_pid.store(::getpid(), std::memory_order_relaxed); }

struct PidCache {
  // The handler is registered before the first read, so a child forked after
  // any read sees its own pid; one forked before the first read reads it fresh.
  PidCache() {
    refresh_pid();
    pthread_atfork(nullptr, nullptr, &refresh_pid);
  }
};

}  // namespace

pid_t process_id() {
  static PidCache cache;
  return g_pid.load(std::memory_order_relaxed);
}

}  // namespace simpler
