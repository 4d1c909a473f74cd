// CoreDispatcher: the AICPU side every graph-scheduling runtime shares: the
// ready queues (AIC, AIV, mix), what each core holds posted (the task it runs
// and up to CoreRegisters::kDepth - 1 queued behind it: short lone ones,
// taken back if the one ahead blocks, and chain links, the successor that
// waits on the one ahead alone), the handshake with the cores and one round
// of polling per AICPU thread. The runtime says which task a ReadyItem names,
// what a finished subtask does and which successor may follow a task.
// poll() for an AICPU thread runs only on it; push and publish on any thread;
// the queues' storage is swapped only at a regrant, while every queue is empty.
// While the process is oversubscribed (other processes' threads hold the
// CPUs), or, for a runtime that asks, while the machine has no more CPUs than
// the device has AICPU threads, an AICPU thread runs a short kernel itself,
// for the core it placed it on, instead of handing it over (see
// inline_executor(); SIMPLER_INLINE_DISPATCH=0 turns it off), and a
// streaming runtime's orchestrator may run a ready kernel of a microsecond
// or less itself (run_on_orchestrator(), the orchestrator thread only).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/clock.h"
#include "base/cycle_clock.h"
#include "base/load_sense.h"
#include "base/sanitized.h"
#include "device/device.h"
#include "diag/arg_capture.h"
#include "diag/lane.h"
#include "runtime/common/ready_queue.h"
#include "runtime/common/task_graph.h"
#include "simpler/status.h"

namespace simpler {

// How many times slower a sanitized build runs a kernel call, for bounds on
// measured kernel times.
inline constexpr uint64_t kSanitizerSlowdown = kSanitizedBuild ? 16 : 1;

class CoreDispatcher {
 public:
  static constexpr uint32_t kNoTask = UINT32_MAX;
  // A subtask posted to a core: only the core's owning AICPU thread touches it.
  struct Inflight {
    uint32_t slot = 0;
    uint32_t task = 0;
    uint32_t token = 0;
    uint32_t sub = 0;            // which of the task's kernels (mix) or blocks (SPMD)
    uint32_t task_id = 0;        // the task's id in its run (task is a window slot on some runtimes)
    uint32_t aicpu = 0;          // the AICPU thread that owns the core: it dispatches and completes
    const char* name = nullptr;  // the subtask's kernel
    simpler_kernel_fn fn = nullptr;
    bool alone = false;       // a single-block, single-core task: it waits for no other subtask
    bool revocable = false;   // posted behind another: taken back if the core has not claimed it
    bool ran_inline = false;  // the owning AICPU thread ran it (done when dispatch() returned)
    bool inline_failed = false;
    bool link = false;  // a chain link: posted kAfterOk, the core skips it behind a failure
    // A link behind a failed kernel: the core ends it unrun, and the failure's
    // release ended its task, so its run may be over and its set reused; only
    // its FIN is read, never its task.
    bool doomed = false;
  };
  // A kernel whose recent runs took longer than this is not run inline: it
  // would hold its AICPU thread's placements for longer than a hand-off costs.
  static constexpr uint64_t kInlineMaxNs = 20'000;
  // The orchestrator runs a kernel itself only if it costs about what
  // handing it over does: it is the one thread that places every task, and a
  // longer kernel run there delays them all while another CPU could run it.
  // A sanitized build's instrumented kernel call alone can take about that
  // (under ASan no single-task run of an empty kernel got below it in 40
  // tries), so there the bound is scaled, and a sanitized build still takes
  // the path its tests check.
  static constexpr uint64_t kOrchestratorInlineMaxNs = 1'000 * kSanitizerSlowdown;
  // What a core did for one set's run: written only by the core's owning
  // AICPU thread while the run is live (never once a failure ended it: a
  // doomed link's FIN writes nothing), reset by its launch, read by the
  // thread that finishes it, after every task's completion was published to it.
  struct CoreRecord {
    uint32_t last_done = kNoTask;  // the id of the last task of the run it finished
    uint32_t executed = 0;         // subtasks it ended that ran a kernel (failed or not)
    uint32_t chained = 0;          // subtasks posted to it as chain links
    uint32_t taken_back = 0;       // subtasks queued on it, then taken back (and placed again)
  };
  // Storage for the three queues, each set's trace and each set's record of
  // each core, built ahead of a regrant of `grant` sets (at most
  // ReadyQueue::kMaxSlots, refused naming pipeline_depth).
  struct Storage {
    std::unique_ptr<ReadyQueue::Ring> rings[3];  // null: that queue keeps its ring
    std::vector<diag::RunTrace> traces;
    std::vector<CoreRecord> records;
    std::vector<uint32_t> orchestrator_executed;
  };
  Result<Storage> make_storage(size_t capacity_per_queue, uint32_t grant) const;
  // When an AICPU thread may run a short lone kernel inline (inline_executor()).
  enum class InlinePolicy : uint8_t {
    // While the process is oversubscribed, or has one usable CPU: then no
    // core and no orchestrator runs beside an AICPU thread, and a hand-off
    // is a switch of the CPU each way.
    kUnderLoad,
    // Also while usable_cpus() is at most the device's AICPU threads: the
    // cores cannot run beside the AICPU threads then, so a hand-off buys no
    // parallelism and costs a wake-up. A runtime whose orchestration shares
    // the CPUs with its AICPU threads keeps kUnderLoad: with two CPUs or
    // more, an inline kernel takes CPU time the orchestrator needs.
    kUnderLoadOrFewCpus,
  };
  explicit CoreDispatcher(Device& device, InlinePolicy policy = InlinePolicy::kUnderLoad);

  void swap_storage(Storage& storage) noexcept;
  // The launching thread, before set `slot`'s run has a task queued: what
  // its tasks record (level 0: nothing).
  void set_trace(uint32_t slot, const diag::RunTrace& trace) { traces_[slot] = trace; }
  // Forgets what the cores did for set `slot`'s last run: its launch, before
  // any of its tasks is queued.
  void begin_run(uint32_t slot);
  // Per core, the id of the last task of set `slot`'s run it finished
  // (kNoTask: none); the number of cores written. Read by the thread that
  // finishes the run, after every task's completion was published to it.
  uint32_t last_done(uint32_t slot, uint32_t* out, uint32_t capacity) const;
  // Set `slot`'s run so far: subtasks that ran a kernel, subtasks posted as
  // chain links, and subtasks taken back from a blocked core. Read as
  // last_done() is. Kept per core, by the owning thread, so that counting
  // costs no shared line per task.
  struct Counts {
    uint32_t executed = 0;
    uint32_t chained = 0;
    uint32_t taken_back = 0;
  };
  Counts counts(uint32_t slot) const;
  void push(const GraphTask& task, ReadyItem item) { queue(task.kind).push(item, queueable(task, item)); }
  // A streaming runtime's orchestrator thread, holding `task` ready and not
  // yet queued: runs its kernel right there instead of queueing it, when the
  // kernel usually takes at most kOrchestratorInlineMaxNs (KernelCosts'
  // shortest recent run) and the process has no more CPUs than AICPU
  // threads or is oversubscribed. There a hand-off buys no parallelism: the
  // thread that takes the task shares a CPU with the orchestrator, and
  // handing it over costs the orchestrator more (the ready queue's line, a
  // bell, a switch) than such a kernel does.
  // Never for a traced or dumping run (every event keeps its lane, every
  // input its capture), a mix task or an SPMD one. True when it ran:
  // `failure` holds the outcome, and set item.slot's run counts it executed.
  // The orchestrator thread only (one per device), while that run is live.
  bool run_on_orchestrator(ReadyItem item, GraphTask& task, KernelFailure& failure);
  // Items of tasks of one kind; task_of(item) is the GraphTask.
  template <typename TaskOf>
  void push_many(TaskKind kind, const ReadyItem* items, size_t n, TaskOf&& task_of) {
    queue(kind).push_many(items, n, [&](ReadyItem it) { return queueable(task_of(it), it); });
  }
  // Queues every item of `ready` by its task's kind and empties it.
  template <typename TaskOf>
  void publish(std::vector<ReadyItem>& ready, TaskOf&& task_of);

  // For a runtime that chains nothing: every task starts from a ready queue.
  struct NoChains {
    bool operator()(ReadyItem, TaskKind, ReadyItem&) const { return false; }
  };
  // For a runtime that names no chain heads.
  struct NoChainHeads {
    bool operator()(ReadyItem) const { return false; }
  };
  // One round for AICPU thread `aicpu`: completes the subtasks its cores
  // finished (complete(inflight, failure, ready), where failure is the
  // kernel's message or null, pushes successors into `ready` and publishes
  // them), then starts ready tasks on its idle cores and queues more behind
  // short ones. task_of(item) is the GraphTask to start.
  // chain_after(item, kind, next) names in `next` a successor of `item` (a
  // lone task posted to a core and not seen ended) that waits on it alone
  // and runs on a `kind` core, and marks it chained, so the release that
  // makes it ready does not queue it: it is posted right behind `item` and
  // the core starts it as soon as `item` succeeds. A runtime answers only
  // for what no later release can invalidate: a task whose end may still
  // poison its successors after its kernel succeeded (a guard check) has
  // none to chain. When the one ahead failed, the core ends the link unrun,
  // and complete() is not called for it: the failure's release already
  // ended it, poisoned. heads_chain(item) says whether a ready task heads a
  // chain of links (its lone successor waits on it alone, and so on): under
  // kUnderLoadOrFewCpus such a task still goes to its core while the process
  // is not oversubscribed, where its links follow it without a hand-off or a
  // wake-up each and its AICPU thread completes them meanwhile. True on any
  // progress.
  template <typename TaskOf, typename Complete, typename ChainAfter = NoChains, typename HeadsChain = NoChainHeads>
  bool poll(uint32_t aicpu, TaskOf&& task_of, Complete&& complete, ChainAfter&& chain_after = ChainAfter{},
            HeadsChain&& heads_chain = HeadsChain{});
  // When AICPU thread `aicpu` must poll again to take back what one of its
  // cores holds queued behind a kernel that may block (0: never): a parked
  // thread is rung only by a FIN or new work, and a blocked kernel sends neither.
  uint64_t poll_again_by(uint32_t aicpu) const;

 private:
  // How long a core may have ended nothing and still take a subtask behind
  // what it holds; past it, what it took and has not started is taken back.
  static constexpr uint64_t kQueueBehindNs = 50'000;
  // What one core holds posted, oldest first.
  struct CoreQueue {
    Inflight entry[CoreRegisters::kDepth];
    uint32_t head = 0;
    uint32_t count = 0;
    uint64_t moved_ns = 0;  // when its owner last saw it start from idle or end a token
    // Whether at `now` it has ended nothing for longer than kQueueBehindNs (a
    // `now` before moved_ns counts as stalled), and the first time it is.
    bool stalled(uint64_t now) const { return now - moved_ns > kQueueBehindNs; }
    uint64_t stalled_at() const { return moved_ns + kQueueBehindNs + 1; }
    Inflight& front() { return entry[head]; }
    Inflight& at(uint32_t i) { return entry[(head + i) % CoreRegisters::kDepth]; }
    Inflight& back() { return entry[(head + count - 1) % CoreRegisters::kDepth]; }
    const Inflight& back() const { return entry[(head + count - 1) % CoreRegisters::kDepth]; }
    Inflight& push() { return entry[(head + count++) % CoreRegisters::kDepth]; }
    void drop_back() { --count; }
    void pop() {
      head = (head + 1) % CoreRegisters::kDepth;
      --count;
    }
  };
  struct alignas(64) AicpuState {
    std::vector<uint32_t> clusters;
    std::vector<ReadyItem> scratch;  // newly ready tasks, pushed in one batch
    uint32_t on_cores = 0;           // its subtasks running on core threads
  };
  // How long each kernel's recent runs took, by entry point: the longest,
  // halved at each later run, so a kernel that sometimes waits (for a gate,
  // for company) stays long, while one run preempted under load marks a
  // no-op kernel long for a few runs only, not for good. A direct-mapped
  // table whose word holds a fingerprint of the entry point (high half) and
  // the nanoseconds (low half, saturated): a slot taken by another kernel
  // starts over. Any AICPU thread; one word per note, so two kernels of one
  // slot never mix their figures; two notes of one kernel at once may lose
  // one of them. A second table keeps the shortest recent run, grown by a
  // quarter at each later run: what the orchestrator goes by. It runs
  // kernels between placements, so every preemption of its thread lands in
  // some kernel's figure; a chain it handed over for that reason stays
  // handed over to the end of the orchestration, since each of its tasks is
  // placed while the one before is still on a core. A kernel that does turn
  // long still reaches any bound within a few runs (log base 1.25 of bound /
  // shortest: 10 from a tenth of it).
  class KernelCosts {
   public:
    // Seen, and its recent runs took at most kInlineMaxNs.
    bool short_kernel(simpler_kernel_fn fn) const { return at_most(slots_, fn, kInlineMaxNs); }
    // Seen, and its shortest recent run, grown by a quarter per run since, is at most `max_ns`.
    bool usually_at_most(simpler_kernel_fn fn, uint64_t max_ns) const { return at_most(shortest_, fn, max_ns); }
    void note(simpler_kernel_fn fn, uint64_t ns);
    // Notes a run timed by CycleClock::now() readings `start` and `end` of
    // this thread; one whose end came first (the thread moved to a lagging
    // counter) is not noted.
    void note_ticks(simpler_kernel_fn fn, uint64_t start, uint64_t end) {
      const uint64_t ns = CycleClock::elapsed_ns(start, end);
      if (ns != UINT64_MAX) note(fn, ns);
    }

   private:
    static constexpr size_t kSlots = 256;
    static bool at_most(const std::atomic<uint64_t> (&table)[kSlots], simpler_kernel_fn fn, uint64_t max_ns);
    std::atomic<uint64_t> slots_[kSlots] = {};
    std::atomic<uint64_t> shortest_[kSlots] = {};
  };

  ReadyQueue& queue(TaskKind kind) { return *queues_[static_cast<int>(kind)]; }
  // Whether `task` may wait on a core behind another (the queue-behind pass
  // below): a lone kernel, and not of a dumping run, whose task taken back
  // would capture its inputs twice. Decided by the pusher, which owns the
  // task then: a pop may see an item another thread takes and whose task
  // slot is refilled before it looks again.
  bool queueable(const GraphTask& task, ReadyItem it) const {
    return task.blocks == 1 && task.kind != TaskKind::Mix && traces_[it.slot].capture == nullptr;
  }
  // The queue of the single-core tasks `core` runs.
  ReadyQueue& single_queue(uint32_t core) { return core % 3 == 0 ? aic_queue_ : aiv_queue_; }
  // Whether `q`'s core may take a lone subtask behind what it holds at `now`:
  // only lone kernels (no gang subtask holds a core a peer waits on while
  // behind it), run on the core and seen to be short, on a core seen moving
  // within kQueueBehindNs, so what waits behind them starts soon. A kernel
  // seen short that blocks after all (on a gate, on the host) takes nothing
  // more once it held its core that long, and take_back() returns what it
  // took before to the ready queue.
  bool can_queue_behind(const CoreQueue& q, uint64_t now) const {
    if (q.count == 0 || q.count == CoreRegisters::kDepth || q.stalled(now)) return false;
    for (uint32_t i = 0; i < q.count; ++i) {
      const Inflight& f = q.entry[(q.head + i) % CoreRegisters::kDepth];
      if (!f.alone || f.ran_inline || !costs_.short_kernel(f.fn)) return false;
    }
    return true;
  }
  // How a subtask is posted: free (it may run inline), as a chain link
  // (kAfterOk, never revocable) or as the head of a chain (it may run inline
  // only under load).
  enum class Post : uint8_t { kFree, kLink, kHead };
  void dispatch(uint32_t aicpu, uint32_t core, ReadyItem item, GraphTask& task, uint32_t sub, Post post = Post::kFree);
  // Posts behind `core`'s newest subtask the successor that waits on it
  // alone, and behind that its own, while the core has room: only behind a
  // lone kernel posted to the core (a gang subtask's successor waits for the
  // whole gang; an inline run has ended already) that cannot be taken back
  // (a link behind it would pin it), and never for a dumping run (a link's
  // inputs are captured when it is posted, before the one ahead wrote them).
  template <typename TaskOf, typename ChainAfter>
  void extend_chain(uint32_t aicpu, uint32_t core, TaskOf& task_of, ChainAfter& chain_after);
  // Takes back, newest first, the queued subtasks `core` has not claimed and
  // pushes them to its ready queue for any core; the number taken back.
  uint32_t take_back(uint32_t aicpu, uint32_t core);
  // Where AICPU thread `aicpu` runs kernel `fn` of `task` inline for `core`,
  // or null to hand it to the core. Only for a kernel that waits for no other
  // (no mix task, no SPMD block) and was seen to be short; then either while
  // the process is oversubscribed (load_sense()), where each hand-off waits
  // for a wake-up behind other processes' time slices (0.3-1.4 ms measured,
  // against a kernel's microseconds), if it holds no completion of another
  // core of this thread behind it (none is running on a core thread); or with
  // few CPUs (few_cpus()), if it is no chain's head (`post`; with one CPU no
  // task is). Never on the last AICPU thread not already running one, so that
  // a kernel that blocks after all (on a gate, on another task) leaves one
  // thread placing work. Such a kernel still takes its thread's clusters out
  // of use while it blocks, which a kernel on a core does not; no kernel may
  // count on running beside another it has no dependency on (the reference
  // runtime runs one at a time), so that costs time, never progress. Off when
  // SIMPLER_INLINE_DISPATCH=0 was set when the dispatcher was made. A non-null
  // answer counts the caller in `inlining_` until its kernel returns.
  CoreExecutor* inline_executor(uint32_t aicpu, uint32_t core, const GraphTask& task, simpler_kernel_fn fn, Post post);
  // One usable CPU, or kUnderLoadOrFewCpus and no more than AICPU threads.
  bool few_cpus() const {
    return usable_cpus() == 1 || (few_cpus_policy_ && usable_cpus() <= device_.geometry().aicpu_threads);
  }
  // Starts the next block of an AIC or AIV task on `core`; a task with
  // blocks left goes back to `from` for the other cores (true then).
  bool dispatch_single(uint32_t aicpu, uint32_t core, ReadyItem item, GraphTask& task, ReadyQueue& from, Post post) {
    uint32_t block = 0;
    bool handed_back = false;
    if (task.blocks > 1) block = task.next_block.fetch_add(1, std::memory_order_relaxed);
    // Block 0's taker captures the inputs before any block can start: only
    // then are the task's other blocks handed to the other cores.
    if (block == 0) capture_before(aicpu, item, task);
    if (task.blocks > 1) {
      handed_back = block + 1 < task.blocks;
      if (handed_back) from.push(item, false);
    }
    dispatch(aicpu, core, item, task, block, post);
    return handed_back;
  }
  // An argument-dumping run's capture of `task`'s inputs, on AICPU thread `aicpu`.
  void capture_before(uint32_t aicpu, ReadyItem item, const GraphTask& task) {
    if (ArgCapture* c = traces_[item.slot].capture; c != nullptr) c->before(aicpu, task.id);
  }

  Device& device_;
  diag::Recorder* const rec_;         // null: the backend records nothing (no run is traced then)
  std::vector<CoreRegisters*> regs_;  // per core, fixed for the device's life
  ReadyQueue aic_queue_;
  ReadyQueue aiv_queue_;
  ReadyQueue mix_queue_;
  ReadyQueue* queues_[3] = {&aic_queue_, &aiv_queue_, &mix_queue_};
  std::vector<CoreQueue> cores_;
  std::vector<CoreRecord> records_;  // [slot * cores + core]
  // Per set: kernels its run's orchestrator ran itself; written only by the
  // orchestrator thread while the run is live, reset and read as records_.
  std::vector<uint32_t> orchestrator_executed_;
  CoreRecord& record(uint32_t slot, uint32_t core) { return records_[size_t{slot} * regs_.size() + core]; }
  std::vector<uint32_t> next_token_;
  std::vector<diag::RunTrace> traces_;  // per set
  std::unique_ptr<AicpuState[]> aicpu_;
  const bool inline_allowed_;
  const bool few_cpus_policy_;         // InlinePolicy::kUnderLoadOrFewCpus
  std::atomic<uint32_t> inlining_{0};  // AICPU threads running a kernel inline now
  KernelCosts costs_;
};

template <typename TaskOf>
void CoreDispatcher::publish(std::vector<ReadyItem>& ready, TaskOf&& task_of) {
  if (ready.empty()) return;
  ReadyItem by_kind[3][64];
  size_t n[3] = {0, 0, 0};
  for (const ReadyItem& it : ready) {
    const int k = static_cast<int>(task_of(it).kind);
    by_kind[k][n[k]++] = it;
    if (n[k] == 64) {
      push_many(static_cast<TaskKind>(k), by_kind[k], n[k], task_of);
      n[k] = 0;
    }
  }
  for (int k = 0; k < 3; ++k) {
    if (n[k] != 0) push_many(static_cast<TaskKind>(k), by_kind[k], n[k], task_of);
  }
  ready.clear();
}

template <typename TaskOf, typename ChainAfter>
void CoreDispatcher::extend_chain(uint32_t aicpu, uint32_t core, TaskOf& task_of, ChainAfter& chain_after) {
  CoreQueue& q = cores_[core];
  const TaskKind kind = core % 3 == 0 ? TaskKind::AIC : TaskKind::AIV;
  while (q.count != 0 && q.count < CoreRegisters::kDepth) {
    const Inflight& ahead = q.back();
    if (!ahead.alone || ahead.ran_inline || ahead.revocable || ahead.doomed || traces_[ahead.slot].capture != nullptr) {
      return;
    }
    ReadyItem next;
    if (!chain_after(ReadyItem{ahead.slot, ahead.task}, kind, next)) return;
    dispatch(aicpu, core, next, task_of(next), 0, Post::kLink);
  }
}

template <typename TaskOf, typename Complete, typename ChainAfter, typename HeadsChain>
bool CoreDispatcher::poll(uint32_t aicpu, TaskOf&& task_of, Complete&& complete, ChainAfter&& chain_after,
                          HeadsChain&& heads_chain) {
  AicpuState& st = aicpu_[aicpu];
  std::vector<ReadyItem>& ready = st.scratch;
  bool progress = false;
  const bool sched = rec_ != nullptr && rec_->live_level() >= 3;
  const uint64_t poll_begin = sched ? now_ns() : 0;
  // Whether this round put work back on a queue, for the other threads.
  bool handed_back = false;
  // The time of this round, read once and only when needed.
  uint64_t round_ns = 0;
  const auto round_now = [&] {
    if (round_ns == 0) round_ns = now_ns();
    return round_ns;
  };
  for (uint32_t c : st.clusters) {
    for (uint32_t core = 3 * c; core < 3 * c + 3; ++core) {
      CoreQueue& q = cores_[core];
      if (q.count == 0) continue;
      const CoreRegisters& r = *regs_[core];
      bool read_status = false;
      bool ended_any = false;
      uint32_t ended = 0;
      while (q.count != 0) {
        const Inflight f = q.front();
        const char* failure = nullptr;
        const uint32_t slot = CoreRegisters::slot_of(f.token);
        if (f.ran_inline) {
          if (f.inline_failed) failure = r.failure[slot].message;
        } else {
          if (!read_status) {
            ended = CoreRegisters::ended_token(r.status.load(std::memory_order_acquire));
            read_status = true;
          }
          if (static_cast<int32_t>(ended - f.token) < 0) break;
          const CoreRegisters::Ended how = r.ended[slot];
          --st.on_cores;
          if (how.skipped != 0) {
            // A link whose predecessor failed: that failure's release ended it.
            q.pop();
            q.moved_ns = round_now();
            progress = ended_any = true;
            continue;
          }
          if (how.failed != 0) failure = r.failure[slot].message;
          costs_.note(f.fn, how.kernel_ns);
        }
        q.pop();
        q.moved_ns = round_now();
        // Before complete(): its release may end the run the links behind it belong to.
        for (uint32_t i = 0; failure != nullptr && i < q.count && q.at(i).link; ++i) q.at(i).doomed = true;
        const diag::RunTrace& tr = traces_[f.slot];
        if (tr.level >= 2) {
          // Recorded before complete(): finishing a run's last task exports its
          // trace from inside it. The release that follows is level 3's `resolve`.
          const uint64_t seen = now_ns();
          rec_->aicpu_lane(aicpu).record(
              diag::Event{tr.run, seen, seen, f.name, f.task_id, 0, diag::EventKind::kFinish});
        }
        // Before complete(), whose release of the task publishes this to the run's finisher.
        CoreRecord& rec = record(f.slot, core);
        rec.last_done = f.task_id;
        ++rec.executed;
        complete(f, failure, ready);
        progress = ended_any = true;
      }
      // What now waits on the newest subtask alone may follow it.
      if (ended_any && q.count != 0) extend_chain(aicpu, core, task_of, chain_after);
      // The kernel ahead has held the core past the bound: what waits behind it goes elsewhere.
      if (q.count != 0 && q.back().revocable && q.stalled(round_now())) {
        handed_back |= take_back(aicpu, core) != 0;
      }
    }
  }
  // Completions published their successors already, and an SPMD task hands
  // its remaining blocks back: what this thread cannot place below is left
  // for the others, woken at the end.
  const bool published = progress;
  const uint64_t place_begin = sched ? now_ns() : 0;
  if (sched && published) {
    rec_->aicpu_lane(aicpu).record(diag::Event{0, poll_begin, place_begin, "resolve", 0, 0, diag::EventKind::kSched});
  }
  // While mix tasks wait, one busy cluster per AICPU thread takes no single
  // tasks, so it drains and a mix task cannot starve behind a stream of singles.
  bool reserve_for_mix = !mix_queue_.empty_hint();
  uint32_t reserved = UINT32_MAX;
  // With one CPU a chain on its core runs only while this thread is off
  // the CPU: inline, its head too, it takes no switch at all.
  const bool heads_to_cores = this->few_cpus() && usable_cpus() > 1;
  const auto place_single = [&](uint32_t core) {
    ReadyQueue& from = single_queue(core);
    ReadyItem item;
    if (from.empty_hint() || !from.pop(item)) return;
    cores_[core].moved_ns = round_now();
    const Post post = heads_to_cores && heads_chain(item) ? Post::kHead : Post::kFree;
    handed_back |= dispatch_single(aicpu, core, item, task_of(item), from, post);
    extend_chain(aicpu, core, task_of, chain_after);
    progress = true;
  };
  for (uint32_t c : st.clusters) {
    const uint32_t aic = 3 * c;
    const bool cluster_idle = cores_[aic].count == 0 && cores_[aic + 1].count == 0 && cores_[aic + 2].count == 0;
    ReadyItem item;
    if (cluster_idle && !mix_queue_.empty_hint() && mix_queue_.pop(item)) {
      GraphTask& task = task_of(item);
      capture_before(aicpu, item, task);
      for (uint32_t sub = 0; sub < 3; ++sub) dispatch(aicpu, aic + sub, item, task, sub);
      progress = true;
      continue;
    }
    if (reserve_for_mix && !cluster_idle) {
      reserve_for_mix = false;
      reserved = c;
      continue;
    }
    for (uint32_t core = aic; core < aic + 3; ++core) {
      if (cores_[core].count == 0) place_single(core);
    }
  }
  // What the idle cores left, one level deeper at a time: a core holding
  // only short lone kernels takes another lone one, which it starts as soon
  // as the one before ends instead of after this thread saw that and posted
  // it. Only lone tasks are queued: a gang subtask (mix, SPMD block) waits
  // for its peers, so it starts only on an idle core.
  const uint64_t now = aic_queue_.empty_hint() && aiv_queue_.empty_hint() ? 0 : round_now();
  for (uint32_t depth = 1; depth < CoreRegisters::kDepth; ++depth) {
    if (aic_queue_.empty_hint() && aiv_queue_.empty_hint()) break;
    for (uint32_t c : st.clusters) {
      if (c == reserved) continue;
      for (uint32_t core = 3 * c; core < 3 * c + 3; ++core) {
        if (cores_[core].count != depth || !can_queue_behind(cores_[core], now)) continue;
        ReadyQueue& from = single_queue(core);
        ReadyItem item;
        if (!from.pop_queueable(item)) continue;
        GraphTask& task = task_of(item);
        capture_before(aicpu, item, task);
        dispatch(aicpu, core, item, task, 0);
        progress = true;
      }
    }
  }
  if ((published || handed_back) &&
      (!aic_queue_.empty_hint() || !aiv_queue_.empty_hint() || !mix_queue_.empty_hint())) {
    for (uint32_t a = 0; a < device_.geometry().aicpu_threads; ++a) {
      if (a != aicpu) device_.ring_aicpu(a);
    }
  }
  if (sched && progress != published) {
    rec_->aicpu_lane(aicpu).record(diag::Event{0, place_begin, now_ns(), "place", 0, 0, diag::EventKind::kSched});
  }
  return progress;
}

}  // namespace simpler
