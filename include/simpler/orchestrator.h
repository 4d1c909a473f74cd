// ChipOrchestrator: what an orchestration function uses to build one run's
// task graph. Called only from the thread running that orchestration, for the
// duration of the call; it is not kept. The runtime owns the graph it builds.
#pragma once

#include <cstdint>
#include <vector>

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

  // An intermediate tensor in device memory owned by the run. Allocated inside a
  // scope, it is released once the scope has ended and its last user finished.
  virtual Result<TensorView> alloc(const std::vector<int64_t>& shape, DType dtype) = 0;
  virtual void scope_begin() = 0;
  virtual Status scope_end() = 0;

  virtual uint32_t task_count() const = 0;
};

// RAII scope: ends the scope on destruction.
class Scope {
 public:
  explicit Scope(ChipOrchestrator& o) : o_(o) { o_.scope_begin(); }
  ~Scope() { (void)o_.scope_end(); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  ChipOrchestrator& o_;
};

}  // namespace simpler
