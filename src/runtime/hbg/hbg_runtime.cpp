#include "runtime/hbg/hbg_runtime.h"

#include <cstring>
#include <new>

#include "base/errors.h"
#include "diag/arg_capture.h"
#include "runtime/hbg/graph_builder.h"

namespace simpler::hbg {

namespace {
constexpr uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }

uint64_t slot_bytes(const Capacity& c) {
  return align_up(sizeof(GraphTask) * c.tasks, 64) + align_up(sizeof(DeviceTensor) * c.descriptors, 64) +
         align_up(sizeof(uint32_t) * c.edges, 64) + align_up(sizeof(uint32_t) * c.edges, 64);
}

Capacity capacity_for(uint32_t max_tasks) {
  return Capacity{max_tasks, max_tasks * kDescriptorsPerTask, max_tasks * 8};
}
}  // namespace

Slot::Slot(const Capacity& c, DeviceMemory& memory)
    : pred_mark(c.tasks, 0), counts(c.tasks + 1, 0), accesses(c.descriptors), allocations(memory, c.tasks * 2) {}

struct HbgRuntime::GrantState final : GrantOwner::Pending {
  std::vector<std::unique_ptr<Slot>> slots;
  CoreDispatcher::Storage queues;
};

uint64_t HbgRuntime::arena_bytes() const { return slot_bytes(capacity_); }

Result<std::unique_ptr<ChipRuntime>> HbgRuntime::create(Device& device, const RuntimeOptions& options,
                                                        RunDoneFn on_done) {
  SIMPLER_RETURN_IF_ERROR(
      check_runtime_options(options, device, "host_build_graph", "builds its graph in device memory from the host"));
  return std::unique_ptr<ChipRuntime>(
      new HbgRuntime(device, capacity_for(options.max_tasks_per_run), std::move(on_done)));
}

Result<std::unique_ptr<GrantOwner::Pending>> HbgRuntime::build_grant(uint32_t grant) const {
  auto g = std::make_unique<GrantState>();
  g->slots.reserve(grant);
  for (uint32_t i = 0; i < grant; ++i) {
    g->slots.push_back(std::make_unique<Slot>(capacity_, memory_));
    g->slots.back()->index = i;
  }
  g->queues = dispatcher_.make_storage(size_t{grant} * capacity_.tasks, grant);
  return std::unique_ptr<Pending>(std::move(g));
}

void HbgRuntime::commit_grant(Pending& pending) noexcept {
  auto& g = static_cast<GrantState&>(pending);
  slots_.swap(g.slots);
  dispatcher_.swap_storage(g.queues);
}

HbgRuntime::HbgRuntime(Device& device, Capacity capacity, RunDoneFn on_done)
    : device_(device),
      memory_(device.memory()),
      capacity_(capacity),
      on_done_(std::move(on_done)),
      dispatcher_(device) {}

HbgRuntime::~HbgRuntime() = default;

Status HbgRuntime::bind_arena(Slot& s, const HostApi& api) {
  uint64_t bytes = 0;
  SIMPLER_ASSIGN_OR_RETURN(const uint64_t addr, api.arena_setup(&bytes));
  if (bytes < slot_bytes(capacity_)) {
    return internal_error("arena bank {} has {} bytes, a graph needs {}", api.bank, bytes, slot_bytes(capacity_));
  }
  if (s.arena_addr == addr) return Status();
  auto* p = reinterpret_cast<uint8_t*>(addr);
  s.tasks = reinterpret_cast<GraphTask*>(p);
  for (uint32_t t = 0; t < capacity_.tasks; ++t) new (&s.tasks[t]) GraphTask();
  p += align_up(sizeof(GraphTask) * capacity_.tasks, 64);
  s.descriptors = reinterpret_cast<DeviceTensor*>(p);
  p += align_up(sizeof(DeviceTensor) * capacity_.descriptors, 64);
  s.fanout = reinterpret_cast<uint32_t*>(p);
  p += align_up(sizeof(uint32_t) * capacity_.edges, 64);
  s.uses = reinterpret_cast<uint32_t*>(p);
  s.arena_addr = addr;
  return Status();
}

void HbgRuntime::discard(uint32_t slot) { slots_[slot]->allocations.release_all(); }

Status HbgRuntime::build(const HostApi& api, const ChipCallable& callable, const TaskArgs& run_args, const RuntimeEnv&,
                         const diag::RunTrace& trace) {
  if (api.slot >= slots_.size()) {
    return invalid_argument("pipeline_slot = {} is outside the grant of {}", api.slot, slots_.size());
  }
  Slot& s = *slots_[api.slot];
  // Only the previous run's tasks can hold a mark.
  std::fill(s.pred_mark.begin(), s.pred_mark.begin() + s.task_count, 0);
  s.task_count = 0;
  s.desc_count = 0;
  s.edges.clear();
  s.use_pairs.clear();
  s.guards.clear();
  s.callable = &callable;
  s.accesses.clear();
  s.allocations.reset();
  s.executed.store(0, std::memory_order_relaxed);
  s.released_early.store(0, std::memory_order_relaxed);
  s.error.reset();
  s.trace = trace;
  SIMPLER_RETURN_IF_ERROR(bind_arena(s, api));
  // The builder reaches the run's HostApi through the slot only while this
  // call runs; the guard unbinds it on every exit, so no finished run's
  // binding can be used by a later one (R88).
  struct BindingGuard {
    Slot& s;
    ~BindingGuard() { s.api = HostApi{}; }
  } guard{s};
  s.api = api;
  GraphBuilder builder(*this, s, callable);
  builder.set_trace(trace);
  Status st = builder.orchestrate(run_args);
  if (st.ok() && s.edges.size() > capacity_.edges) {
    st = resource_exhausted("graph capacity: the run has {} dependency edges, more than {} (8 x max_tasks_per_run)",
                            s.edges.size(), capacity_.edges);
  }
  if (st.ok() && s.use_pairs.size() > capacity_.edges) {
    st = resource_exhausted("graph capacity: the run has {} intermediate uses, more than {}", s.use_pairs.size(),
                            capacity_.edges);
  }
  if (!st.ok()) {
    s.allocations.release_all();
    return st;
  }
  finalize_graph(s);
  return Status();
}

void HbgRuntime::finalize_graph(Slot& s) {
  const uint32_t n = s.task_count;
  // Fanout lists in CSR form, by counting sort on the source task.
  std::fill(s.counts.begin(), s.counts.begin() + n + 1, 0);
  for (auto [from, to] : s.edges) ++s.counts[from + 1];
  for (uint32_t t = 0; t < n; ++t) s.counts[t + 1] += s.counts[t];
  for (uint32_t t = 0; t < n; ++t) {
    GraphTask& task = s.tasks[t];
    task.fanout_begin = s.counts[t];
    task.fanout_count = s.counts[t + 1] - s.counts[t];
    task.fanin = 0;
  }
  for (auto [from, to] : s.edges) {
    s.fanout[s.counts[from]++] = to;
    ++s.tasks[to].fanin;
  }
  // use_pairs are appended in task order, so they are already grouped.
  uint32_t u = 0;
  for (uint32_t t = 0; t < n; ++t) {
    GraphTask& task = s.tasks[t];
    task.uses_begin = u;
    while (u < s.use_pairs.size() && s.use_pairs[u].first == t) {
      s.uses[u] = s.use_pairs[u].second;
      ++u;
    }
    task.uses_count = u - task.uses_begin;
    task.fanin_left.store(task.fanin, std::memory_order_relaxed);
    task.subtasks_left.store(subtask_count(task.kind, task.blocks), std::memory_order_relaxed);
    task.next_block.store(0, std::memory_order_relaxed);
    task.poisoned.store(0, std::memory_order_relaxed);
  }
}

void HbgRuntime::launch(uint32_t slot) {
  Slot& s = *slots_[slot];
  s.launch_ns = now_ns();
  dispatcher_.set_trace(slot, s.trace);
  dispatcher_.reset_last_done(slot);
  if (s.task_count == 0) {
    finish_run(s);
    return;
  }
  s.remaining.store(s.task_count, std::memory_order_release);
  // The roots go out in batches from the stack: a launch cannot fail, so it
  // must not allocate (T12's H2 loop found the vectors that were here).
  constexpr size_t kBatch = 64;
  ReadyItem roots[3][kBatch];
  size_t held[3] = {};
  for (uint32_t t = 0; t < s.task_count; ++t) {
    if (s.tasks[t].fanin != 0) continue;
    const TaskKind kind = s.tasks[t].kind;
    const int k = static_cast<int>(kind);
    roots[k][held[k]++] = {slot, t};
    if (held[k] == kBatch) {
      dispatcher_.push_many(kind, roots[k], kBatch);
      held[k] = 0;
    }
  }
  for (int k = 0; k < 3; ++k) {
    if (held[k] != 0) dispatcher_.push_many(static_cast<TaskKind>(k), roots[k], held[k]);
  }
  device_.ring_all_aicpu();
}

void HbgRuntime::complete_subtask(const CoreRegisters& r, const CoreDispatcher::Inflight& f, bool kernel_failed,
                                  std::vector<ReadyItem>& ready) {
  Slot& s = *slots_[f.slot];
  GraphTask& task = s.tasks[f.task];
  s.executed.fetch_add(1, std::memory_order_relaxed);
  const auto damage = [this](uint64_t addr, uint64_t bytes) { return memory_.check_guards(addr, bytes); };
  if (!end_subtask(task, f.task, r, kernel_failed, s.error, damage, s.guards.data(), *s.callable)) return;
  // Its outputs as the kernels left them, before a successor may overwrite them.
  if (s.trace.capture != nullptr) s.trace.capture->after(f.aicpu, task.id);
  finish_task(s, f.task, task.poisoned.load(std::memory_order_acquire) != 0, ready);
}

void HbgRuntime::finish_task(Slot& s, uint32_t task, bool failed, std::vector<ReadyItem>& ready) {
  const uint32_t finished = release_fanout(s.graph(), task, failed, s.released_early, [&](uint32_t succ) {
    ready.push_back({s.index, succ});
  });
  // Successors must be queued before `remaining` can reach zero and hand the slot back.
  dispatcher_.publish(ready, [this](ReadyItem it) -> GraphTask& { return task_of(it); });
  if (s.remaining.fetch_sub(finished, std::memory_order_acq_rel) == finished) finish_run(s);
}

void HbgRuntime::finish_run(Slot& s) {
  RunOutcome out;
  out.tasks = s.task_count;
  out.executed = s.executed.load(std::memory_order_relaxed);
  out.released_early = s.released_early.load(std::memory_order_relaxed);
  out.launch_ns = s.launch_ns;
  out.status = s.error.get();
  s.allocations.release_all();
  out.end_ns = now_ns();
  on_done_(s.index, std::move(out));
}

bool HbgRuntime::poll(uint32_t aicpu) {
  return dispatcher_.poll(
      aicpu, [this](ReadyItem it) -> GraphTask& { return task_of(it); },
      [this](const CoreRegisters& r, const CoreDispatcher::Inflight& f, bool failed, std::vector<ReadyItem>& ready) {
        complete_subtask(r, f, failed, ready);
      });
}

SIMPLER_REGISTER_RUNTIME(host_build_graph,
                         RuntimeInfo{"host_build_graph",
                                     "the host builds each run's whole graph; AICPU threads dispatch it to the cores",
                                     /*concurrent=*/true, /*streaming=*/false, &HbgRuntime::create,
                                     /*captures_args=*/true});

}  // namespace simpler::hbg
