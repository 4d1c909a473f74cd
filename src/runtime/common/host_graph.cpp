#include "runtime/common/host_graph.h"

#include <algorithm>
#include <new>

#include "base/errors.h"

namespace simpler {

namespace {
constexpr uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }

// The ChipOrchestrator of one run being built into a HostGraph: the shared
// checks are RunBuilder's; this places each task in the graph (descriptors,
// task record) and finds its dependencies.
class GraphBuilder final : public RunBuilder {
 public:
  GraphBuilder(HostGraph& g, const GraphCapacity& capacity, DeviceMemory& memory, const ChipCallable& callable)
      : RunBuilder(callable, g.api, memory, g.allocations, capacity.tasks), capacity_(capacity), g_(g) {}

 private:
  Status reserve(uint32_t, uint32_t tensors) override {
    if (g_.desc_count + tensors > capacity_.descriptors) {
      return resource_exhausted("graph capacity: the run has more than {} tensor arguments", capacity_.descriptors);
    }
    return Status();
  }

  // `to` is always the task being placed, so its line is in cache.
  void add_edge(uint32_t from, uint32_t to) {
    if (from == to || g_.pred_mark[from] == to + 1) return;
    g_.pred_mark[from] = to + 1;
    g_.edges.emplace_back(from, to);
    ++g_.tasks[to].fanin;
    trace_edge(from, to);
  }

  // `base` is the device allocation holding the view's buffer: accesses are
  // grouped by allocation, so views through different sub-buffers of one
  // allocation still meet.
  void add_dependencies(uint32_t task, const TensorView& view, Tag tag, uint64_t base) {
    const uint64_t shift = view.buffer().addr - base;
    g_.accesses.add(base, view, shift + view.first_byte(), shift + view.end_byte(), task, tag_writes(tag),
                    [&](uint32_t earlier) { add_edge(earlier, task); });
  }

  void place(const CheckedTask& t) override {
    GraphTask& task = g_.tasks[t.id];
    task.kind = t.kind;
    task.id = t.id;
    task.blocks = t.blocks;
    task.nargs = static_cast<uint8_t>(t.args->size());
    task.fanin = 0;
    task.fanout_begin = 0;
    task.fanout_count = 0;
    for (uint32_t i = 0; i < 3; ++i) {
      task.func_id[i] = t.func_id[i];
      task.fn[i] = t.fn[i];
      task.name[i] = t.name[i];
    }
    write_kernel_args(t, task.args, g_.descriptors, g_.desc_count, [&](size_t i, const TensorView& v, Tag tag) {
      if (tag != Tag::NoDep && !t.local[i]) add_dependencies(t.id, v, tag, t.bases[i]);
    });
    for (uint32_t k = 0; k < t.dep_count; ++k) add_edge(t.deps[k], t.id);
    // use_pairs is in task order, so its index is the task's place in `uses`.
    task.uses_begin = static_cast<uint32_t>(g_.use_pairs.size());
    task.uses_count = t.use_count;
    for (uint32_t u = 0; u < t.use_count; ++u) g_.use_pairs.emplace_back(t.id, t.uses[u]);
    task.guards_begin = static_cast<uint32_t>(g_.guards.size());
    if (memory().guarded()) collect_guard_checks(t, g_.guards);
    task.guards_count = static_cast<uint32_t>(g_.guards.size()) - task.guards_begin;
    // Armed here, while the task's lines are in cache: a second pass over a
    // million tasks after the build read them all back from memory.
    task.fanin_left.store(task.fanin, std::memory_order_relaxed);
    task.subtasks_left.store(subtask_count(task.kind, task.blocks), std::memory_order_relaxed);
    task.next_block.store(0, std::memory_order_relaxed);
    task.poisoned.store(0, std::memory_order_relaxed);
    task.chained = 0;
    g_.task_count = t.id + 1;
  }

  const GraphCapacity& capacity_;
  HostGraph& g_;
};

Status bind_arena(HostGraph& g, const GraphCapacity& capacity, const HostApi& api) {
  uint64_t bytes = 0;
  SIMPLER_ASSIGN_OR_RETURN(const uint64_t addr, api.arena_setup(&bytes));
  if (bytes < capacity.arena_bytes()) {
    return internal_error("arena bank {} has {} bytes, a graph needs {}", api.bank, bytes, capacity.arena_bytes());
  }
  if (g.arena_addr == addr) return Status();
  auto* p = reinterpret_cast<uint8_t*>(addr);
  g.tasks = reinterpret_cast<GraphTask*>(p);
  for (uint32_t t = 0; t < capacity.tasks; ++t) new (&g.tasks[t]) GraphTask();
  p += align_up(sizeof(GraphTask) * capacity.tasks, 64);
  g.descriptors = reinterpret_cast<DeviceTensor*>(p);
  p += align_up(sizeof(DeviceTensor) * capacity.descriptors, 64);
  g.fanout = reinterpret_cast<uint32_t*>(p);
  p += align_up(sizeof(uint32_t) * capacity.edges, 64);
  g.uses = reinterpret_cast<uint32_t*>(p);
  g.arena_addr = addr;
  return Status();
}

void finalize_graph(HostGraph& g) {
  const uint32_t n = g.task_count;
  // Fanout lists in CSR form, by counting sort on the source task; place()
  // counted each task's fanin and armed its counters.
  std::fill(g.counts.begin(), g.counts.begin() + n + 1, 0);
  for (auto [from, to] : g.edges) ++g.counts[from + 1];
  for (uint32_t t = 0; t < n; ++t) g.counts[t + 1] += g.counts[t];
  // place() left every task with no successor; only those with some are
  // read back (an independent graph's million tasks are not).
  for (uint32_t t = 0; t < n; ++t) {
    if (g.counts[t + 1] == g.counts[t]) continue;
    GraphTask& task = g.tasks[t];
    task.fanout_begin = g.counts[t];
    task.fanout_count = g.counts[t + 1] - g.counts[t];
  }
  for (auto [from, to] : g.edges) g.fanout[g.counts[from]++] = to;
  for (size_t u = 0; u < g.use_pairs.size(); ++u) g.uses[u] = g.use_pairs[u].second;
}
}  // namespace

GraphCapacity GraphCapacity::for_tasks(uint32_t max_tasks) {
  return GraphCapacity{max_tasks, max_tasks * kDescriptorsPerTask, max_tasks * 8};
}

uint64_t GraphCapacity::arena_bytes() const {
  return align_up(sizeof(GraphTask) * tasks, 64) + align_up(sizeof(DeviceTensor) * descriptors, 64) +
         align_up(sizeof(uint32_t) * edges, 64) + align_up(sizeof(uint32_t) * edges, 64);
}

HostGraph::HostGraph(const GraphCapacity& c, DeviceMemory& memory)
    : pred_mark(c.tasks, 0), counts(c.tasks + 1, 0), accesses(c.descriptors), allocations(memory, c.tasks * 2) {}

Status build_host_graph(HostGraph& g, const GraphCapacity& capacity, DeviceMemory& memory, const HostApi& api,
                        const ChipCallable& callable, const TaskArgs& run_args, const diag::RunTrace& trace) {
  // Only the previous run's tasks can hold a mark.
  std::fill(g.pred_mark.begin(), g.pred_mark.begin() + g.task_count, 0);
  g.task_count = 0;
  g.desc_count = 0;
  g.edges.clear();
  g.use_pairs.clear();
  g.guards.clear();
  g.callable = &callable;
  g.accesses.clear();
  g.allocations.reset();
  g.executed.store(0, std::memory_order_relaxed);
  g.released_early.store(0, std::memory_order_relaxed);
  g.error.reset();
  g.trace = trace;
  SIMPLER_RETURN_IF_ERROR(bind_arena(g, capacity, api));
  // The builder reaches the run's HostApi through the graph only while this
  // call runs; the guard unbinds it on every exit, so no finished run's
  // binding can be used by a later one (R88).
  struct BindingGuard {
    HostGraph& g;
    ~BindingGuard() { g.api = HostApi{}; }
  } guard{g};
  g.api = api;
  GraphBuilder builder(g, capacity, memory, callable);
  builder.set_trace(trace);
  Status st = builder.orchestrate(run_args);
  if (st.ok() && g.edges.size() > capacity.edges) {
    st = resource_exhausted("graph capacity: the run has {} dependency edges, more than {} (8 x max_tasks_per_run)",
                            g.edges.size(), capacity.edges);
  }
  if (st.ok() && g.use_pairs.size() > capacity.edges) {
    st = resource_exhausted("graph capacity: the run has {} intermediate uses, more than {}", g.use_pairs.size(),
                            capacity.edges);
  }
  if (!st.ok()) {
    g.allocations.release_all();
    return st;
  }
  finalize_graph(g);
  return Status();
}

}  // namespace simpler
