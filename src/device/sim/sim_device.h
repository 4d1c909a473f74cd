// SimDevice: the simulated chip, the "sim" backend. Global memory, one host
// thread per AICore and one per AICPU, all created at start() and joined at
// stop(); a run creates none. start/stop are for the owning thread;
// ring_aicpu and the accessors are for any thread.
#pragma once

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "base/doorbell.h"
#include "device/device.h"
#include "device/sim/core.h"
#include "device/sim/global_memory.h"
#include "device/sim/sticky_fault.h"

namespace simpler {

class SimDevice final : public Device {
 public:
  static Result<std::unique_ptr<SimDevice>> create(const Geometry& geometry, uint64_t memory_bytes,
                                                   bool guard_memory = false);
  ~SimDevice() override;

  const char* backend() const override { return "sim"; }
  const Geometry& geometry() const override { return geometry_; }
  GlobalMemory& memory() override { return *memory_; }
  CoreRegisters& core_registers(uint32_t core) override { return cores_[core]->regs(); }
  CoreExecutor* core_executor(uint32_t core) override { return cores_[core].get(); }
  void start(AicpuProgram* program) override;
  void stop() override;
  void ring_aicpu(uint32_t aicpu) override { bells_[aicpu].bell.ring_parked(); }
  Result<std::unique_ptr<DeviceRunner>> create_runner(uint64_t arena_bytes) override;
  Status fault() const override { return fault_.status(); }
  diag::Recorder* recorder() override { return &recorder_; }

  Core& core(uint32_t i) { return *cores_[i]; }
  uint64_t aicpu_parks() const { return parks_.load(std::memory_order_relaxed); }
  StickyFault& sticky_fault() { return fault_; }

 private:
  SimDevice(Geometry geometry, std::unique_ptr<GlobalMemory> memory);
  void aicpu_loop(uint32_t index);

  struct alignas(64) PaddedBell {
    Doorbell bell;
  };

  const Geometry geometry_;
  StickyFault fault_;        // before the cores, which point at it
  diag::Recorder recorder_;  // likewise
  std::unique_ptr<GlobalMemory> memory_;
  std::unique_ptr<PaddedBell[]> bells_;
  std::vector<std::unique_ptr<Core>> cores_;
  std::vector<std::thread> aicpu_;
  AicpuProgram* program_ = nullptr;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> parks_{0};
  SpinPolicy policy_;
};

}  // namespace simpler
