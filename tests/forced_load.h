// ForcedLoadState: the process's load state forced through the test hooks
// for a scope. A test of how the cores are fed (queued behind, chained) reads
// the process as quiet with it: another process holding the CPUs meanwhile
// (a parallel test) would otherwise have its short kernels run inline. Quiet
// also gives the process a CPU for every simulator thread, so that a machine
// with few CPUs does not run them inline either. LoadSenseOff: no spin batch
// read as a lost slice, for a scope. Test thread only; one at a time.
#pragma once

#include "base/load_sense.h"

namespace simpler::testing {

class ForcedLoadState {
 public:
  // More CPUs than any geometry has simulator threads.
  static constexpr uint32_t kPlentyCpus = 1024;
  // 0 reads as quiet, 1 as oversubscribed (hooks::force_load_state).
  explicit ForcedLoadState(int state) {
    hooks::force_load_state(state);
    if (state == 0) hooks::force_usable_cpus(kPlentyCpus);
  }
  ~ForcedLoadState() {
    hooks::force_load_state(-1);
    hooks::force_usable_cpus(0);
  }
  ForcedLoadState(const ForcedLoadState&) = delete;
  ForcedLoadState& operator=(const ForcedLoadState&) = delete;
};

// A spin that a preemption would cut short (a lost slice parks a poller at
// once) runs its whole window, however loaded this machine is: for a test of
// how long a thread polls.
class LoadSenseOff {
 public:
  LoadSenseOff() : was_(load_sense().enabled()) { load_sense().set_enabled(false); }
  ~LoadSenseOff() { load_sense().set_enabled(was_); }
  LoadSenseOff(const LoadSenseOff&) = delete;
  LoadSenseOff& operator=(const LoadSenseOff&) = delete;

 private:
  bool was_;
};

}  // namespace simpler::testing
