// The simulated AICore: one host thread per core, fed through its handshake
// registers (device/core_registers.h). The owning AICPU thread posts tokens
// into the task descriptors; the core runs them in order, answers ACK, then
// FIN with each token, and rings its owner. Under a CoreProgram (a runtime
// whose cores schedule themselves) the thread runs that program instead and
// never reads the descriptors. A core of a device with a sticky fault raised starts no kernel:
// it answers FIN with the fault as the task's failure (or returns it from
// execute()). start/stop are for the device's owning thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

#include "base/doorbell.h"
#include "device/core_registers.h"
#include "device/device.h"
#include "device/sim/sticky_fault.h"
#include "diag/lane.h"
#include "simpler/types.h"

namespace simpler {

#ifdef SIMPLER_TEST_HOOKS
// Core threads, before a core ends a link unrun (behind a failed kernel): a
// test holds the core there to see the failure's FIN while the link is still
// queued. Null (the default): no hook. Set while no core is between tokens.
void set_core_skip_hook(void (*hook)());
#endif

class Core final : public CoreExecutor {
 public:
  // `fault`: the device's sticky fault, or null for a core of no device.
  // `lane`: where it records its tasks when their run is traced (null: never).
  // `owner_bell` is rung with ring_parked() after each FIN: its waiter parks
  // through a Doorbell::Parking.
  Core(uint32_t id, CoreType type, uint32_t cluster, Doorbell* owner_bell, StickyFault* fault = nullptr,
       diag::Lane* lane = nullptr);
  ~Core();
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  // `program`: run it on this thread instead of the handshake loop (null: don't).
  // `device`: the owner the thread's kernels run for (UserCodeMark).
  void start(const SpinPolicy& policy, CoreProgram* program = nullptr, const void* device = nullptr);
  // Asks the thread to exit once idle, and joins it.
  void stop();

  uint32_t id() const { return id_; }
  CoreType type() const { return type_; }
  uint32_t cluster() const { return cluster_; }
  CoreRegisters& regs() { return regs_; }
  uint64_t executed() const { return executed_.load(std::memory_order_relaxed); }

  // CoreExecutor, for this core's own thread under a CoreProgram.
  bool execute(simpler_kernel_fn fn, int64_t* args, const KernelLabel& label, KernelFailure& failure,
               uint32_t trace_level, uint64_t trace_run) override;

 private:
  void loop(SpinPolicy policy);
  void program_loop(SpinPolicy policy, CoreProgram* program);
  // Runs the kernel, unless the device is faulted (or H3 faults it now).
  bool run_kernel(simpler_kernel_fn fn, int64_t* args, KernelFailure& failure, const KernelLabel& label);

  const uint32_t id_;
  const CoreType type_;
  const uint32_t cluster_;
  Doorbell* const owner_bell_;
  StickyFault* const fault_;
  diag::Lane* const lane_;
  CoreRegisters regs_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> executed_{0};
  std::thread thread_;
};

}  // namespace simpler
