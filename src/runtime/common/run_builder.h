// RunBuilder: the part of a chip run's ChipOrchestrator that every runtime
// shares, so that a refusal reads word for word the same on each (the
// conformance suite compares first errors): the checks of a submit and their
// order, runtime-allocated outputs, alloc(), scopes and the intermediates
// they release, and the caller allocations the run borrows. A runtime
// derives from it and places each checked task in its own graph. Lives on
// the building thread for one orchestration call; the RunAllocations it
// fills belong to the run's set and outlive it.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/errors.h"
#include "device/device.h"
#include "diag/lane.h"
#include "runtime/common/run_allocations.h"
#include "runtime/common/task_graph.h"
#include "simpler/callable.h"
#include "simpler/orchestrator.h"

namespace simpler {

// The tensor descriptors a run's graph holds per task, on average: one budget
// for every runtime, so they refuse the same graphs.
inline constexpr uint32_t kDescriptorsPerTask = 4;

// A submitted task after every shared check, ready to be placed. The
// per-argument arrays hold meaning only at the indices of `args`: the
// builder reuses one CheckedTask and resets just those.
struct CheckedTask {
  uint32_t id = 0;
  TaskKind kind = TaskKind::AIV;
  uint32_t blocks = 1;  // SPMD
  uint32_t func_id[3] = {};
  simpler_kernel_fn fn[3] = {};
  const char* name[3] = {};  // the kernels' names; they live in the callable
  const TaskArgs* args = nullptr;
  // Per tensor argument: the view the kernel sees (a runtime-allocated
  // output's own view) and the device allocation holding it (its start and
  // size as DeviceMemory reports them).
  std::array<TensorView, kMaxTaskArgs> views;
  std::array<uint64_t, kMaxTaskArgs> bases{};
  std::array<uint64_t, kMaxTaskArgs> base_bytes{};
  // Per tensor argument: the intermediate it lies in, or Intermediates::kNone.
  std::array<uint32_t, kMaxTaskArgs> intermediate{};
  // Intermediates the task references, each once.
  std::array<uint32_t, kMaxTaskArgs> uses{};
  uint32_t use_count = 0;
  // Per tensor argument: it lies in an intermediate made in the open manual
  // scope, so its access makes no dependency.
  std::array<bool, kMaxTaskArgs> local{};
  // The tasks it follows by set_dependencies(), each once, all earlier.
  const uint32_t* deps = nullptr;
  uint32_t dep_count = 0;
};

// One allocation a task's tensor argument lies in, checked when the task ends
// on guarded device memory.
struct GuardCheck {
  uint64_t addr;
  uint64_t bytes;
  uint32_t arg;  // the first tensor argument in it
};

// Appends the distinct allocations of `t`'s tensor arguments to `out`.
void collect_guard_checks(const CheckedTask& t, std::vector<GuardCheck>& out);

// The error of task `task` whose kernels wrote `d` into the guards of the
// allocation of `check`.
Status guard_failure(const DeviceMemory::GuardDamage& d, const GuardCheck& check, uint32_t task, TaskKind kind,
                     const uint32_t* func_ids, const ChipCallable& callable);

// The task's error when a kernel of it wrote into the guards of one of
// `checks` (the first damaged, in argument order), else OK; damage(addr,
// bytes) reads and restores one allocation's guards. Any AICPU thread.
template <typename Damage>
Status check_task_guards(Damage&& damage, const GuardCheck* checks, uint32_t count, uint32_t task, TaskKind kind,
                         const uint32_t* func_ids, const ChipCallable& callable) {
  Status first;
  for (uint32_t k = 0; k < count; ++k) {
    // Every allocation is checked, so each damage is restored and reported once.
    const DeviceMemory::GuardDamage d = damage(checks[k].addr, checks[k].bytes);
    if (d.any() && first.ok()) first = guard_failure(d, checks[k], task, kind, func_ids, callable);
  }
  return first;
}

inline Status check_task_guards(DeviceMemory& memory, const GuardCheck* checks, uint32_t count, uint32_t task,
                                TaskKind kind, const uint32_t* func_ids, const ChipCallable& callable) {
  return check_task_guards([&](uint64_t addr, uint64_t bytes) { return memory.check_guards(addr, bytes); }, checks,
                           count, task, kind, func_ids, callable);
}

// Subtask `sub` of `task` (id `id`) ended; `failure` is its kernel's
// failure report, or null when it succeeded. Records that failure in
// `error`; the task's last subtask also checks the task's guards (`guards`
// is the array its guards_begin indexes; damage as for check_task_guards).
// True when the task has ended: its poisoned flag then says whether it
// failed. Any scheduling thread (an AICPU thread, or a core on the resident route).
template <typename Damage>
bool end_subtask(GraphTask& task, uint32_t id, uint32_t sub, const char* failure, FirstError& error, Damage&& damage,
                 const GuardCheck* guards, const ChipCallable& callable) {
  if (failure != nullptr) {
    error.record(id, sub,
                 kernel_failure(id, task.kind, sub, task.func_id[kernel_of(task.kind, sub)], task.blocks, failure));
    task.poisoned.store(1, std::memory_order_relaxed);
  }
  // A task of one subtask ends with it: no other subtask counts down beside
  // it, and the task's line, last written by its builder, stays shared.
  const bool alone = task.blocks == 1 && task.kind != TaskKind::Mix;
  if (!alone && task.subtasks_left.fetch_sub(1, std::memory_order_acq_rel) != 1) return false;
  if (task.guards_count != 0) {
    Status st =
        check_task_guards(damage, guards + task.guards_begin, task.guards_count, id, task.kind, task.func_id, callable);
    if (!st.ok()) {
      error.record(id, kGuardCheckSubtask, std::move(st));
      task.poisoned.store(1, std::memory_order_relaxed);
    }
  }
  return true;
}

// The descriptor a kernel receives for `v`; on every task's path, so inline.
inline void write_descriptor(DeviceTensor& d, const TensorView& v) {
  d.data = v.buffer().addr + static_cast<uint64_t>(v.offset()) * dtype_size(v.dtype());
  d.dtype = static_cast<uint32_t>(v.dtype());
  d.ndim = static_cast<uint32_t>(v.ndim());
  for (int k = 0; k < kMaxDims; ++k) {
    d.shape[k] = k < v.ndim() ? v.shape(k) : 0;
    d.stride[k] = k < v.ndim() ? v.stride(k) : 0;
  }
}

// Writes a checked task's kernel arguments into `out` (its args[] array): a
// scalar as its raw 64 bits, a tensor as a pointer to its descriptor, which
// goes into descriptors[next++]. Calls on_tensor(i, view, tag) for each tensor
// argument, so the runtime can record its access.
template <typename OnTensor>
void write_kernel_args(const CheckedTask& t, int64_t* out, DeviceTensor* descriptors, uint32_t& next,
                       OnTensor&& on_tensor) {
  const TaskArgs& args = *t.args;
  for (size_t i = 0; i < args.size(); ++i) {
    const TaskArg& a = args[i];
    if (a.kind == TaskArg::Kind::Scalar) {
      out[i] = static_cast<int64_t>(a.scalar);
      continue;
    }
    DeviceTensor& d = descriptors[next++];
    write_descriptor(d, t.views[i]);
    out[i] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(&d));
    on_tensor(i, t.views[i], a.tag);
  }
}

class RunBuilder : public ChipOrchestrator {
 public:
  RunBuilder(const ChipCallable& callable, const HostApi& api, DeviceMemory& memory, Intermediates& allocations,
             uint32_t max_tasks);

  Result<TaskRef> submit_aiv(uint32_t func_id, const TaskArgs& args) final;
  Result<TaskRef> submit_aic(uint32_t func_id, const TaskArgs& args) final;
  Result<TaskRef> submit_mix(const MixKernels& kernels, const TaskArgs& args) final;
  Result<TaskRef> submit_aiv_spmd(uint32_t func_id, const TaskArgs& args, uint32_t block_num) final;
  Result<TaskRef> submit_aic_spmd(uint32_t func_id, const TaskArgs& args, uint32_t block_num) final;
  Result<TensorView> alloc(const std::vector<int64_t>& shape, DType dtype) final;
  void scope_begin() final;
  Status scope_end() final;
  Status manual_scope_begin() final;
  Status set_dependencies(const std::vector<uint32_t>& predecessors) final;
  uint32_t task_count() const final { return task_count_; }

  // Runs the callable's orchestration over this builder. The result is the
  // orchestration's error, else the build's first refusal (which fails the
  // run even when the orchestration ignored the refused call's result); a
  // thrown exception becomes an error here and never leaves.
  Status orchestrate(const TaskArgs& run_args);
  // The run's swimlane recording (level 0: none), before orchestrate().
  void set_trace(const diag::RunTrace& trace) { trace_ = trace; }

 protected:
  // The runtime's own capacity for one more task with `tensors` tensor
  // arguments; a refusal adds nothing.
  virtual Status reserve(uint32_t task, uint32_t tensors) = 0;
  // Writes a checked task into the runtime's graph; cannot fail.
  virtual void place(const CheckedTask& task) = 0;

  DeviceMemory& memory() const { return memory_; }
  const ChipCallable& callable() const { return callable_; }
  // Each runtime reports every dependency edge it adds, once, for the trace.
  void trace_edge(uint32_t producer, uint32_t consumer) {
    if (trace_.level != 0) {
      trace_.orchestrator->record(diag::Event{trace_.run, 0, 0, nullptr, consumer, producer, diag::EventKind::kEdge});
    }
  }

 private:
  Result<TaskRef> submit(TaskKind kind, const uint32_t* funcs, const TaskArgs& args, uint32_t blocks = 1);
  SIMPLER_COLD Status refuse(Status st);
  // Intermediate `i` was just made: in the open manual scope, or outside any.
  void note_made(uint32_t i);
  // What holds [addr, addr + bytes), from a small cache of caller
  // allocations: most tasks name a few buffers over and over.
  Result<Intermediates::Held> allocation_of(uint64_t addr, uint64_t bytes);

  const ChipCallable& callable_;
  const HostApi& api_;
  DeviceMemory& memory_;
  Intermediates& allocations_;
  const uint32_t max_tasks_;
  uint32_t task_count_ = 0;
  // The task being submitted; see submit() for which fields it resets.
  CheckedTask task_;
  Status build_error_;
  std::array<DeviceMemory::Allocation, 4> known_{};
  uint32_t known_next_ = 0;
  // Manual scopes: the open one (serial 0: none), the scope depth it opened
  // at and its first task; the dependencies set for the next submit; and the
  // manual scope each intermediate was made in.
  uint32_t depth_ = 0;
  uint32_t manual_serial_ = 0;
  uint32_t manual_depth_ = 0;
  uint32_t manual_first_task_ = 0;
  uint32_t manual_scopes_ = 0;
  std::vector<uint32_t> deps_;
  std::unordered_map<uint32_t, uint32_t> made_in_manual_;
  diag::RunTrace trace_;
};

}  // namespace simpler
