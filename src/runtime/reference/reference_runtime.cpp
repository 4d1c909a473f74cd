// The reference runtime: the oracle every other runtime is compared against.
// One thread (AICPU thread 0) executes each launched run's tasks one after
// another in submission order, calling the kernels itself: no ready queues,
// no dispatch to cores. Submission order is a topological order of every
// graph the tags can describe, so what it computes is what the program
// means. A failed task poisons every later task that conflicts (overlapping
// bytes, one of the two writing) with a failed or poisoned one, found by
// comparing accesses directly rather than through a dependency graph.
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "base/errors.h"
#include "device/kernel_call.h"
#include "runtime/common/run_builder.h"
#include "runtime/common/task_graph.h"
#include "runtime/runtime.h"

namespace simpler {
namespace {

struct RefTask {
  TaskKind kind;
  uint32_t blocks;
  uint32_t func_id[3];
  simpler_kernel_fn fn[3];
  const char* name[3];
  int64_t args[kMaxTaskArgs];
  uint32_t access_begin;
  uint32_t access_count;
  uint32_t uses_begin;
  uint32_t uses_count;
  uint32_t guards_begin;
  uint32_t guards_count;
  uint32_t deps_begin;  // tasks it follows by set_dependencies()
  uint32_t deps_count;
};

// Bytes [first, end) of one device allocation that a task reads or writes.
struct Access {
  uint64_t first;  // absolute device addresses
  uint64_t end;
  TensorView view;
  bool write;
};

bool conflict(const Access& a, const Access& b) {
  if (!a.write && !b.write) return false;
  if (a.end <= b.first || b.end <= a.first) return false;
  // Through one buffer the per-dimension test refines the byte ranges.
  return a.view.buffer().addr != b.view.buffer().addr || a.view.overlaps(b.view);
}

struct RefSlot {
  RefSlot(uint32_t max_tasks, DeviceMemory& memory) : allocations(memory, max_tasks * 2) {
    tasks.reserve(max_tasks);
    accesses.reserve(size_t{max_tasks} * kDescriptorsPerTask);
    uses.reserve(size_t{max_tasks} * kMaxTaskArgs);
    failed_task.reserve(max_tasks);
  }

  uint32_t index = 0;
  HostApi api;  // bound only inside build()
  DeviceTensor* descriptors = nullptr;
  uint32_t desc_count = 0;
  std::vector<RefTask> tasks;
  std::vector<Access> accesses;
  std::vector<uint32_t> uses;
  std::vector<uint32_t> deps;
  std::vector<uint8_t> failed_task;  // per task, while executing: it failed or was poisoned
  std::vector<GuardCheck> guards;    // guarded device memory: per task, see RefTask
  const ChipCallable* callable = nullptr;
  RunAllocations allocations;
  uint64_t launch_ns = 0;
};

class ReferenceBuilder final : public RunBuilder {
 public:
  ReferenceBuilder(RefSlot& s, const ChipCallable& callable, DeviceMemory& memory, uint32_t max_tasks)
      : RunBuilder(callable, s.api, memory, s.allocations, max_tasks),
        s_(s),
        max_descriptors_(max_tasks * kDescriptorsPerTask) {}

 private:
  Status reserve(uint32_t, uint32_t tensors) override {
    if (s_.desc_count + tensors > max_descriptors_) {
      return resource_exhausted("graph capacity: the run has more than {} tensor arguments", max_descriptors_);
    }
    return Status();
  }

  void place(const CheckedTask& t) override {
    RefTask task{};
    task.kind = t.kind;
    task.blocks = t.blocks;
    for (uint32_t i = 0; i < 3; ++i) {
      task.func_id[i] = t.func_id[i];
      task.fn[i] = t.fn[i];
      task.name[i] = t.name[i];
    }
    task.access_begin = static_cast<uint32_t>(s_.accesses.size());
    write_kernel_args(t, task.args, s_.descriptors, s_.desc_count, [&](size_t i, const TensorView& v, Tag tag) {
      if (tag == Tag::NoDep || t.local[i]) return;
      s_.accesses.push_back(
          Access{v.buffer().addr + v.first_byte(), v.buffer().addr + v.end_byte(), v, tag_writes(tag)});
    });
    task.access_count = static_cast<uint32_t>(s_.accesses.size()) - task.access_begin;
    task.uses_begin = static_cast<uint32_t>(s_.uses.size());
    s_.uses.insert(s_.uses.end(), t.uses.begin(), t.uses.begin() + t.use_count);
    task.uses_count = t.use_count;
    task.deps_begin = static_cast<uint32_t>(s_.deps.size());
    s_.deps.insert(s_.deps.end(), t.deps, t.deps + t.dep_count);
    task.deps_count = t.dep_count;
    task.guards_begin = static_cast<uint32_t>(s_.guards.size());
    if (memory().guarded()) collect_guard_checks(t, s_.guards);
    task.guards_count = static_cast<uint32_t>(s_.guards.size()) - task.guards_begin;
    s_.tasks.push_back(task);
  }

  RefSlot& s_;
  const uint32_t max_descriptors_;
};

class ReferenceRuntime final : public ChipRuntime {
 public:
  static Result<std::unique_ptr<ChipRuntime>> create(Device& device, const RuntimeOptions& options, RunDoneFn on_done) {
    SIMPLER_RETURN_IF_ERROR(check_runtime_options(options, device, "reference", "calls kernels on the host"));
    return std::unique_ptr<ChipRuntime>(new ReferenceRuntime(device, options.max_tasks_per_run, std::move(on_done)));
  }

  Result<std::unique_ptr<Pending>> build_grant(uint32_t grant) const override {
    auto g = std::make_unique<GrantState>();
    for (uint32_t i = 0; i < grant; ++i) {
      g->slots.push_back(std::make_unique<RefSlot>(max_tasks_, memory_));
      g->slots.back()->index = i;
    }
    return std::unique_ptr<Pending>(std::move(g));
  }

  void commit_grant(Pending& pending) noexcept override { slots_.swap(static_cast<GrantState&>(pending).slots); }
  uint32_t width() const override { return static_cast<uint32_t>(slots_.size()); }
  uint64_t arena_bytes() const override { return uint64_t{max_tasks_} * kDescriptorsPerTask * sizeof(DeviceTensor); }
  bool binding_held(uint32_t slot) const override { return slots_[slot]->api.bound(); }

  Status build(const HostApi& api, const ChipCallable& callable, const TaskArgs& run_args, const RuntimeEnv&,
               const diag::RunTrace& trace) override {
    if (api.slot >= slots_.size()) {
      return invalid_argument("pipeline_slot = {} is outside the grant of {}", api.slot, slots_.size());
    }
    RefSlot& s = *slots_[api.slot];
    s.tasks.clear();
    s.accesses.clear();
    s.uses.clear();
    s.deps.clear();
    s.guards.clear();
    s.callable = &callable;
    s.desc_count = 0;
    s.allocations.reset();
    uint64_t bytes = 0;
    SIMPLER_ASSIGN_OR_RETURN(const uint64_t arena, api.arena_setup(&bytes));
    if (bytes < arena_bytes()) {
      return internal_error("arena bank {} has {} bytes, a run needs {}", api.bank, bytes, arena_bytes());
    }
    s.descriptors = reinterpret_cast<DeviceTensor*>(arena);
    struct BindingGuard {
      RefSlot& s;
      ~BindingGuard() { s.api = HostApi{}; }
    } guard{s};
    s.api = api;
    ReferenceBuilder builder(s, callable, memory_, max_tasks_);
    builder.set_trace(trace);
    const Status st = builder.orchestrate(run_args);
    if (!st.ok()) s.allocations.release_all();
    return st;
  }

  void discard(uint32_t slot) override { slots_[slot]->allocations.release_all(); }

  void launch(uint32_t slot) override {
    slots_[slot]->launch_ns = now_ns();
    {
      std::lock_guard<std::mutex> lock(mu_);
      launched_.push_back(slot);
    }
    device_.ring_aicpu(0);
  }

  bool poll(uint32_t aicpu) override {
    if (aicpu != 0) return false;
    uint32_t slot = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (launched_.empty()) return false;
      slot = launched_.front();
      launched_.pop_front();
    }
    execute(*slots_[slot]);
    return true;
  }

 private:
  struct GrantState final : Pending {
    std::vector<std::unique_ptr<RefSlot>> slots;
  };

  ReferenceRuntime(Device& device, uint32_t max_tasks, RunDoneFn on_done)
      : device_(device), memory_(device.memory()), max_tasks_(max_tasks), on_done_(std::move(on_done)) {}

  void execute(RefSlot& s) {
    RunOutcome out;
    out.tasks = static_cast<uint32_t>(s.tasks.size());
    out.launch_ns = s.launch_ns;
    FirstError error;
    std::vector<const Access*> tainted;                 // accesses of failed and poisoned tasks
    std::vector<uint8_t>& failed_task = s.failed_task;  // reserved at grant: a run's end never allocates here
    failed_task.assign(s.tasks.size(), 0);
    KernelFailure failure;
    for (uint32_t t = 0; t < s.tasks.size(); ++t) {
      RefTask& task = s.tasks[t];
      const Access* begin = s.accesses.data() + task.access_begin;
      const Access* end = begin + task.access_count;
      bool poisoned = false;
      for (uint32_t d = 0; d < task.deps_count && !poisoned; ++d)
        poisoned = failed_task[s.deps[task.deps_begin + d]] != 0;
      for (const Access* a = begin; a != end && !poisoned; ++a) {
        for (const Access* b : tainted) {
          if (conflict(*a, *b)) {
            poisoned = true;
            break;
          }
        }
      }
      bool failed = poisoned;
      if (!poisoned) {
        for (uint32_t sub = 0; sub < subtask_count(task.kind, task.blocks); ++sub) {
          ++out.executed;
          const uint32_t k = kernel_of(task.kind, sub);
          const KernelLabel label{task.name[k], t, task.func_id[k], task.kind == TaskKind::Mix ? 0 : sub, task.blocks};
          if (!call_kernel(task.fn[k], task.args, failure, label)) {
            error.record(t, sub, kernel_failure(t, task.kind, sub, task.func_id[k], task.blocks, failure.message));
            failed = true;
          }
        }
        if (task.guards_count != 0) {
          Status st = check_task_guards(memory_, &s.guards[task.guards_begin], task.guards_count, t, task.kind,
                                        task.func_id, *s.callable);
          if (!st.ok()) {
            error.record(t, kGuardCheckSubtask, std::move(st));
            failed = true;
          }
        }
      }
      if (failed) {
        failed_task[t] = 1;
        for (const Access* a = begin; a != end; ++a) tainted.push_back(a);
      }
      for (uint32_t u = 0; u < task.uses_count; ++u) {
        if (s.allocations.release_user(s.uses[task.uses_begin + u])) ++out.released_early;
      }
    }
    out.status = error.get();
    s.allocations.release_all();
    out.end_ns = now_ns();
    on_done_(s.index, std::move(out));
  }

  Device& device_;
  DeviceMemory& memory_;
  const uint32_t max_tasks_;
  RunDoneFn on_done_;
  std::vector<std::unique_ptr<RefSlot>> slots_;
  std::mutex mu_;
  std::deque<uint32_t> launched_;  // runs in launch order, executed one at a time
};

}  // namespace

SIMPLER_REGISTER_RUNTIME(reference,
                         RuntimeInfo{"reference",
                                     "the serial oracle: one thread runs each run's tasks in submission order",
                                     /*concurrent=*/false, /*streaming=*/false, &ReferenceRuntime::create});

}  // namespace simpler
