// Monotonic time helpers for deadlines and measurements. Any thread.
#pragma once

#include <chrono>
#include <cstdint>

namespace simpler {

using Clock = std::chrono::steady_clock;

inline uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
}

// A configured timeout in nanoseconds, saturated: milliseconds::max() (or
// any count past 2^64 ns) means "never", not a wrapped few milliseconds.
// A negative count is 0.
inline uint64_t timeout_ns(std::chrono::milliseconds ms) {
  if (ms.count() <= 0) return 0;
  const auto n = static_cast<uint64_t>(ms.count());
  return n > UINT64_MAX / 1'000'000ull ? UINT64_MAX : n * 1'000'000ull;
}

// now_ns() + ns, saturated at UINT64_MAX: a deadline that never comes.
inline uint64_t deadline_after(uint64_t ns) {
  const uint64_t now = now_ns();
  return ns > UINT64_MAX - now ? UINT64_MAX : now + ns;
}

}  // namespace simpler
