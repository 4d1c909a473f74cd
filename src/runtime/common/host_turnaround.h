// HostTurnaround: how long a device thread that waits for the host's next
// launch (tensormap_and_ringbuffer's orchestrator) polls before it parks,
// learned from the host's last turnaround: a run's end to the next launch,
// with no run in flight between. ended() is called on the device thread that
// ends a run, launched() on the launching host thread, spin_ns() on the
// waiting thread; all are lock-free and allocate nothing.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "base/sanitized.h"

namespace simpler {

class HostTurnaround {
 public:
  // A host that comes back later than this is busy with other work: a spin
  // would burn a CPU for longer than the futex wake it saves (tens of µs on a
  // paravirtualised host), so the waiter keeps the device's own window. A
  // sanitized build's turnaround includes an instrumented prepare, several
  // times as long.
  static constexpr uint64_t kMaxSpinNs = 200'000 * (kSanitizedBuild ? 4 : 1);

  // A run ended at `now_ns`. Called before the host learns of it, so a launch
  // it answers finds the count already down.
  void ended(uint64_t now_ns) {
    ended_ns_.store(now_ns, std::memory_order_relaxed);
    in_flight_.fetch_sub(1, std::memory_order_release);
  }
  // A run is launched at `now_ns`, before anything can end it. The first
  // launch after the device went idle measures the host's turnaround.
  void launched(uint64_t now_ns) {
    if (in_flight_.fetch_add(1, std::memory_order_acq_rel) != 0) return;
    const uint64_t ended = ended_ns_.load(std::memory_order_relaxed);
    const uint64_t gap = ended != 0 && now_ns > ended ? now_ns - ended : kMaxSpinNs + 1;
    // Twice the last turnaround: the host's wake-up varies from run to run,
    // and a spin that ends just short of the launch pays the wake anyway.
    spin_ns_.store(gap <= kMaxSpinNs ? std::min(2 * gap, kMaxSpinNs) : 0, std::memory_order_relaxed);
  }
  // The window to poll for the next launch when the device's own is `base`:
  // longer only while no run is in flight and the host came back quickly last
  // time. While runs are in flight the waiter's CPU is theirs.
  uint64_t spin_ns(uint64_t base) const {
    if (in_flight_.load(std::memory_order_relaxed) != 0) return base;
    return std::max(base, spin_ns_.load(std::memory_order_relaxed));
  }

 private:
  std::atomic<uint32_t> in_flight_{0};
  std::atomic<uint64_t> ended_ns_{0};
  std::atomic<uint64_t> spin_ns_{0};
};

}  // namespace simpler
