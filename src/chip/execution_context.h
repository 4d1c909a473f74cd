// ExecutionContext: whether the calling process may drive this chip's device
// right now. Every native phase call checks it first (preflight); a refusal
// changes nothing, so the call can be retried once the context is restored.
// In the simulation the context is lost in a forked child (another pid) and
// while the device is suspended (a modelled device reset). Any thread.
#pragma once

#include <sys/types.h>

#include <atomic>

#include "base/errors.h"
#include "base/process_id.h"

namespace simpler {

class ExecutionContext {
 public:
  ExecutionContext() : owner_pid_(process_id()) {}

  Status validate(const char* call) const {
    if (const pid_t caller = process_id(); caller != owner_pid_) {
      return failed_precondition("{}: execution context refused: the device belongs to pid {}, caller is pid {}", call,
                                 owner_pid_, caller);
    }
    if (suspended_.load(std::memory_order_acquire)) {
      return failed_precondition("{}: execution context refused: the device is suspended", call);
    }
    return Status();
  }
  void suspend() { suspended_.store(true, std::memory_order_release); }
  void restore() { suspended_.store(false, std::memory_order_release); }

 private:
  const pid_t owner_pid_;
  std::atomic<bool> suspended_{false};
};

}  // namespace simpler
