// HostGraph: one run-resource set's graph as the host builds it, whole and in
// place in the device memory of the set's bank arena (tasks, descriptors,
// fanout lists), and the run's execution counters. host_build_graph and the
// resident route share it; they differ only in who schedules it after
// launch. The building thread writes everything before launch; afterwards
// the scheduling threads touch only the atomics. Owns its build scratch.
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/common/access_index.h"
#include "runtime/common/run_allocations.h"
#include "runtime/common/run_builder.h"
#include "runtime/common/task_graph.h"

namespace simpler {

struct GraphCapacity {
  uint32_t tasks;
  uint32_t descriptors;
  uint32_t edges;

  // The capacity of a graph of at most `max_tasks` tasks.
  static GraphCapacity for_tasks(uint32_t max_tasks);
  // Bytes of the bank arena that holds one such graph.
  uint64_t arena_bytes() const;
};

struct HostGraph {
  HostGraph(const GraphCapacity& c, DeviceMemory& memory);

  uint32_t index = 0;
  uint64_t arena_addr = 0;  // the bank arena the pointers below are carved from
  GraphTask* tasks = nullptr;
  DeviceTensor* descriptors = nullptr;
  uint32_t* fanout = nullptr;
  uint32_t* uses = nullptr;

  // Build state: written only by the building thread, before launch.
  HostApi api;
  const ChipCallable* callable = nullptr;  // the last run's; names kernels in errors
  std::vector<GuardCheck> guards;          // guarded device memory: per task, see GraphTask
  uint32_t task_count = 0;
  uint32_t desc_count = 0;
  std::vector<std::pair<uint32_t, uint32_t>> edges;      // (from, to)
  std::vector<std::pair<uint32_t, uint32_t>> use_pairs;  // (task, intermediate)
  std::vector<uint32_t> pred_mark;                       // edge de-duplication
  std::vector<uint32_t> counts;                          // CSR scratch
  AccessIndex accesses;
  RunAllocations allocations;
  diag::RunTrace trace;  // the run's, handed to its scheduler at launch

  // Execution state: shared by the scheduling threads after launch.
  std::atomic<uint32_t> remaining{0};
  std::atomic<uint32_t> executed{0};  // the resident route's count (a CoreDispatcher's runtime counts per core)
  std::atomic<uint32_t> released_early{0};
  FirstError error;
  uint64_t launch_ns = 0;

  TaskGraphView graph() { return TaskGraphView{tasks, fanout, uses, &allocations}; }
};

// Runs the callable's orchestration into `g` through `api` (bank api.bank's
// arena, which must hold capacity.arena_bytes()), arming each task's
// counters as it is placed, then lays out the fanout lists. On an error the
// set holds nothing (its intermediates are freed). The run's HostApi is
// reachable through `g` only while this runs (R88). The building thread.
Status build_host_graph(HostGraph& g, const GraphCapacity& capacity, DeviceMemory& memory, const HostApi& api,
                        const ChipCallable& callable, const TaskArgs& run_args, const diag::RunTrace& trace);

// The ids of `g`'s tasks with no predecessor, in task order, to on_root(task).
template <typename OnRoot>
void for_each_root(const HostGraph& g, OnRoot&& on_root) {
  for (uint32_t t = 0; t < g.task_count; ++t) {
    if (g.tasks[t].fanin == 0) on_root(t);
  }
}

}  // namespace simpler
