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
#include "simpler/tensor.h"

namespace simpler {

class ArgCapture {
 public:
  // `capacity`: more than the task ids a run may have live at once (its
  // max_tasks_per_run, which bounds a streaming runtime's window too): task
  // `id` is kept at id % capacity. `collector` outlives every capture.
  ArgCapture(ArgsDumpCollector& collector, uint32_t capacity, uint64_t run_epoch);

  // Building thread, before task `task` is published: `views[i]` is argument
  // i's tensor as the task sees it (a runtime-allocated output, bound).
  void add_task(uint64_t task, uint32_t func_id, const TaskArgs& args, const TensorView* views);
  // AICPU thread `aicpu`: before the task's first subtask is dispatched, and
  // after its last one finished, before its successors are released.
  void before(uint32_t aicpu, uint64_t task);
  void after(uint32_t aicpu, uint64_t task);
  // The resumable form (the resident route's supervisor, one argument at a
  // time): argument `k` of `task` wanted at `stage`, as its record and its
  // source (null `*src_out`: metadata only); false when `k` is past the last.
  // The record's `order` is left 0 for the caller to stamp.
  bool stage_arg(uint64_t task, DumpStage stage, uint64_t k, DumpRecord& r, DumpSource& src, bool& bytes) const;
  ArgsDumpCollector& collector() { return collector_; }

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
  void fill(const Task& t, const Arg& a, DumpStage stage, DumpRecord& r) const;

  ArgsDumpCollector& collector_;
  const uint64_t run_epoch_;
  std::vector<Task> tasks_;  // by id % size; sized once, so AICPU readers never see it move
};

}  // namespace simpler
