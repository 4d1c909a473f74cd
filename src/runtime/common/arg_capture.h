// Argument capture for a dumping run on the routes whose AICPU sees task
// boundaries: which tensor arguments of each task the run's selection
// captures (recorded by the building thread at submit, before the task is
// published), and the captures themselves, on the AICPU thread that starts
// or ends the task: inputs and inouts before its first subtask is
// dispatched, outputs and inouts after its last one finished and before its
// successors are released. Owns the per-task tables; the collector is the run's.
#pragma once

#include <cstdint>
#include <vector>

#include "diag/args_dump_collector.h"
#include "simpler/task_args.h"

namespace simpler {

class ArgCapture {
 public:
  // `capacity`: the keys a run may use at once (a runtime's task ids, or its
  // window slots); `collector` outlives every capture.
  ArgCapture(ArgsDumpCollector& collector, uint32_t capacity, uint64_t run_epoch);

  // Building thread, before task `key` (run task id `task`) is published.
  void add_task(uint32_t key, uint64_t task, uint32_t func_id, const TaskArgs& args);
  // AICPU thread `aicpu`.
  void before(uint32_t aicpu, uint32_t key);
  void after(uint32_t aicpu, uint32_t key);

 private:
  struct Arg {
    TensorView view;
    uint16_t index;
    DumpRole role;
    bool bytes;  // false: metadata only (HYBRID, unmarked)
  };
  struct Task {
    uint64_t id = 0;
    uint32_t func_id = 0;
    std::vector<Arg> args;
  };
  void capture(uint32_t aicpu, const Task& t, DumpStage stage);

  ArgsDumpCollector& collector_;
  const uint64_t run_epoch_;
  std::vector<Task> tasks_;  // by key; sized once, so AICPU readers never see it move
};

}  // namespace simpler
