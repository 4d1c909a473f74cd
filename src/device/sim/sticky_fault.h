// StickyFault: the simulated chip's sticky device fault (CUDA/MPS
// semantics): once raised it stays until the device is destroyed, and every
// kernel a core has not yet started fails at once instead of running. Any
// thread may raise or read it; the first cause raised is the one kept.
// H3, the reliability plan's device-fault hook (test builds only,
// SIMPLER_TEST_HOOKS): armed for a kernel func_id, it raises the fault on the
// device whose core starts the n-th kernel with that func_id in this process.
// The armed state is process-global and inherited across fork, so a test arms
// it before it forks a node's children.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>

#include "simpler/status.h"

namespace simpler {

class StickyFault {
 public:
  // The first call wins; later causes are dropped.
  void raise(Status cause);
  bool raised() const { return raised_.load(std::memory_order_acquire); }
  // OK while healthy, else the DEVICE_FAULT cause.
  Status status() const;

 private:
  std::atomic<bool> raised_{false};
  mutable std::mutex mu_;
  Status cause_;
};

#ifdef SIMPLER_TEST_HOOKS
// H3: the n-th (1-based) kernel start with `func_id` in this process raises a
// sticky fault on the device it starts on, instead of running. Once. Each
// firing is also counted in `*fired` when given: a word in memory shared
// with forked children lets a test see a fault raised in a child.
void arm_device_fault_hook(uint32_t func_id, uint64_t nth = 1, std::atomic<uint64_t>* fired = nullptr);
void disarm_device_fault_hook();
// How many faults the hook raised in this process.
uint64_t device_fault_hook_fired();
// Core threads, before each kernel: whether this start is the armed one; if
// so, raises the fault `cause()` builds on `fault` and only then counts the
// firing, so whoever sees the count sees a faulted device (a test that
// submits once it saw the count is refused, never accepted mid-raise).
bool device_fault_hook_fire(uint32_t func_id, StickyFault& fault, const std::function<Status()>& cause);
#endif

}  // namespace simpler
