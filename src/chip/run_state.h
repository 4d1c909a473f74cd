// RunState: the shared completion record behind a RunHandle. Completed exactly
// once by whichever thread finishes the run (an AICPU thread, or the submitting
// thread for a refusal); read by any number of waiters on any thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>

#include "base/doorbell.h"
#include "base/errors.h"
#include "simpler/run_handle.h"

namespace simpler::detail {

struct RunState;

// Progress a waiter may carry itself: where a run's hand-offs cross a
// worker's progress thread (the node Scheduler), the thread waiting for the
// run steps that worker's rounds instead, and the hop to and from the
// progress thread disappears. Shared by the handles of the worker's runs,
// which may outlive the worker.
class RunDriver {
 public:
  virtual ~RunDriver() = default;
  // Waits for `run` until `deadline_ns` (0 = none), stepping the worker's
  // rounds on the calling thread, and returns whether the run is done; or
  // returns nullopt, having waited for nothing, when this thread may not
  // drive (the worker is closing, or the thread is inside one of its
  // rounds: a terminal callback): the caller then waits as usual.
  virtual std::optional<bool> wait(const RunState& run, uint64_t deadline_ns) = 0;
  // One round on the calling thread, if no other thread is in one and this
  // thread may drive: a thread polling a run carries it without a hand-off.
  // Never waits.
  virtual void poll(const RunState& run) = 0;
};

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
  // Set, like on_terminal, before the run is handed on: a waiter drives it.
  std::shared_ptr<RunDriver> driver;
  std::atomic<uint32_t> done{0};
  Doorbell bell;
  Status result;   // written before `done`, immutable after
  RunStats stats;  // likewise
};

// A handle that is already terminal with `status` (a refused submission).
SIMPLER_COLD RunHandle refused_run(uint64_t run_id, Status status);

}  // namespace simpler::detail
