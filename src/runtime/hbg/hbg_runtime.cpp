#include "runtime/hbg/hbg_runtime.h"

#include <cstring>
#include <new>

#include "base/errors.h"
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
  std::vector<ReadyItem> rings[3];
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
  for (auto& ring : g->rings) ring.resize(size_t{grant} * capacity_.tasks);
  return std::unique_ptr<Pending>(std::move(g));
}

void HbgRuntime::commit_grant(Pending& pending) noexcept {
  auto& g = static_cast<GrantState&>(pending);
  slots_.swap(g.slots);
  aic_queue_.swap_storage(g.rings[0]);
  aiv_queue_.swap_storage(g.rings[1]);
  mix_queue_.swap_storage(g.rings[2]);
}

HbgRuntime::HbgRuntime(Device& device, Capacity capacity, RunDoneFn on_done)
    : device_(device),
      memory_(device.memory()),
      capacity_(capacity),
      on_done_(std::move(on_done)),
      aic_queue_(0),
      aiv_queue_(0),
      mix_queue_(0),
      inflight_(device.core_count()),
      next_token_(device.core_count(), 0),
      aicpu_(new AicpuState[device.geometry().aicpu_threads]) {
  for (uint32_t c = 0; c < device.core_count(); ++c) regs_.push_back(&device.core_registers(c));
  for (uint32_t c = 0; c < device.geometry().clusters; ++c) aicpu_[device.owner_of_cluster(c)].clusters.push_back(c);
}

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

Status HbgRuntime::build(const HostApi& api, const ChipCallable& callable, const TaskArgs& run_args) {
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
    task.subtasks_left.store(subtask_count(task.kind), std::memory_order_relaxed);
    task.poisoned.store(0, std::memory_order_relaxed);
  }
}

void HbgRuntime::launch(uint32_t slot) {
  Slot& s = *slots_[slot];
  s.launch_ns = now_ns();
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
  ReadyQueue* queues[3] = {&aic_queue_, &aiv_queue_, &mix_queue_};
  for (uint32_t t = 0; t < s.task_count; ++t) {
    if (s.tasks[t].fanin != 0) continue;
    const int k = static_cast<int>(s.tasks[t].kind);
    roots[k][held[k]++] = {slot, t};
    if (held[k] == kBatch) {
      queues[k]->push_many(roots[k], kBatch);
      held[k] = 0;
    }
  }
  for (int k = 0; k < 3; ++k) {
    if (held[k] != 0) queues[k]->push_many(roots[k], held[k]);
  }
  device_.ring_all_aicpu();
}

void HbgRuntime::dispatch(uint32_t core, ReadyItem item, uint32_t sub) {
  Slot& s = *slots_[item.slot];
  GraphTask& task = s.tasks[item.task];
  Inflight& f = inflight_[core];
  f.slot = item.slot;
  f.task = item.task;
  f.token = ++next_token_[core];
  f.busy = true;
  CoreRegisters& r = *regs_[core];
  r.fn = task.fn[sub];
  r.args = task.args;
  r.label = KernelLabel{task.name[sub], item.task, task.func_id[sub]};
  r.task.store((uint64_t{sub} << 32) | f.token, std::memory_order_release);
  r.bell.ring();
}

void HbgRuntime::complete_subtask(uint32_t core, bool kernel_failed, std::vector<ReadyItem>& ready) {
  Inflight& f = inflight_[core];
  f.busy = false;
  Slot& s = *slots_[f.slot];
  GraphTask& task = s.tasks[f.task];
  s.executed.fetch_add(1, std::memory_order_relaxed);
  if (kernel_failed) {
    const CoreRegisters& r = *regs_[core];
    const auto sub = static_cast<uint32_t>(r.task.load(std::memory_order_relaxed) >> 32);
    s.error.record(f.task, sub, kernel_failure(f.task, task.kind, sub, task.func_id[sub], r.failure.message));
    task.poisoned.store(1, std::memory_order_relaxed);
  }
  if (task.subtasks_left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    if (task.guards_count != 0) {
      Status st = check_task_guards(memory_, &s.guards[task.guards_begin], task.guards_count, f.task, task.kind,
                                    task.func_id, *s.callable);
      if (!st.ok()) {
        s.error.record(f.task, kGuardCheckSubtask, std::move(st));
        task.poisoned.store(1, std::memory_order_relaxed);
      }
    }
    finish_task(s, f.task, task.poisoned.load(std::memory_order_acquire) != 0, ready);
  }
}

void HbgRuntime::finish_task(Slot& s, uint32_t task, bool failed, std::vector<ReadyItem>& ready) {
  const uint32_t finished = release_fanout(s.graph(), task, failed, s.released_early, [&](uint32_t succ) {
    ready.push_back({s.index, succ});
  });
  // Successors must be queued before `remaining` can reach zero and hand the slot back.
  publish_ready(ready);
  if (s.remaining.fetch_sub(finished, std::memory_order_acq_rel) == finished) finish_run(s);
}

void HbgRuntime::publish_ready(std::vector<ReadyItem>& ready) {
  if (ready.empty()) return;
  ReadyItem by_kind[3][64];
  size_t n[3] = {0, 0, 0};
  ReadyQueue* queues[3] = {&aic_queue_, &aiv_queue_, &mix_queue_};
  for (const ReadyItem& it : ready) {
    const int k = static_cast<int>(slots_[it.slot]->tasks[it.task].kind);
    by_kind[k][n[k]++] = it;
    if (n[k] == 64) {
      queues[k]->push_many(by_kind[k], n[k]);
      n[k] = 0;
    }
  }
  for (int k = 0; k < 3; ++k) {
    if (n[k] != 0) queues[k]->push_many(by_kind[k], n[k]);
  }
  ready.clear();
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
  AicpuState& st = aicpu_[aicpu];
  std::vector<ReadyItem>& ready = st.scratch;
  bool progress = false;
  for (uint32_t c : st.clusters) {
    for (uint32_t core = 3 * c; core < 3 * c + 3; ++core) {
      Inflight& f = inflight_[core];
      if (!f.busy) continue;
      const uint64_t status = regs_[core]->status.load(std::memory_order_acquire);
      if ((status >> CoreRegisters::kStateShift) != 2 || (status & CoreRegisters::kTokenMask) != f.token) continue;
      complete_subtask(core, (status & CoreRegisters::kFailedBit) != 0, ready);
      progress = true;
    }
  }
  // Completions published their successors already; anything this thread
  // cannot place below is left for the others, woken at the end.
  const bool published = progress;
  // While mix tasks wait, one busy cluster per AICPU thread takes no single
  // tasks, so it drains and a mix task cannot starve behind a stream of singles.
  bool reserve_for_mix = !mix_queue_.empty_hint();
  for (uint32_t c : st.clusters) {
    const uint32_t aic = 3 * c;
    const bool cluster_idle = !inflight_[aic].busy && !inflight_[aic + 1].busy && !inflight_[aic + 2].busy;
    ReadyItem item;
    if (cluster_idle && !mix_queue_.empty_hint() && mix_queue_.pop(item)) {
      for (uint32_t sub = 0; sub < 3; ++sub) dispatch(aic + sub, item, sub);
      progress = true;
      continue;
    }
    if (reserve_for_mix && !cluster_idle) {
      reserve_for_mix = false;
      continue;
    }
    if (!inflight_[aic].busy && aic_queue_.pop(item)) {
      dispatch(aic, item, 0);
      progress = true;
    }
    for (uint32_t core = aic + 1; core < aic + 3; ++core) {
      if (!inflight_[core].busy && aiv_queue_.pop(item)) {
        dispatch(core, item, 0);
        progress = true;
      }
    }
  }
  if (published && (!aic_queue_.empty_hint() || !aiv_queue_.empty_hint() || !mix_queue_.empty_hint())) {
    for (uint32_t a = 0; a < device_.geometry().aicpu_threads; ++a) {
      if (a != aicpu) device_.ring_aicpu(a);
    }
  }
  return progress;
}

SIMPLER_REGISTER_RUNTIME(host_build_graph,
                         RuntimeInfo{"host_build_graph",
                                     "the host builds each run's whole graph; AICPU threads dispatch it to the cores",
                                     /*concurrent=*/true, &HbgRuntime::create});

}  // namespace simpler::hbg
