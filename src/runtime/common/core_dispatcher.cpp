#include "runtime/common/core_dispatcher.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "base/errors.h"
#include "base/load_sense.h"

namespace simpler {

Result<CoreDispatcher::Storage> CoreDispatcher::make_storage(size_t capacity_per_queue, uint32_t grant) const {
  if (grant > ReadyQueue::kMaxSlots) {
    return invalid_argument("pipeline_depth = {}: a chip's ready queues hold at most {} run-resource sets", grant,
                            ReadyQueue::kMaxSlots);
  }
  Storage s;
  for (int k = 0; k < 3; ++k) s.rings[k] = queues_[k]->ring_for(capacity_per_queue);
  s.traces.resize(grant);
  s.records.assign(size_t{grant} * regs_.size(), CoreRecord{});
  s.orchestrator_executed.assign(grant, 0);
  return s;
}

CoreDispatcher::CoreDispatcher(Device& device, InlinePolicy policy)
    : device_(device),
      rec_(device.recorder()),
      aic_queue_(0),
      aiv_queue_(0),
      mix_queue_(0),
      cores_(device.core_count()),
      next_token_(device.core_count(), 0),
      aicpu_(new AicpuState[device.geometry().aicpu_threads]),
      inline_allowed_([] {
        const char* env = std::getenv("SIMPLER_INLINE_DISPATCH");
        return env == nullptr || std::strcmp(env, "0") != 0;
      }()),
      few_cpus_policy_(policy == InlinePolicy::kUnderLoadOrFewCpus) {
  for (uint32_t c = 0; c < device.core_count(); ++c) regs_.push_back(&device.core_registers(c));
  for (uint32_t c = 0; c < device.geometry().clusters; ++c) aicpu_[device.owner_of_cluster(c)].clusters.push_back(c);
}

void CoreDispatcher::swap_storage(Storage& storage) noexcept {
  for (int k = 0; k < 3; ++k) queues_[k]->swap_storage(storage.rings[k]);
  traces_.swap(storage.traces);
  records_.swap(storage.records);
  orchestrator_executed_.swap(storage.orchestrator_executed);
}

void CoreDispatcher::begin_run(uint32_t slot) {
  std::fill_n(records_.begin() + static_cast<ptrdiff_t>(size_t{slot} * regs_.size()), regs_.size(), CoreRecord{});
  orchestrator_executed_[slot] = 0;
}

uint32_t CoreDispatcher::last_done(uint32_t slot, uint32_t* out, uint32_t capacity) const {
  const uint32_t n = std::min<uint32_t>(capacity, static_cast<uint32_t>(regs_.size()));
  const CoreRecord* row = records_.data() + size_t{slot} * regs_.size();
  for (uint32_t c = 0; c < n; ++c) out[c] = row[c].last_done;
  return n;
}

CoreDispatcher::Counts CoreDispatcher::counts(uint32_t slot) const {
  Counts n;
  n.executed = orchestrator_executed_[slot];
  const CoreRecord* row = records_.data() + size_t{slot} * regs_.size();
  for (size_t c = 0; c < regs_.size(); ++c) {
    n.executed += row[c].executed;
    n.chained += row[c].chained;
    n.taken_back += row[c].taken_back;
  }
  return n;
}

void CoreDispatcher::dispatch(uint32_t aicpu, uint32_t core, ReadyItem item, GraphTask& task, uint32_t sub, Post post) {
  const bool chained = post == Post::kLink;
  const diag::RunTrace& tr = traces_[item.slot];
  const uint64_t begin = tr.level >= 2 ? now_ns() : 0;
  const uint32_t k = kernel_of(task.kind, sub);
  CoreQueue& q = cores_[core];
  Inflight& f = q.push();
  f.slot = item.slot;
  f.task = item.task;
  f.sub = sub;
  f.task_id = task.id;
  f.aicpu = aicpu;
  f.name = task.name[k];
  f.fn = task.fn[k];
  f.alone = task.blocks == 1 && task.kind != TaskKind::Mix;
  f.revocable = q.count > 1 && !chained;
  f.link = chained;
  f.doomed = false;
  if (chained) ++record(item.slot, core).chained;
  CoreRegisters& r = *regs_[core];
  // Not consumed by an inline run: that borrows the next token's slot, which
  // no queued token can reach, since nothing is queued behind an inline run.
  f.token = next_token_[core] + 1;
  CoreRegisters::Descriptor& d = r.descriptor[CoreRegisters::slot_of(f.token)];
  d.trace_level = tr.level;
  d.trace_run = tr.run;
  d.fn = f.fn;
  d.args = task.args;
  d.label = KernelLabel{task.name[k], task.id, task.func_id[k], task.kind == TaskKind::Mix ? 0 : sub, task.blocks};
  CoreExecutor* const here = q.count == 1 ? inline_executor(aicpu, core, task, f.fn, post) : nullptr;
  f.ran_inline = here != nullptr;
  if (here == nullptr) {
    ++aicpu_[aicpu].on_cores;
    next_token_[core] = f.token;
    const uint64_t flags = f.revocable ? CoreRegisters::kRevocable : chained ? CoreRegisters::kAfterOk : 0;
    d.token.store(f.token | flags, std::memory_order_release);
    r.bell.ring_parked();
  }
  if (tr.level >= 2) {
    // Only the cluster's owning AICPU thread dispatches to its cores.
    rec_->aicpu_lane(device_.owner_of_cluster(core / 3))
        .record(diag::Event{tr.run, begin, now_ns(), f.name, f.task_id, 0, diag::EventKind::kDispatch});
  }
  if (here != nullptr) {
    // Completed by this thread's next poll round, like a FIN it read.
    const uint64_t start = CycleClock::now();
    f.inline_failed =
        !here->execute(d.fn, d.args, d.label, r.failure[CoreRegisters::slot_of(f.token)], tr.level, tr.run);
    costs_.note_ticks(f.fn, start, CycleClock::now());
    inlining_.fetch_sub(1, std::memory_order_relaxed);
  }
}

uint32_t CoreDispatcher::take_back(uint32_t aicpu, uint32_t core) {
  CoreQueue& q = cores_[core];
  ReadyQueue& to = single_queue(core);
  uint32_t n = 0;
  while (q.count != 0 && q.back().revocable) {
    const Inflight& f = q.back();
    uint64_t posted = f.token | CoreRegisters::kRevocable;
    std::atomic<uint64_t>& word = regs_[core]->descriptor[CoreRegisters::slot_of(f.token)].token;
    // The core claims in token order: once it has claimed this one, it has
    // every one before, and none is tried again.
    if (!word.compare_exchange_strong(posted, posted | CoreRegisters::kRevoked, std::memory_order_acq_rel,
                                      std::memory_order_relaxed)) {
      q.back().revocable = false;
      break;
    }
    next_token_[core] = f.token - 1;
    --aicpu_[aicpu].on_cores;
    // Counted before the push: once another thread takes the task, it may finish the run.
    ++record(f.slot, core).taken_back;
    to.push(ReadyItem{f.slot, f.task}, f.alone && traces_[f.slot].capture == nullptr);
    q.drop_back();
    ++n;
  }
  return n;
}

uint64_t CoreDispatcher::poll_again_by(uint32_t aicpu) const {
  uint64_t by = 0;
  for (uint32_t c : aicpu_[aicpu].clusters) {
    for (uint32_t core = 3 * c; core < 3 * c + 3; ++core) {
      const CoreQueue& q = cores_[core];
      if (q.count == 0 || !q.back().revocable) continue;
      if (by == 0 || q.stalled_at() < by) by = q.stalled_at();
    }
  }
  return by;
}

CoreExecutor* CoreDispatcher::inline_executor(uint32_t aicpu, uint32_t core, const GraphTask& task,
                                              simpler_kernel_fn fn, Post post) {
  if (!inline_allowed_ || task.blocks != 1 || task.kind == TaskKind::Mix || !costs_.short_kernel(fn)) return nullptr;
  // With few CPUs the on_cores rule does not apply: a chain left on a core
  // would keep every other kernel of this thread off the inline path.
  if (post == Post::kHead || !few_cpus()) {
    if (aicpu_[aicpu].on_cores != 0 || !load_sense().oversubscribed(now_ns())) return nullptr;
  }
  CoreExecutor* const executor = device_.core_executor(core);
  if (executor == nullptr) return nullptr;
  const uint32_t others = device_.geometry().aicpu_threads - 1;
  uint32_t n = inlining_.load(std::memory_order_relaxed);
  do {
    if (n >= others) return nullptr;
  } while (!inlining_.compare_exchange_weak(n, n + 1, std::memory_order_relaxed));
  return executor;
}

bool CoreDispatcher::run_on_orchestrator(ReadyItem item, GraphTask& task, KernelFailure& failure) {
  const diag::RunTrace& tr = traces_[item.slot];
  if (!inline_allowed_ || task.blocks != 1 || task.kind == TaskKind::Mix || tr.level != 0 || tr.capture != nullptr) {
    return false;
  }
  const simpler_kernel_fn fn = task.fn[0];
  if (!costs_.usually_at_most(fn, kOrchestratorInlineMaxNs)) return false;
  if (usable_cpus() > device_.geometry().aicpu_threads && !load_sense().oversubscribed(now_ns())) return false;
  // Any core of the task's kind: untraced, an executor writes no lane of it.
  CoreExecutor* const executor = device_.core_executor(task.kind == TaskKind::AIC ? 0 : 1);
  if (executor == nullptr) return false;
  // A kernel may write its argument words; the task's stay as placed, as on a core.
  int64_t args[kMaxTaskArgs];
  std::copy_n(task.args, task.nargs, args);
  const KernelLabel label{task.name[0], task.id, task.func_id[0], 0, 1};
  const uint64_t start = CycleClock::now();
  executor->execute(fn, args, label, failure, 0, 0);
  costs_.note_ticks(fn, start, CycleClock::now());
  ++orchestrator_executed_[item.slot];
  return true;
}

namespace {
// Slot in the high byte, fingerprint in the high half (never 0: 0 is an empty slot).
uint64_t kernel_hash(simpler_kernel_fn fn) { return uint64_t{reinterpret_cast<uintptr_t>(fn)} * 0x9e3779b97f4a7c15ull; }
uint64_t fingerprint(uint64_t hash) { return (hash | (uint64_t{1} << 32)) & ~uint64_t{0xffffffff}; }
}  // namespace

bool CoreDispatcher::KernelCosts::at_most(const std::atomic<uint64_t> (&table)[kSlots], simpler_kernel_fn fn,
                                          uint64_t max_ns) {
  const uint64_t h = kernel_hash(fn);
  const uint64_t w = table[(h >> 56) % kSlots].load(std::memory_order_relaxed);
  return (w & ~uint64_t{0xffffffff}) == fingerprint(h) && (w & 0xffffffff) <= max_ns;
}

void CoreDispatcher::KernelCosts::note(simpler_kernel_fn fn, uint64_t ns) {
  const uint64_t h = kernel_hash(fn);
  const uint64_t fp = fingerprint(h);
  const size_t i = (h >> 56) % kSlots;
  const uint64_t w = slots_[i].load(std::memory_order_relaxed);
  const uint64_t longest = (w & ~uint64_t{0xffffffff}) == fp ? (w & 0xffffffff) / 2 : 0;
  slots_[i].store(fp | std::min<uint64_t>(std::max(ns, longest), 0xffffffff), std::memory_order_relaxed);
  const uint64_t v = shortest_[i].load(std::memory_order_relaxed);
  const uint64_t shortest = (v & ~uint64_t{0xffffffff}) == fp ? (v & 0xffffffff) * 5 / 4 : UINT64_MAX;
  shortest_[i].store(fp | std::min<uint64_t>(std::min(ns, shortest), 0xffffffff), std::memory_order_relaxed);
}

}  // namespace simpler
