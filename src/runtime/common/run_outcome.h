// RunOutcome: what a chip runtime reports once per launched run, after it
// stopped touching the run's set. Built by the thread that finishes the run
// (an AICPU thread, or the launching thread for an empty graph); a value.
#pragma once

#include <cstdint>
#include <functional>

#include "simpler/status.h"

namespace simpler {

struct RunOutcome {
  Status status;
  uint32_t tasks = 0;
  uint32_t executed = 0;        // subtasks that ran a kernel
  uint32_t released_early = 0;  // intermediates freed during the run because their scope had ended
  uint32_t chained = 0;         // subtasks posted behind their predecessor on its core
  uint32_t taken_back = 0;      // subtasks queued behind a blocked kernel, then placed again
  uint64_t launch_ns = 0;
  uint64_t end_ns = 0;
  // The run's argument capture was aborted: a dump lane's terminal stays
  // unclosed, so nothing proves its producer stopped (R117, R57).
  bool capture_unsettled = false;
};

// Called once per launched run with the set it held.
using RunDoneFn = std::function<void(uint32_t slot, RunOutcome outcome)>;

}  // namespace simpler
