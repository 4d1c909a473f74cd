// CycleClock: the CPU's own counter, for timing work of about a microsecond
// where now_ns()'s read is a large part of what it times (27 ns through the
// vDSO's kvm-clock on a paravirtualised host, against 11 for the counter):
// the inline dispatch's kernel timings. The x86 time-stamp counter when the
// CPU says it is invariant, the generic timer on AArch64, now_ns() anywhere
// else. Good for estimates only: two threads' readings are not compared.
// Any thread. The process's first elapsed_ns() calibrates the rate, waiting
// out what is left of 2 ms since the library loaded; later ones are lock-free.
#pragma once

#include <cstdint>

#include "base/clock.h"

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

namespace simpler {

class CycleClock {
 public:
  // Ticks since an arbitrary origin; only differences on one thread mean anything.
  static uint64_t now() {
#if defined(__x86_64__) || defined(__i386__)
    return invariant_tsc_ ? __rdtsc() : now_ns();
#elif defined(__aarch64__)
    uint64_t v;
    asm volatile("mrs %0, cntvct_el0" : "=r"(v));
    return v;
#else
    return now_ns();
#endif
  }
  // The nanoseconds of `ticks` between two now() of one thread, or UINT64_MAX
  // when the end came before the start (the thread moved to a CPU whose
  // counter lags): an estimate that must be ignored, not a zero.
  static uint64_t elapsed_ns(uint64_t start, uint64_t end) {
    if (end < start) return UINT64_MAX;
    return static_cast<uint64_t>(static_cast<double>(end - start) * ns_per_tick());
  }

 private:
  static double ns_per_tick();
  static const bool invariant_tsc_;
};

}  // namespace simpler
