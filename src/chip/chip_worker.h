// ChipWorker: one simulated chip (L2) with the host_build_graph runtime: its
// registered callables, device memory, run-resource sets (one per admitted
// run, pipeline_depth of them, leased from a RunResourceArena) and run completion. All methods except the
// completion path are for the one controlling thread; completion runs on
// AICPU threads and touches only the slot table and RunStates.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "base/doorbell.h"
#include "chip/run_resource_arena.h"
#include "chip/run_state.h"
#include "device/sim_device.h"
#include "runtime/hbg/hbg_runtime.h"
#include "simpler/worker.h"

namespace simpler {

class ChipWorker {
 public:
  static Result<std::unique_ptr<ChipWorker>> create(const WorkerConfig& config, std::vector<ChipCallable> callables);
  ~ChipWorker();

  Result<DeviceBuffer> malloc(uint64_t bytes);
  Status free(DeviceBuffer buffer);
  Status copy_to(DeviceBuffer dst, const void* src, uint64_t bytes, uint64_t dst_offset);
  Status copy_from(void* dst, DeviceBuffer src, uint64_t bytes, uint64_t src_offset);
  MemoryInfo memory_info() const;

  RunHandle submit(uint32_t callable, const TaskArgs& args);
  // Drains admitted runs (up to `drain_timeout`), then stops the device. If runs
  // are still on the device then, the device is abandoned (leaked, never freed
  // under running threads) and DEADLINE_EXCEEDED is returned.
  Status close(std::chrono::milliseconds drain_timeout);

 private:
  ChipWorker(const WorkerConfig& config, std::vector<ChipCallable> callables);
  Status check_signature(const ChipCallable& c, const TaskArgs& args) const;
  Status check_buffer(const DeviceBuffer& b, uint64_t offset, uint64_t bytes, const char* what) const;
  Result<Lease> acquire_set();
  void release_set(const Lease& lease);
  void on_run_done(uint32_t slot, hbg::RunOutcome outcome);

  const WorkerConfig config_;
  const std::vector<ChipCallable> callables_;
  std::unique_ptr<SimDevice> device_;
  std::unique_ptr<hbg::HbgRuntime> runtime_;

  std::unique_ptr<RunResourceArena> arena_;
  Doorbell slot_bell_;  // rung when a set is released or the worker closes
  struct SlotRun {
    Lease lease;
    std::shared_ptr<detail::RunState> state;
    RunStats stats;
    std::vector<uint8_t> blob;  // the run's encoded arguments, retained per slot
  };
  std::vector<SlotRun> slot_runs_;
  std::atomic<uint32_t> in_flight_{0};
  std::atomic<bool> closing_{false};
  std::atomic<uint64_t> next_run_id_{1};
};

}  // namespace simpler
