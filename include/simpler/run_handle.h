// RunHandle: the future of one submitted run, at every level, and the stats
// of a finished run. A RunHandle is a shared reference: copy it freely and
// wait on it from any thread; the run's terminal is published exactly once.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "simpler/status.h"

namespace simpler {

// At Level::Node: `executed` counts tasks a child ran to success, and
// `device_us` spans the run's first publication to its last task terminal.
struct RunStats {
  uint32_t tasks = 0;           // tasks in the run's graph
  uint32_t executed = 0;        // subtasks that ran a kernel
  uint32_t released_early = 0;  // intermediates freed during the run because their scope had ended
  uint32_t chained = 0;         // subtasks posted behind the one they wait on, on its core (chained dispatch)
  uint32_t taken_back = 0;      // subtasks queued behind a kernel that then blocked, taken back and placed again
  double build_us = 0;          // orchestration (graph build) time on the host
  double device_us = 0;         // launch to last completion
};

namespace detail {
struct RunState;
}

class RunHandle {
 public:
  RunHandle() = default;
  explicit RunHandle(std::shared_ptr<detail::RunState> state) : state_(std::move(state)) {}

  bool valid() const { return state_ != nullptr; }
  // Never blocks. On a node-level run it may step the node's scheduler
  // once on the calling thread, so a thread polling its run carries it.
  bool done() const;
  // Blocks (spin briefly, then park) until the run is terminal; returns its result.
  Status wait() const;
  // As wait(), but gives up after `timeout` with DEADLINE_EXCEEDED; the run goes on.
  Status wait_for(std::chrono::nanoseconds timeout) const;
  // The terminal result; FAILED_PRECONDITION while the run is not done.
  Status result() const;
  RunStats stats() const;
  uint64_t run_id() const;

 private:
  std::shared_ptr<detail::RunState> state_;
};

}  // namespace simpler
