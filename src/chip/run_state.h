// RunState: the shared completion record behind a RunHandle. Completed exactly
// once by whichever thread finishes the run (an AICPU thread, or the submitting
// thread for a refusal); read by any number of waiters on any thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>

#include "base/doorbell.h"
#include "simpler/run_handle.h"

namespace simpler::detail {

struct RunState {
  explicit RunState(uint64_t id, SpinPolicy wait_spin = {}) : run_id(id), spin(wait_spin) {}

  // Publishes the terminal result; a second call is a broken invariant and aborts.
  void complete(Status status, const RunStats& stats);
  bool is_done() const { return done.load(std::memory_order_acquire) != 0; }

  const uint64_t run_id;
  const SpinPolicy spin;  // how a waiter spins before it parks
  // Called once with the result by the completing thread, after waiters were
  // woken. Set before the run is handed to any other thread, never after.
  std::function<void(const Status&)> on_terminal;
  std::atomic<uint32_t> done{0};
  Doorbell bell;
  Status result;   // written before `done`, immutable after
  RunStats stats;  // likewise
};

// A handle that is already terminal with `status` (a refused submission).
RunHandle refused_run(uint64_t run_id, Status status);

}  // namespace simpler::detail
