// Busy neighbours: N forked processes that each burn one CPU in a busy loop,
// so a benchmark can be measured "loaded" beside its quiet figures. Created
// and destroyed by the CLI's main thread; owns its children and always kills
// and reaps them (destructor), and each child also ends by itself at its
// deadline or when this process dies.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <vector>

#include "harness.h"

namespace simpler::bench {

class Neighbours {
 public:
  // A child that outlives every benchmark ends by itself after this long.
  static constexpr uint64_t kDefaultDeadlineNs = 1800ull * 1'000'000'000ull;

  Neighbours() = default;
  ~Neighbours() { (void)stop(); }
  Neighbours(const Neighbours&) = delete;
  Neighbours& operator=(const Neighbours&) = delete;

  // Forks `count` busy-loop children; on failure, the ones already started
  // are stopped before the error returns.
  Status start(uint32_t count, uint64_t deadline_ns = kDefaultDeadlineNs);
  // Kills and reaps every child; returns how many were still running (not
  // yet exited by themselves) when it was called.
  uint32_t stop();
  const std::vector<pid_t>& pids() const { return pids_; }

 private:
  std::vector<pid_t> pids_;
};

}  // namespace simpler::bench
