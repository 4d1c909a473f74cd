#include "base/cycle_clock.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace simpler {

namespace {

#if defined(__x86_64__) || defined(__i386__)
// CPUID 0x80000007, EDX bit 8: the counter ticks at one rate in every
// power state and does not stop, so a difference of two readings is time.
bool cpu_has_invariant_tsc() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0x80000000u, &a, &b, &c, &d) == 0 || a < 0x80000007u) return false;
  __get_cpuid(0x80000007u, &a, &b, &c, &d);
  return (d & (1u << 8)) != 0;
}
#endif

// The counter's rate is measured against now_ns() over at least this long
// since the library was loaded.
constexpr uint64_t kCalibrationNs = 2'000'000;

}  // namespace

#if defined(__x86_64__) || defined(__i386__)
const bool CycleClock::invariant_tsc_ = cpu_has_invariant_tsc();
#else
const bool CycleClock::invariant_tsc_ = false;
#endif

namespace {
// Read at load, after invariant_tsc_ (declared before it in this file).
struct Anchor {
  uint64_t ticks = CycleClock::now();
  uint64_t ns = now_ns();
};
const Anchor g_anchor;
}  // namespace

double CycleClock::ns_per_tick() {
  static const double rate = [] {
#if defined(__aarch64__)
    uint64_t hz;
    asm volatile("mrs %0, cntfrq_el0" : "=r"(hz));
    return hz != 0 ? 1e9 / static_cast<double>(hz) : 1.0;
#else
    if (!invariant_tsc_) return 1.0;  // the ticks are now_ns()'s
    // Once per process, on the first timing: waits out what is left of the
    // calibration time since load (nothing, once the process has run that long).
    uint64_t ns = now_ns();
    while (ns - g_anchor.ns < kCalibrationNs) ns = now_ns();
    const uint64_t ticks = now();
    return ticks > g_anchor.ticks ? static_cast<double>(ns - g_anchor.ns) / static_cast<double>(ticks - g_anchor.ticks)
                                  : 1.0;
#endif
  }();
  return rate;
}

}  // namespace simpler
