// Worker: the user's entry point at every level (the level is a label), and
// RunHandle, the future of one submitted run. A Worker is used from one
// controlling thread (register, init, malloc/copy, submit, close); RunHandles
// may be waited on from any thread. A Worker owns its device, its threads and
// every device allocation it made.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "simpler/callable.h"
#include "simpler/orchestrator.h"
#include "simpler/types.h"

namespace simpler {

struct WorkerConfig {
  Geometry geometry = Geometry::small();
  uint32_t pipeline_depth = 2;               // runs admitted at once; each holds one run-resource set
  uint32_t launch_depth = 0;                 // runs launched on the device at once; 0 = pipeline_depth
  uint64_t device_memory_bytes = 1ull << 30; // simulated GM size (reserved, committed on touch)
  uint32_t max_tasks_per_run = 16384;        // graph capacity of one run-resource set
};

struct CallableHandle {
  uint32_t id = 0;
  Digest digest{};
};

struct RunStats {
  uint32_t tasks = 0;          // tasks in the run's graph
  uint32_t executed = 0;       // subtasks that ran a kernel
  uint32_t released_early = 0; // intermediates freed during the run because their scope had ended
  double build_us = 0;         // orchestration (graph build) time on the host
  double device_us = 0;        // launch to last completion
};

namespace detail {
struct RunState;
}

class RunHandle {
 public:
  RunHandle() = default;
  explicit RunHandle(std::shared_ptr<detail::RunState> state) : state_(std::move(state)) {}

  bool valid() const { return state_ != nullptr; }
  // Never blocks.
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

struct MemoryInfo {
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
};

class Worker {
 public:
  Worker(Level level, WorkerConfig config = {});
  ~Worker();  // close()s
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  Level level() const;
  const WorkerConfig& config() const;

  // Before init. Refuses duplicates by name and callables whose kernels are missing.
  Result<CallableHandle> register_callable(ChipCallable callable);
  // Validates the config (naming the field), creates the device and its threads.
  Status init();

  Result<DeviceBuffer> malloc(uint64_t bytes);
  Status free(DeviceBuffer buffer);
  Status copy_to(DeviceBuffer dst, const void* src, uint64_t bytes, uint64_t dst_offset = 0);
  Status copy_from(void* dst, DeviceBuffer src, uint64_t bytes, uint64_t src_offset = 0);
  Result<MemoryInfo> memory_info() const;

  // Asynchronous: builds the run's graph on this thread and launches it. Blocks
  // only while pipeline_depth runs are already in flight. A refused submission
  // returns a handle that is already done with the error.
  RunHandle submit(CallableHandle callable, const TaskArgs& args);
  // submit + wait.
  Status run(CallableHandle callable, const TaskArgs& args);

  // Drains in-flight runs, stops every device thread and frees device memory.
  // Idempotent; afterwards every call returns FAILED_PRECONDITION.
  Status close();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace simpler
