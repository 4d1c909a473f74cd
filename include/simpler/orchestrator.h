// ChipOrchestrator (a chip run's kernel tasks) and Orchestrator (a node run's
// next-level and sub tasks): what an orchestration function uses to build one
// run. Called only from the thread running that orchestration, for the
// duration of the call; neither is kept. The runtime owns what they build.
#pragma once

#include <cstdint>
#include <vector>

#include "simpler/callable.h"
#include "simpler/task_args.h"

namespace simpler {

// A submitted task: its id within the run and, in argument order, the views
// the runtime allocated for its unbound Tag::Output arguments (empty, and
// allocation-free, when it had none).
struct TaskRef {
  uint32_t id = 0;
  std::vector<TensorView> outputs;
};

// The three kernels of a mixed task: one AIC and two AIV subtasks that run
// together in one cluster.
struct MixKernels {
  uint32_t aic = 0;
  uint32_t aiv0 = 0;
  uint32_t aiv1 = 0;
};

class ChipOrchestrator {
 public:
  virtual ~ChipOrchestrator() = default;

  // Each submit validates func_id against the callable's kernels and core type,
  // every tensor against its buffer, and the run's task capacity; a refusal
  // adds nothing and is also recorded as the run's first error, so the run
  // fails even if the orchestration ignores the return value.
  virtual Result<TaskRef> submit_aiv(uint32_t func_id, const TaskArgs& args) = 0;
  virtual Result<TaskRef> submit_aic(uint32_t func_id, const TaskArgs& args) = 0;
  virtual Result<TaskRef> submit_mix(const MixKernels& kernels, const TaskArgs& args) = 0;
  // SPMD: one task whose kernel runs `block_num` times, each block on a free
  // core of its type (at once where cores are free), reading its block with
  // simpler_block_index(). The task is done when every block is; it fails
  // with its lowest failing block. block_num is in [1, kMaxBlocks].
  virtual Result<TaskRef> submit_aiv_spmd(uint32_t func_id, const TaskArgs& args, uint32_t block_num) = 0;
  virtual Result<TaskRef> submit_aic_spmd(uint32_t func_id, const TaskArgs& args, uint32_t block_num) = 0;
  static constexpr uint32_t kMaxBlocks = 1u << 16;

  // An intermediate tensor in device memory owned by the run. Allocated inside a
  // scope, it is released once the scope has ended and its last user finished.
  virtual Result<TensorView> alloc(const std::vector<int64_t>& shape, DType dtype) = 0;
  virtual void scope_begin() = 0;
  virtual Status scope_end() = 0;

  // A scope, ended by scope_end(), in which the orchestration states the
  // order of the tasks on the intermediates made inside it: their accesses
  // make no dependency, and a task follows exactly the tasks named by
  // set_dependencies() before its submit. Every other tensor (caller
  // buffers, intermediates from outside) is ordered by its accesses as
  // anywhere. Manual scopes do not nest; an intermediate made in one cannot
  // be used once it ended.
  virtual Status manual_scope_begin() = 0;
  // Inside a manual scope: the next submit follows these tasks, each one
  // submitted earlier in this manual scope; a second call replaces the first.
  virtual Status set_dependencies(const std::vector<uint32_t>& predecessors) = 0;

  virtual uint32_t task_count() const = 0;
};

enum class ScopeMode : uint8_t { kAuto, kManual };

// The node and network levels (Worker at Level::Node or Level::Network).
// Tasks depend on one another, within and across live runs, through the tags
// of their tensor arguments over overlapping regions (device buffers of one
// chip, or shared-heap tensors).
// A refused submit adds nothing and is recorded as the run's first error.
class Orchestrator {
 public:
  virtual ~Orchestrator() = default;

  // One run of `callable` on next-level worker `worker`. Level::Node: chip
  // `worker`; device tensors must be live allocations of that chip
  // (Worker::malloc_on); shared-heap tensors are staged onto its device for
  // the run and written spans copied back. Level::Network: node `worker`
  // runs the NodeCallable as one run of its own; every tensor must be in
  // the shared heap (a node's own orchestration may pass them on to its
  // chips and sub workers). Returns the task's id within the run.
  virtual Result<uint32_t> submit_next_level(CallableHandle callable, const TaskArgs& args, uint32_t worker) = 0;
  // One call of `fn` on any sub worker; every tensor must be in the shared heap.
  virtual Result<uint32_t> submit_sub(FunctionHandle fn, const TaskArgs& args) = 0;
  // One task of several members, all-or-nothing: member i runs `callable`
  // with args[i] on next-level worker workers[i] (distinct workers). Either every member
  // is accepted or the group adds nothing; no member is published unless
  // every one can be; the task is done when all members are, and fails with
  // the first member that fails. Returns the group's id within the run.
  virtual Result<uint32_t> submit_next_level_group(CallableHandle callable, const std::vector<TaskArgs>& args,
                                                   const std::vector<uint32_t>& workers) = 0;
  // As above for `fn`, each member on a distinct sub worker (a group may
  // not be larger than sub_workers).
  virtual Result<uint32_t> submit_sub_group(FunctionHandle fn, const std::vector<TaskArgs>& args) = 0;

  // An intermediate in the shared heap owned by the run. Allocated inside a
  // scope, it is freed once the scope has ended and its last user finished;
  // otherwise when the run is terminal.
  virtual Result<TensorView> alloc(const std::vector<int64_t>& shape, DType dtype) = 0;
  virtual void scope_begin() = 0;
  virtual Status scope_end() = 0;

  virtual uint32_t task_count() const = 0;
};

// RAII scope over either orchestrator: ends the scope on destruction. A
// refused manual scope is recorded as the run's error and opens an ordinary
// one, so the destructor still ends what was opened.
class Scope {
 public:
  explicit Scope(ChipOrchestrator& o, ScopeMode mode = ScopeMode::kAuto) : chip_(&o) {
    if (mode == ScopeMode::kManual) {
      (void)chip_->manual_scope_begin();
    } else {
      chip_->scope_begin();
    }
  }
  explicit Scope(Orchestrator& o) : node_(&o) { node_->scope_begin(); }
  ~Scope() { (void)(chip_ != nullptr ? chip_->scope_end() : node_->scope_end()); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  ChipOrchestrator* chip_ = nullptr;
  Orchestrator* node_ = nullptr;
};

}  // namespace simpler
