// Test helpers for forcing interleavings on the chip: a Gate a kernel parks
// on until the test opens it, and `eventually` for states no doorbell
// announces. Test threads and kernels (on simulated core threads); every wait
// ends at the deadline. Gates are allocated by the tests and never freed.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

#include "base/clock.h"
#include "base/doorbell.h"

namespace simpler::testing {

inline constexpr uint64_t kGateDeadlineNs = 30'000'000'000ull;  // every blocking wait

inline uint64_t deadline() { return now_ns() + kGateDeadlineNs; }

// Re-checks `pred`, yielding, until it holds (true) or the deadline (false).
template <typename Pred>
bool eventually(Pred pred) {
  const uint64_t end = deadline();
  while (!pred()) {
    if (now_ns() > end) return false;
    std::this_thread::yield();
  }
  return true;
}

// A kernel counts itself in `entered` and parks (futex) until release().
// Never freed, so a kernel left blocked on an abandoned device cannot
// outlive it.
struct Gate {
  std::atomic<uint32_t> open{0};
  std::atomic<uint32_t> entered{0};
  Doorbell bell;
  void release() {
    open.store(1);
    bell.ring();
  }
  bool wait_entered(uint32_t n = 1) {
    return spin_then_park(
        bell, [&] { return entered.load() >= n; }, SpinPolicy{}, deadline());
  }
  // The kernel's side.
  void pass() {
    entered.fetch_add(1);
    bell.ring();
    spin_then_park(
        bell, [&] { return open.load() != 0; }, SpinPolicy{});
  }
};

}  // namespace simpler::testing
