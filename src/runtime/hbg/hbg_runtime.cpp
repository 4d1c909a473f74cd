#include "runtime/hbg/hbg_runtime.h"

#include "base/errors.h"
#include "diag/arg_capture.h"

namespace simpler::hbg {

struct HbgRuntime::GrantState final : GrantOwner::Pending {
  std::vector<std::unique_ptr<Slot>> slots;
  CoreDispatcher::Storage queues;
};

uint64_t HbgRuntime::arena_bytes() const { return capacity_.arena_bytes(); }

Result<std::unique_ptr<ChipRuntime>> HbgRuntime::create(Device& device, const RuntimeOptions& options,
                                                        RunDoneFn on_done) {
  SIMPLER_RETURN_IF_ERROR(
      check_runtime_options(options, device, "host_build_graph", "builds its graph in device memory from the host"));
  return std::unique_ptr<ChipRuntime>(
      new HbgRuntime(device, GraphCapacity::for_tasks(options.max_tasks_per_run), std::move(on_done)));
}

Result<std::unique_ptr<GrantOwner::Pending>> HbgRuntime::build_grant(uint32_t grant) const {
  auto g = std::make_unique<GrantState>();
  g->slots.reserve(grant);
  for (uint32_t i = 0; i < grant; ++i) {
    g->slots.push_back(std::make_unique<Slot>(capacity_, memory_));
    g->slots.back()->index = i;
  }
  SIMPLER_ASSIGN_OR_RETURN(g->queues, dispatcher_.make_storage(size_t{grant} * capacity_.tasks, grant));
  return std::unique_ptr<Pending>(std::move(g));
}

void HbgRuntime::commit_grant(Pending& pending) noexcept {
  auto& g = static_cast<GrantState&>(pending);
  slots_.swap(g.slots);
  dispatcher_.swap_storage(g.queues);
}

HbgRuntime::HbgRuntime(Device& device, GraphCapacity capacity, RunDoneFn on_done)
    : device_(device),
      memory_(device.memory()),
      capacity_(capacity),
      on_done_(std::move(on_done)),
      dispatcher_(device, CoreDispatcher::InlinePolicy::kUnderLoadOrFewCpus) {}

HbgRuntime::~HbgRuntime() = default;

void HbgRuntime::discard(uint32_t slot) { slots_[slot]->allocations.release_all(); }

Status HbgRuntime::build(const HostApi& api, const ChipCallable& callable, const TaskArgs& run_args, const RuntimeEnv&,
                         const diag::RunTrace& trace) {
  if (api.slot >= slots_.size()) {
    return invalid_argument("pipeline_slot = {} is outside the grant of {}", api.slot, slots_.size());
  }
  return build_host_graph(*slots_[api.slot], capacity_, memory_, api, callable, run_args, trace);
}

void HbgRuntime::launch(uint32_t slot) {
  Slot& s = *slots_[slot];
  s.launch_ns = now_ns();
  dispatcher_.set_trace(slot, s.trace);
  dispatcher_.begin_run(slot);
  if (s.task_count == 0) {
    finish_run(s);
    return;
  }
  s.remaining.store(s.task_count, std::memory_order_release);
  // The roots go out in batches from the stack: a launch cannot fail, so it
  // must not allocate (T12's H2 loop found the vectors that were here).
  constexpr size_t kBatch = 64;
  ReadyItem roots[3][kBatch];
  const auto task_of_root = [this](ReadyItem it) -> GraphTask& { return task_of(it); };
  size_t held[3] = {};
  for (uint32_t t = 0; t < s.task_count; ++t) {
    if (s.tasks[t].fanin != 0) continue;
    const TaskKind kind = s.tasks[t].kind;
    const int k = static_cast<int>(kind);
    roots[k][held[k]++] = {slot, t};
    if (held[k] == kBatch) {
      dispatcher_.push_many(kind, roots[k], kBatch, task_of_root);
      held[k] = 0;
    }
  }
  for (int k = 0; k < 3; ++k) {
    if (held[k] != 0) dispatcher_.push_many(static_cast<TaskKind>(k), roots[k], held[k], task_of_root);
  }
  device_.ring_all_aicpu();
}

void HbgRuntime::complete_subtask(const CoreDispatcher::Inflight& f, const char* failure,
                                  std::vector<ReadyItem>& ready) {
  Slot& s = *slots_[f.slot];
  GraphTask& task = s.tasks[f.task];
  const auto damage = [this](uint64_t addr, uint64_t bytes) { return memory_.check_guards(addr, bytes); };
  if (!end_subtask(task, f.task, f.sub, failure, s.error, damage, s.guards.data(), *s.callable)) return;
  // Its outputs as the kernels left them, before a successor may overwrite them.
  if (s.trace.capture != nullptr) s.trace.capture->after(f.aicpu, task.id);
  finish_task(s, f.task, task.poisoned.load(std::memory_order_acquire) != 0, ready);
}

void HbgRuntime::finish_task(Slot& s, uint32_t task, bool failed, std::vector<ReadyItem>& ready) {
  const uint32_t finished = release_fanout(s.graph(), task, failed, s.released_early, [&](uint32_t succ) {
    if (s.tasks[succ].chained == 0) ready.push_back({s.index, succ});  // a chain link is on its core already
  });
  // Successors must be queued before `remaining` can reach zero and hand the slot back.
  dispatcher_.publish(ready, [this](ReadyItem it) -> GraphTask& { return task_of(it); });
  if (s.remaining.fetch_sub(finished, std::memory_order_acq_rel) == finished) finish_run(s);
}

bool HbgRuntime::chain_after(ReadyItem after, TaskKind kind, ReadyItem& next) const {
  Slot& s = *slots_[after.slot];
  const GraphTask& ahead = s.tasks[after.task];
  if (ahead.guards_count != 0) return false;
  for (uint32_t i = 0; i < ahead.fanout_count; ++i) {
    const uint32_t succ = s.fanout[ahead.fanout_begin + i];
    if (!take_as_chain_link(s.tasks[succ], kind)) continue;
    next = ReadyItem{after.slot, succ};
    return true;
  }
  return false;
}

void HbgRuntime::finish_run(Slot& s) {
  RunOutcome out;
  out.tasks = s.task_count;
  out.released_early = s.released_early.load(std::memory_order_relaxed);
  const CoreDispatcher::Counts counts = dispatcher_.counts(s.index);
  out.executed = counts.executed;
  out.chained = counts.chained;
  out.taken_back = counts.taken_back;
  out.launch_ns = s.launch_ns;
  out.status = s.error.get();
  s.allocations.release_all();
  out.end_ns = now_ns();
  on_done_(s.index, std::move(out));
}

bool HbgRuntime::poll(uint32_t aicpu) {
  return dispatcher_.poll(
      aicpu, [this](ReadyItem it) -> GraphTask& { return task_of(it); },
      [this](const CoreDispatcher::Inflight& f, const char* failure, std::vector<ReadyItem>& ready) {
        complete_subtask(f, failure, ready);
      },
      [this](ReadyItem after, TaskKind kind, ReadyItem& next) { return chain_after(after, kind, next); },
      [this](ReadyItem it) {
        // A task with guard checks has no links (chain_after).
        Slot& s = *slots_[it.slot];
        return s.tasks[it.task].guards_count == 0 && heads_chain(s.graph(), it.task);
      });
}

SIMPLER_REGISTER_RUNTIME(host_build_graph,
                         RuntimeInfo{"host_build_graph",
                                     "the host builds each run's whole graph; AICPU threads dispatch it to the cores",
                                     /*concurrent=*/true, /*streaming=*/false, &HbgRuntime::create,
                                     /*captures_args=*/true});

}  // namespace simpler::hbg
