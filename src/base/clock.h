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

}  // namespace simpler
