// Worker: the user's entry point at every level (the level is a label). One
// controlling thread of the process that initialised it drives it, never its
// own orchestrations or kernels (refused); RunHandles may be waited on from
// any thread. It owns its device (Level::Chip) or its children and shared
// heap (Level::Node, Level::Network), its threads and its allocations.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "simpler/call_config.h"
#include "simpler/callable.h"
#include "simpler/orchestrator.h"
#include "simpler/remote.h"
#include "simpler/run_handle.h"
#include "simpler/types.h"
#include "simpler/worker_config.h"

namespace simpler {

class Worker {
 public:
  Worker(Level level, WorkerConfig config = {});
  ~Worker();  // close()s
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  Level level() const;
  const WorkerConfig& config() const;

  // Level::Chip/Node, before init. Refuses duplicates by name and callables
  // whose kernels are missing.
  Result<CallableHandle> register_callable(ChipCallable callable);
  // Level::Network, before init: a node run its next-level workers execute.
  // Refuses duplicates by name.
  Result<CallableHandle> register_callable(NodeCallable callable);
  // Level::Node/Network, before init: a host function for the sub workers.
  Result<FunctionHandle> register_function(SubFunction fn);
  // Level::Network, before init: `worker`, an uninitialised Level::Node
  // Worker with its callables and functions registered, becomes next-level
  // worker i (the returned index). It is forked at init and initialised in
  // its own process, where it runs this worker's NodeCallables. `worker` is
  // left closed. Refuses another level, an initialised worker, or a config
  // its own init would refuse (naming the field) and then changes nothing.
  Result<uint32_t> add_next_level_worker(Worker&& worker);
  // Level::Network, before init, under mpirun on rank 0: next-level worker i
  // (the returned index) is the node that serve_node serves on MPI rank
  // `rank`. init() greets it and fails if it grants fewer sets than
  // pipeline_depth or lacks one of this worker's NodeCallables. Its tensors
  // are sent with each request and its outputs and inouts returned with the
  // terminal; a rank that dies or falls silent for heartbeat_timeout ends
  // every run it held with an error naming it (docs/remote_nodes.md).
  Result<uint32_t> add_remote_worker(int rank, RemoteNodeOptions options = {});
  // Validates the config (naming the field), creates the device and its
  // threads. Level::Node/Network: forks every child first, then starts its
  // threads; fails if a child grants fewer sets than pipeline_depth.
  Status init();

  // Level::Chip: device memory. Level::Node: refused (name the chip with
  // malloc_on). Level::Network: refused (use malloc_shared).
  Result<DeviceBuffer> malloc(uint64_t bytes);
  // Level::Node: device memory of chip `worker`, through its control frame.
  // The address names the chip, so it is refused on any other.
  Result<DeviceBuffer> malloc_on(uint32_t worker, uint64_t bytes);
  // Level::Node/Network: host memory in the shared heap, which every child
  // (and a network's grandchildren) maps at the same address; `addr` is a
  // host pointer the caller may use directly.
  Result<DeviceBuffer> malloc_shared(uint64_t bytes);
  // Level::Node/Network: refused while a live run borrows the buffer.
  Status free(DeviceBuffer buffer);
  Status copy_to(DeviceBuffer dst, const void* src, uint64_t bytes, uint64_t dst_offset = 0);
  Status copy_from(void* dst, DeviceBuffer src, uint64_t bytes, uint64_t src_offset = 0);
  // Device memory, exact in 64 bits. Level::Node: the sum over its chips,
  // each read through that chip's control frame. Level::Network: the sum
  // over its nodes, each read through that node's control frame.
  Result<MemoryInfo> memory_info() const;
  // Level::Node: device memory of chip `worker` alone, read through its
  // control frame, exact in 64 bits; a worker the node does not have is
  // INVALID_ARGUMENT naming it. Level::Network: the sum over node `worker`'s
  // chips, through that node's control frame. Level::Chip:
  // FAILED_PRECONDITION, as for malloc_on: the one chip's memory is memory_info().
  Result<MemoryInfo> memory_info_on(uint32_t worker) const;

  // Asynchronous: builds the run's graph on this thread and launches it. Blocks
  // only while pipeline_depth runs are already in flight. A refused submission
  // returns a handle that is already done with the error.
  RunHandle submit(CallableHandle callable, const TaskArgs& args);
  // The same with this run's diagnostics instead of WorkerConfig::call; a
  // bad CallConfig is refused naming the field (docs/diagnostics.md).
  RunHandle submit(CallableHandle callable, const TaskArgs& args, const CallConfig& call);
  // Level::Node/Network: runs `orchestration` on this thread to build one
  // run of next-level and sub tasks, then schedules it. Blocks only while
  // pipeline_depth runs are admitted (whole-run FIFO). The run is terminal
  // when all its tasks are; its result is the first task error.
  RunHandle submit(std::function<Status(Orchestrator&)> orchestration);
  // The same with this run's diagnostics: each chip task the run sends a
  // chip child carries them, and the run's trace.json holds the node's host
  // lanes and every chip child's events.
  RunHandle submit(std::function<Status(Orchestrator&)> orchestration, const CallConfig& call);
  // submit + wait.
  Status run(CallableHandle callable, const TaskArgs& args);

  // Drains in-flight runs, stops every device thread and frees device memory.
  // Idempotent; afterwards every call returns FAILED_PRECONDITION. Refused,
  // changing nothing, from the worker's own orchestrations and kernels (which
  // it would wait for) and in a fork() child's copy of the worker; the
  // destructor of such a copy leaves the worker alone.
  Status close();

  struct Impl;

 private:
  friend Status serve_node(Worker&& node, std::vector<NodeCallable> callables, ServeOptions options);
  std::unique_ptr<Impl> impl_;
};

}  // namespace simpler
