#include "base/fault_hooks.h"

#ifdef SIMPLER_TEST_HOOKS

#include <atomic>

namespace simpler::hooks {

namespace {
// Trivial thread-locals: operator new may ask before anything is constructed.
thread_local long t_fail_at = 0;
thread_local long t_points = 0;
thread_local const char* t_failed_site = nullptr;
std::atomic<long> g_fork_fail_at{0};
}  // namespace

void arm_alloc_fault(long n) {
  t_points = 0;
  t_failed_site = nullptr;
  t_fail_at = n;
}

long disarm_alloc_fault() {
  t_fail_at = 0;
  return t_points;
}

const char* alloc_fault_site() { return t_failed_site; }

bool alloc_fault_hit(const char* site) noexcept {
  if (t_fail_at <= 0) return false;
  if (++t_points != t_fail_at) return false;
  t_failed_site = site;
  return true;
}

AllocFaultPause::AllocFaultPause() noexcept : fail_at_(t_fail_at) { t_fail_at = 0; }

AllocFaultPause::~AllocFaultPause() { t_fail_at = fail_at_; }

void arm_fork_fault(long n) { g_fork_fail_at.store(n, std::memory_order_relaxed); }

bool fork_fault_hit() noexcept {
  long n = g_fork_fail_at.load(std::memory_order_relaxed);
  while (n > 0 && !g_fork_fail_at.compare_exchange_weak(n, n - 1, std::memory_order_relaxed)) {
  }
  return n == 1;
}

}  // namespace simpler::hooks

#endif
