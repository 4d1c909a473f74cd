#include "runtime/resident/resident_runtime.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "base/clock.h"
#include "base/errors.h"

namespace simpler::resident {

namespace {
#ifdef SIMPLER_TEST_HOOKS
std::atomic<const Hooks*> g_hooks{nullptr};

void hand_off(HandOff point, uint32_t core, uint32_t task_id, uint32_t sub, uint32_t from_cluster) {
  if (const Hooks* h = g_hooks.load(std::memory_order_acquire); h != nullptr && h->hand_off) {
    h->hand_off(point, core, task_id, sub, from_cluster);
  }
}
void gang_wait(uint32_t core, uint32_t task_id) {
  if (const Hooks* h = g_hooks.load(std::memory_order_acquire); h != nullptr && h->gang_wait)
    h->gang_wait(core, task_id);
}
const Hooks* hooks() { return g_hooks.load(std::memory_order_acquire); }
#else
void hand_off(HandOff, uint32_t, uint32_t, uint32_t, uint32_t) {}
void gang_wait(uint32_t, uint32_t) {}
#endif

// A cluster's gang word: (seq << 2) | state. seq counts the gangs it formed.
enum GangState : uint64_t { kFree = 0, kClaiming = 1, kGathering = 2 };
constexpr uint64_t gang_state(uint64_t g) { return g & 3; }
constexpr uint64_t gang_seq(uint64_t g) { return g >> 2; }
constexpr uint64_t gang_word(uint64_t seq, GangState state) { return (seq << 2) | state; }
constexpr uint32_t kWholeCluster = 0b111;

// A run's lifecycle, as the supervisor sees it.
enum Phase : uint32_t { kIdle = 0, kLaunched, kLive, kDrained };

TaskKind kind_of_core(uint32_t core) { return core % 3 == 0 ? TaskKind::AIC : TaskKind::AIV; }
}  // namespace

#ifdef SIMPLER_TEST_HOOKS
void set_hooks(const Hooks* hooks) { g_hooks.store(hooks, std::memory_order_release); }
#endif

struct ResidentRuntime::Slot : HostGraph {
  Slot(const GraphCapacity& c, DeviceMemory& memory, uint32_t cores)
      : HostGraph(c, memory), next(c.tasks, ReadyItem{kNone, 0}), last_done(cores, kNone) {}

  std::vector<ReadyItem> next;      // the ready-list link of each task
  std::vector<uint32_t> last_done;  // per core, the id of the last task of this run it finished
  // A dumping run's Mechanism R: its GM control block (0: dumps off, R118)
  // and its protocol state. `capture_live` is what the AICPU threads serve,
  // `serving` counts those inside a service step of it.
  uint64_t capture_block = 0;
  std::unique_ptr<CaptureRun> capture;
  std::atomic<CaptureRun*> capture_live{nullptr};
  std::atomic<uint32_t> serving{0};
  // kIdle -> kLaunched (launch) -> kLive (the supervisor handed out the
  // roots) -> kDrained (a core ended the last task) -> kIdle (retired).
  std::atomic<uint32_t> phase{kIdle};
};

struct ResidentRuntime::GrantState final : GrantOwner::Pending {
  std::vector<std::unique_ptr<Slot>> slots;
};

// A task a core claimed: which subtask (a mix task's kernel, or an SPMD
// block) it runs, and where it was taken from.
struct ResidentRuntime::Claim {
  ReadyItem item{kNone, 0};
  uint32_t sub = 0;
  uint32_t from_cluster = 0;
  bool gang = false;
};

void ResidentRuntime::ReadyList::push(ReadyItem item, const std::vector<std::unique_ptr<Slot>>& slots) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    slots[item.slot]->next[item.task] = ReadyItem{kNone, 0};
    if (tail_.slot == kNone) {
      head_ = item;
    } else {
      slots[tail_.slot]->next[tail_.task] = item;
    }
    tail_ = item;
  }
  size_.fetch_add(1, std::memory_order_seq_cst);
}

bool ResidentRuntime::ReadyList::pop(ReadyItem& out, const std::vector<std::unique_ptr<Slot>>& slots) {
  if (empty_hint()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (head_.slot == kNone) return false;
  out = head_;
  head_ = slots[out.slot]->next[out.task];
  if (head_.slot == kNone) tail_ = head_;
  size_.fetch_sub(1, std::memory_order_relaxed);
  return true;
}

Result<std::unique_ptr<ChipRuntime>> ResidentRuntime::create(Device& device, const RuntimeOptions& options,
                                                             RunDoneFn on_done) {
  SIMPLER_RETURN_IF_ERROR(
      check_runtime_options(options, device, "resident", "builds its graph in device memory from the host"));
  return std::unique_ptr<ChipRuntime>(
      new ResidentRuntime(device, GraphCapacity::for_tasks(options.max_tasks_per_run), std::move(on_done)));
}

ResidentRuntime::ResidentRuntime(Device& device, GraphCapacity capacity, RunDoneFn on_done)
    : device_(device),
      memory_(device.memory()),
      capacity_(capacity),
      on_done_(std::move(on_done)),
      clusters_(device.geometry().clusters),
      cluster_(new Cluster[device.geometry().clusters]),
      core_(new CoreState[device.core_count()]),
      pending_(new Supervisor[device.geometry().aicpu_threads]) {}

ResidentRuntime::~ResidentRuntime() = default;

Result<std::unique_ptr<GrantOwner::Pending>> ResidentRuntime::build_grant(uint32_t grant) const {
  auto g = std::make_unique<GrantState>();
  g->slots.reserve(grant);
  for (uint32_t i = 0; i < grant; ++i) {
    g->slots.push_back(std::make_unique<Slot>(capacity_, memory_, device_.core_count()));
    g->slots.back()->index = i;
  }
  return std::unique_ptr<Pending>(std::move(g));
}

void ResidentRuntime::commit_grant(Pending& pending) noexcept {
  // Every list is empty: no run is live across a regrant.
  slots_.swap(static_cast<GrantState&>(pending).slots);
}

Status ResidentRuntime::build(const HostApi& api, const ChipCallable& callable, const TaskArgs& run_args,
                              const RuntimeEnv&, const diag::RunTrace& trace) {
  if (api.slot >= slots_.size()) {
    return invalid_argument("pipeline_slot = {} is outside the grant of {}", api.slot, slots_.size());
  }
  Slot& s = *slots_[api.slot];
  release_capture(s);
  SIMPLER_RETURN_IF_ERROR(build_host_graph(s, capacity_, memory_, api, callable, run_args, trace));
  if (trace.capture == nullptr) return Status();  // R118: dumps off reserve nothing
  if (clusters_ > kCaptureClusterCapacity || device_.core_count() > kCaptureWorkerCapacity) {
    return make_error(StatusCode::kUnimplemented,
                      "call.dump_args: the resident route's capture block covers {} clusters and {} cores; this "
                      "device has {} and {}",
                      kCaptureClusterCapacity, kCaptureWorkerCapacity, clusters_, device_.core_count());
  }
  for (uint32_t t = 0; t < s.task_count; ++t) {
    if (s.tasks[t].blocks > 1) {
      // An SPMD task's blocks run on any cluster; Mechanism R's gate is one cluster's.
      return make_error(StatusCode::kUnimplemented,
                        "call.dump_args: task {} is an SPMD task of {} blocks; the resident route captures "
                        "arguments of single-block and mix tasks only",
                        s.tasks[t].id, s.tasks[t].blocks);
    }
  }
  SIMPLER_ASSIGN_OR_RETURN(s.capture_block, memory_.allocate(kCaptureControlBytes),
                           "call.dump_args: the resident route's capture block");
  // Run init zeroes the block before any participant exists (R95); after
  // this, slot words are reached only through CaptureRun's atomics (R94).
  std::memset(reinterpret_cast<void*>(s.capture_block), 0, kCaptureControlBytes);
  auto* control = reinterpret_cast<ArgsCaptureControl*>(s.capture_block);
  const CaptureHooks* capture_hooks = nullptr;
  CaptureConfig config;
#ifdef SIMPLER_TEST_HOOKS
  if (const Hooks* h = hooks(); h != nullptr) {
    capture_hooks = &h->capture;
    config = h->capture_config;
    if (h->capture_block) h->capture_block(s.index, kCaptureControlBytes);
  }
#endif
  s.capture =
      std::make_unique<CaptureRun>(control, device_.core_count(), device_.geometry().aicpu_threads, *trace.capture,
                                   trace.run, *this, config, capture_hooks, s.index % device_.geometry().aicpu_threads);
  return Status();
}

void ResidentRuntime::release_capture(Slot& s) {
  s.capture_live.store(nullptr, std::memory_order_seq_cst);
  // A service step is bounded (one scan, one chunk): this wait is short.
  spin_then_park(
      serving_bell_, [&] { return s.serving.load(std::memory_order_seq_cst) == 0; }, SpinPolicy{});
  s.capture.reset();
  if (s.capture_block != 0) {
    (void)memory_.free(s.capture_block);
    s.capture_block = 0;
  }
}

Doorbell& ResidentRuntime::core_bell(uint32_t core) { return device_.core_registers(core).bell; }
void ResidentRuntime::ring_aicpu(uint32_t lane) { device_.ring_aicpu(lane); }

bool ResidentRuntime::serve_captures(uint32_t aicpu) {
  bool progress = false;
  for (const std::unique_ptr<Slot>& sp : slots_) {
    Slot& s = *sp;
    if (s.capture_live.load(std::memory_order_seq_cst) == nullptr) continue;
    s.serving.fetch_add(1, std::memory_order_seq_cst);
    if (CaptureRun* c = s.capture_live.load(std::memory_order_seq_cst); c != nullptr) progress |= c->service(aicpu);
    if (s.serving.fetch_sub(1, std::memory_order_seq_cst) == 1) serving_bell_.ring();
  }
  return progress;
}

bool ResidentRuntime::binding_held(uint32_t slot) const { return slots_[slot]->api.bound(); }

void ResidentRuntime::discard(uint32_t slot) {
  release_capture(*slots_[slot]);
  slots_[slot]->allocations.release_all();
}

uint32_t ResidentRuntime::last_tasks(uint32_t slot, uint32_t* out, uint32_t capacity) const {
  const std::vector<uint32_t>& row = slots_[slot]->last_done;
  const auto n = static_cast<uint32_t>(std::min<size_t>(capacity, row.size()));
  std::copy_n(row.begin(), n, out);
  return n;
}

void ResidentRuntime::launch(uint32_t slot) {
  Slot& s = *slots_[slot];
  s.launch_ns = now_ns();
  std::fill(s.last_done.begin(), s.last_done.end(), kNone);
  if (s.task_count == 0) {
    finish_run(s);
    return;
  }
  s.remaining.store(s.task_count, std::memory_order_relaxed);
  if (s.capture != nullptr) {
    s.capture_live.store(s.capture.get(), std::memory_order_seq_cst);
    capturing_.fetch_add(1, std::memory_order_seq_cst);
  }
  // The run goes to its supervisor, which hands its roots to the clusters.
  s.phase.store(kLaunched, std::memory_order_release);
  notify_supervisor(s);
}

void ResidentRuntime::notify_supervisor(const Slot& s) {
  const uint32_t supervisor = s.index % device_.geometry().aicpu_threads;
  pending_[supervisor].events.fetch_add(1, std::memory_order_acq_rel);
  device_.ring_aicpu(supervisor);
}

bool ResidentRuntime::poll(uint32_t aicpu) {
  std::atomic<uint32_t>& events = pending_[aicpu].events;
  // Mechanism R's service step comes first: bounded, and never blocking (R110, R112).
  bool progress = capturing_.load(std::memory_order_seq_cst) != 0 && serve_captures(aicpu);
  if (events.load(std::memory_order_acquire) == 0) return progress;
  const uint32_t supervisors = device_.geometry().aicpu_threads;
  for (uint32_t i = aicpu; i < slots_.size(); i += supervisors) {
    Slot& s = *slots_[i];
    const uint32_t phase = s.phase.load(std::memory_order_acquire);
    if (phase == kLaunched) {
      // Live before the first root is out: a core may drain the run at once.
      s.phase.store(kLive, std::memory_order_relaxed);
      uint32_t next = 0;
      for_each_root(s, [&](uint32_t t) {
        push_ready(next, ReadyItem{s.index, t}, s.tasks[t].kind);
        next = next + 1 == clusters_ ? 0 : next + 1;
      });
      for (uint32_t k = 0; k < 3; ++k) {
        if (ready_[k].load(std::memory_order_seq_cst) != 0) {
          wake_idle(0, static_cast<TaskKind>(k), ready_[k].load(std::memory_order_relaxed), kNone);
        }
      }
      events.fetch_sub(1, std::memory_order_relaxed);
      progress = true;
    } else if (phase == kDrained) {
      if (CaptureRun* c = s.capture_live.load(std::memory_order_seq_cst); c != nullptr) {
        // R117: nothing is released while a lane still serves this run.
        bool busy = false;
        for (uint32_t l = 0; l < supervisors; ++l) busy = busy || c->lane_busy(l);
        if (busy) continue;
      }
      s.phase.store(kIdle, std::memory_order_relaxed);
      events.fetch_sub(1, std::memory_order_relaxed);
      finish_run(s);
      progress = true;
    }
  }
  return progress;
}

void ResidentRuntime::finish_run(Slot& s) {
  RunOutcome out;
  out.tasks = s.task_count;
  out.executed = s.executed.load(std::memory_order_relaxed);
  out.released_early = s.released_early.load(std::memory_order_relaxed);
  out.launch_ns = s.launch_ns;
  out.status = s.error.get();
  // R117: an aborted or failed capture leaves its lane's terminal unclosed.
  out.capture_unsettled = s.capture != nullptr && (s.capture->aborted() || s.capture->fatal());
  if (s.capture_live.load(std::memory_order_relaxed) != nullptr) capturing_.fetch_sub(1, std::memory_order_seq_cst);
  release_capture(s);
  s.allocations.release_all();
  out.end_ns = now_ns();
  on_done_(s.index, std::move(out));
}

GraphTask& ResidentRuntime::task_of(ReadyItem item) const { return slots_[item.slot]->tasks[item.task]; }

bool ResidentRuntime::core_poll(uint32_t core, CoreExecutor& exec) {
  CoreState& st = core_[core];
  Claim c;
  if (!claim_task(core, c)) {
    // A core waiting for its gang is not idle: a waker's ring would be spent on it.
    if (st.joined_gang != 0) return false;
    // Idle, then one more look: a task pushed before this store is found by
    // it, and its pusher, reading the flag after the push, rings this core
    // for one pushed after (sequentially consistent on both sides).
    st.idle.store(true, std::memory_order_seq_cst);
    if (!claim_task(core, c)) return false;
  }
  st.idle.store(false, std::memory_order_relaxed);
  Status captured = before_execute(core, c);
  bool ok = true;
  if (captured.ok()) {
    Slot& s = *slots_[c.item.slot];
    GraphTask& task = s.tasks[c.item.task];
    const uint32_t k = kernel_of(task.kind, c.sub);
    const KernelLabel label{task.name[k], task.id, task.func_id[k], task.kind == TaskKind::Mix ? 0 : c.sub,
                            task.blocks};
    ok = exec.execute(task.fn[k], task.args, label, st.failure, s.trace.level, s.trace.run);  // M:execute
  }
  after_execute(core, c, ok, std::move(captured));
  return true;
}

bool ResidentRuntime::claim_task(uint32_t core, Claim& claim) {
  if (!claim_gang(core, claim)) {
    const uint64_t g = cluster_[core / 3].gang.load(std::memory_order_seq_cst);
    // A gang forming here waits for this core: it takes nothing else.
    if (gang_state(g) == kGathering && gang_seq(g) != core_[core].last_gang) return false;
    if (core_[core].joined_gang != 0 || !claim_single(core, claim)) return false;
  }
  hand_off(HandOff::kClaimed, core, task_of(claim.item).id, claim.sub, claim.from_cluster);
  return true;
}

bool ResidentRuntime::claim_gang(uint32_t core, Claim& claim) {
  const uint32_t cl = core / 3;
  Cluster& k = cluster_[cl];
  CoreState& st = core_[core];
  const uint32_t bit = 1u << (core % 3);
  uint64_t g = k.gang.load(std::memory_order_seq_cst);
  if (gang_state(g) == kFree && st.joined_gang == 0 && ready_[static_cast<int>(TaskKind::Mix)].load() != 0 &&
      k.gang.compare_exchange_strong(g, gang_word(gang_seq(g), kClaiming), std::memory_order_seq_cst)) {
    // Inside kClaiming only this core writes the gang.
    ReadyItem item;
    uint32_t from = cl;
    if (!pop_kind(cl, TaskKind::Mix, item, from)) {
      k.gang.store(g, std::memory_order_seq_cst);
      return false;
    }
    k.gang_item = item;
    k.gang_from = from;
    k.arrived.store(0, std::memory_order_relaxed);
    k.left.store(0, std::memory_order_relaxed);
    g = gang_word(gang_seq(g) + 1, kGathering);
    k.gang.store(g, std::memory_order_seq_cst);
    for (uint32_t peer = 3 * cl; peer < 3 * cl + 3; ++peer) {
      if (peer != core) device_.core_registers(peer).bell.ring();
    }
  }
  if (gang_state(g) == kGathering && gang_seq(g) != st.last_gang) {
    // Join: every core of the cluster runs its subtask, none before all arrived.
    st.last_gang = gang_seq(g);
    st.joined_gang = gang_seq(g);
    const uint32_t now = k.arrived.fetch_or(bit, std::memory_order_seq_cst) | bit;
    if (now == kWholeCluster) {
      for (uint32_t peer = 3 * cl; peer < 3 * cl + 3; ++peer) {
        if (peer != core) device_.core_registers(peer).bell.ring();
      }
    } else {
      gang_wait(core, task_of(k.gang_item).id);
    }
  }
  if (st.joined_gang == 0 || k.arrived.load(std::memory_order_seq_cst) != kWholeCluster) return false;
  st.joined_gang = 0;
  claim.item = k.gang_item;
  claim.sub = core % 3;
  claim.from_cluster = k.gang_from;
  claim.gang = true;
  return true;
}

bool ResidentRuntime::claim_single(uint32_t core, Claim& claim) {
  const TaskKind kind = kind_of_core(core);
  if (ready_[static_cast<int>(kind)].load(std::memory_order_seq_cst) == 0) return false;
  const uint32_t cl = core / 3;
  ReadyItem item;
  uint32_t from = cl;
  if (!pop_kind(cl, kind, item, from)) return false;
  GraphTask& task = task_of(item);
  uint32_t block = 0;
  if (task.blocks > 1) {
    block = task.next_block.fetch_add(1, std::memory_order_relaxed);
    // The other blocks go back to this cluster for its peers, or a thief.
    if (block + 1 < task.blocks) {
      push_ready(cl, item, kind);
      wake_idle(cl, kind, 1, core);
    }
  }
  claim.item = item;
  claim.sub = block;
  claim.from_cluster = from;
  claim.gang = false;
  return true;
}

bool ResidentRuntime::pop_kind(uint32_t cluster, TaskKind kind, ReadyItem& item, uint32_t& from) {
  const int k = static_cast<int>(kind);
  for (uint32_t i = 0; i < clusters_; ++i) {
    const uint32_t c = cluster + i < clusters_ ? cluster + i : cluster + i - clusters_;
    if (cluster_[c].lists[k].pop(item, slots_)) {
      ready_[k].fetch_sub(1, std::memory_order_seq_cst);
      from = c;
      return true;
    }
  }
  return false;
}

void ResidentRuntime::push_ready(uint32_t cluster, ReadyItem item, TaskKind kind) {
  cluster_[cluster].lists[static_cast<int>(kind)].push(item, slots_);
  ready_[static_cast<int>(kind)].fetch_add(1, std::memory_order_seq_cst);
}

void ResidentRuntime::wake_idle(uint32_t cluster, TaskKind kind, uint32_t n, uint32_t except_core) {
  for (uint32_t i = 0; i < clusters_ && n != 0; ++i) {
    const uint32_t c = cluster + i < clusters_ ? cluster + i : cluster + i - clusters_;
    if (kind == TaskKind::Mix && gang_state(cluster_[c].gang.load(std::memory_order_relaxed)) != kFree) continue;
    uint32_t first = 3 * c;
    uint32_t last = 3 * c + 3;
    if (kind == TaskKind::AIC) last = first + 1;
    if (kind == TaskKind::AIV) first += 1;
    for (uint32_t core = first; core < last && n != 0; ++core) {
      CoreState& st = core_[core];
      if (core == except_core || !st.idle.load(std::memory_order_seq_cst)) continue;
      if (!st.idle.exchange(false, std::memory_order_seq_cst)) continue;
      device_.core_registers(core).bell.ring();
      --n;
      // One core per cluster forms a gang; its peers are rung by it.
      if (kind == TaskKind::Mix) break;
    }
  }
}

Status ResidentRuntime::before_execute(uint32_t core, const Claim& claim) {
  Slot& s = *slots_[claim.item.slot];
  const GraphTask& task = s.tasks[claim.item.task];
  if (CaptureRun* cap = s.capture.get(); cap != nullptr) {
    // R115: once the run's capture failed, no further task of it executes.
    if (cap->fatal()) {
      return make_error(StatusCode::kAborted, "ARGS_CAPTURE: task {} not run: the run's argument capture failed",
                        task.id);
    }
    Participant& p = core_[core].capture;
    p = Participant{};
    p.core = core;
    p.bit = uint64_t{1} << (core % 3);
    p.mask = claim.gang ? kWholeCluster : p.bit;
    p.task_id = task.id;
    SIMPLER_RETURN_IF_ERROR(claim.gang ? cap->enter_gang(p) : cap->enter_single(p, core / 3));
    // R105: no execute before the BEFORE seal.
    SIMPLER_RETURN_IF_ERROR(cap->phase(p, CapturePhase::kBefore, core_[core].capture_ids));
  }
  hand_off(HandOff::kBeforeExecute, core, task.id, claim.sub, claim.from_cluster);
  return Status();
}

void ResidentRuntime::after_execute(uint32_t core, const Claim& claim, bool ok, Status capture) {
  Slot& s = *slots_[claim.item.slot];
  GraphTask& task = s.tasks[claim.item.task];
  if (capture.ok()) hand_off(HandOff::kAfterExecute, core, task.id, claim.sub, claim.from_cluster);
  // R105: no completion before the AFTER seal (or an Aborted ack).
  if (capture.ok() && s.capture != nullptr)
    capture = s.capture->phase(core_[core].capture, CapturePhase::kAfter, core_[core].capture_ids);
  if (!capture.ok()) {
    // The run's shutdown path on the sim: the task ends failed without
    // effect, so its successors are poisoned and never execute.
    s.error.record(task.id, claim.sub, std::move(capture));
    task.poisoned.store(1, std::memory_order_relaxed);
    ok = true;
  }
  // Before the release below, which publishes it to the run's retirement.
  s.last_done[core] = task.id;
  s.executed.fetch_add(1, std::memory_order_relaxed);
  const auto damage = [this](uint64_t addr, uint64_t bytes) { return memory_.check_guards(addr, bytes); };
  // M:complete: after this participant's AFTER release (or its Aborted ack).
  const bool ended = end_subtask(task, claim.item.task, claim.sub, ok ? nullptr : core_[core].failure.message, s.error,
                                 damage, s.guards.data(), *s.callable);
  if (claim.gang) leave_gang(core);
  if (ended) release_successors(core, s, claim.item.task);
}

void ResidentRuntime::leave_gang(uint32_t core) {
  Cluster& k = cluster_[core / 3];
  const uint32_t bit = 1u << (core % 3);
  if ((k.left.fetch_or(bit, std::memory_order_seq_cst) | bit) != kWholeCluster) return;
  // The last to leave frees the cluster for its next gang.
  const uint64_t g = k.gang.load(std::memory_order_relaxed);
  k.gang.store(gang_word(gang_seq(g), kFree), std::memory_order_seq_cst);
}

void ResidentRuntime::release_successors(uint32_t core, Slot& s, uint32_t task) {
  const uint32_t cl = core / 3;
  hand_off(HandOff::kBeforeRelease, core, s.tasks[task].id, 0, cl);
  uint32_t pushed[3] = {0, 0, 0};
  const bool failed = s.tasks[task].poisoned.load(std::memory_order_acquire) != 0;
  const uint32_t finished = release_fanout(s.graph(), task, failed, s.released_early, [&](uint32_t succ) {
    const TaskKind kind = s.tasks[succ].kind;
    push_ready(cl, ReadyItem{s.index, succ}, kind);
    ++pushed[static_cast<int>(kind)];
  });
  // This core takes one of its own kind next; idle peers take the rest.
  const int own = static_cast<int>(kind_of_core(core));
  if (pushed[own] != 0) --pushed[own];
  for (int k = 0; k < 3; ++k) {
    if (pushed[k] != 0) wake_idle(cl, static_cast<TaskKind>(k), pushed[k], core);
  }
  // Successors are queued before `remaining` can reach zero and retire the run.
  if (s.remaining.fetch_sub(finished, std::memory_order_acq_rel) == finished) {
    s.phase.store(kDrained, std::memory_order_release);
    notify_supervisor(s);
  }
}

SIMPLER_REGISTER_RUNTIME(resident,
                         RuntimeInfo{"resident",
                                     "the host builds each run's whole graph; the cores schedule it themselves "
                                     "(per-cluster ready lists, work stealing, gang-scheduled mix tasks); AICPU "
                                     "threads only supervise",
                                     /*concurrent=*/true, /*streaming=*/false, &ResidentRuntime::create,
                                     /*captures_args=*/true});

}  // namespace simpler::resident
