// TmrRuntime: the tensormap_and_ringbuffer chip runtime. launch() hands a
// run to the device's orchestrator AICPU thread, which executes its
// orchestration there, placing each submitted task into the set's task
// window as it comes, while the scheduler AICPU threads already dispatch the
// ready ones (with few CPUs, it runs a ready kernel of a microsecond or less
// itself: CoreDispatcher::run_on_orchestrator). Dependencies come from the TensorMap; intermediates stream
// through four heap rings; windows, rings and the dependency pool are
// reclaimed in order as tasks retire, and a full one makes the orchestrator
// wait (spin, then park). Threads as in runtime/runtime.h; a Set's stream
// state belongs to the orchestrator thread while its run streams.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "base/doorbell.h"
#include "runtime/common/core_dispatcher.h"
#include "runtime/common/host_turnaround.h"
#include "runtime/common/run_allocations.h"
#include "runtime/common/run_builder.h"
#include "runtime/common/task_graph.h"
#include "runtime/runtime.h"
#include "runtime/tmr/tensor_map.h"

namespace simpler::tmr {

inline constexpr uint32_t kHeapRings = 4;
inline constexpr uint64_t kDefaultHeapRingBytes = 16ull << 20;
inline constexpr uint64_t kDefaultStallMs = 10'000;
// Tasks the orchestrator counts into a run's remaining_ at once, ahead of submitting them.
inline constexpr uint32_t kCredits = 64;

// The sizes one run streams with, from its RuntimeEnv and the runtime's capacity.
struct StreamSizes {
  uint32_t window = 0;
  uint32_t dep_pool = 0;
  uint64_t heap_ring_bytes = 0;
  uint64_t stall_ns = 0;
};

// One entry of a set's task window, in the bank arena.
struct alignas(64) TaskSlot {
  GraphTask task;  // fanin_left holds one extra count while the orchestrator places the task
  // Successors: a list in the dependency pool (entry + 1; 0 = empty) that the
  // orchestrator pushes onto and the task's finisher closes with kClosed.
  std::atomic<uint32_t> fanout;
  std::atomic<uint32_t> done;  // finished; the orchestrator may reclaim it
  uint32_t taken;              // the list the finisher detached, freed at reclaim
  uint64_t desc_end;           // descriptor ring position past this task's descriptors
};

// A dependency edge: `succ`, the window slot of a successor; `next` the entry + 1 after it.
struct DepEntry {
  uint32_t succ;
  uint32_t next;
};

// An intermediate carved from a heap ring.
struct RingIntermediate {
  enum class Scope : uint8_t { kRun, kOpen, kEnded };
  uint64_t addr = 0;
  uint64_t bytes = 0;
  uint32_t ring = 0;
  // Held by the scope (or the run) and one per task using it; whoever drops
  // it to zero marks it released, and the orchestrator reclaims its block.
  std::atomic<int32_t> refs{0};
  std::atomic<uint32_t> released{0};
  // Orchestrator only: held by the run, or by a scope still open or ended.
  Scope scope = Scope::kRun;
  bool used = false;  // a task referenced it: its release counts as released_early
};

// A block of a heap ring, in allocation order: [begin, end) in ring
// positions (which only grow), holding intermediate `im`.
struct RingBlock {
  uint64_t begin;
  uint64_t end;
  uint32_t im;
};

struct HeapRing {
  // The device allocation, made when the run first needs it: by the
  // orchestrator while scheduler threads check the guards of other rings'
  // blocks, hence atomic.
  std::atomic<uint64_t> base{0};
  uint64_t head = 0;  // next free position
  uint64_t tail = 0;  // oldest position still in use
  std::deque<RingBlock> blocks;
};

class TmrRuntime;

// One run-resource set: its window (in the arena), dependency pool, heap
// rings and intermediates. As Intermediates it serves the run's builder.
class Set final : public Intermediates {
 public:
  Set(TmrRuntime& rt, uint32_t index);

  Result<uint32_t> create(const HostApi& api, uint64_t bytes) override;
  void scope_begin() override;
  Status scope_end() override;
  Result<Held> hold(uint64_t addr, uint64_t bytes) override;
  void add_user(uint32_t i) override {
    ims_[i].used = true;
    ims_[i].refs.fetch_add(1, std::memory_order_relaxed);
  }
  bool release_user(uint32_t i) override;
  void discard(uint32_t i) override;
  uint64_t addr(uint32_t i) const override { return ims_[i].addr; }

 private:
  friend class TmrRuntime;
  friend class StreamBuilder;

  // Build state: the host thread in build(); the orchestrator after launch.
  void reset(const StreamSizes& sizes);
  // Frees what the run holds: rings, borrowed pins. The thread ending the run.
  void release_all();
  // Reclaims, oldest first, the retired tasks and the released ring blocks.
  // True when anything was reclaimed. Orchestrator only.
  bool reclaim();
  // Waits (reclaiming) until room() is true. Refuses, naming `what`, when it
  // can never become true (no task in flight) or nothing retires for the
  // stall timeout.
  template <typename Room, typename What>
  Status wait_for_room(Room&& room, What&& what, uint32_t batch = 1);
  void mark_released(RingIntermediate& im);
  TaskSlot& slot_of(uint32_t task) { return tasks_[task % sizes_.window]; }

  TmrRuntime& rt_;
  const uint32_t index_;
  uint64_t arena_addr_ = 0;
  TaskSlot* tasks_ = nullptr;            // window capacity entries, in the arena
  DeviceTensor* descriptors_ = nullptr;  // the descriptor ring, in the arena

  // The run.
  StreamSizes sizes_;
  const ChipCallable* callable_ = nullptr;
  const TaskArgs* run_args_ = nullptr;
  uint64_t launch_ns_ = 0;
  diag::RunTrace trace_;
  std::atomic<uint32_t> released_early_{0};
  FirstError error_;
  Status orchestration_error_;  // written by the orchestrator before it lets go of the run
  // The one word every finish writes, on a line of its own: the tasks in
  // flight, plus, while the orchestration runs, its hold (1) and the credits
  // it took ahead for tasks it has not submitted yet, so that submitting
  // costs the orchestrator one shared write per kCredits tasks, not one each.
  alignas(64) std::atomic<uint32_t> remaining_{0};

  // Stream state: the orchestrator thread, on lines no finisher writes.
  alignas(64) uint32_t submitted_ = 0;
  uint32_t credits_ = 0;  // counted in remaining_, not yet used by a submitted task
  uint32_t reclaimed_ = 0;
  Status stalled_;  // a task could not get its edges: the run fails with it
  uint64_t desc_head_ = 0;
  uint64_t desc_tail_ = 0;
  std::vector<uint64_t> edge_mark_;  // per window slot: (run serial, task id) it last gained an edge to
  uint64_t run_serial_ = 0;          // from 1: a zero mark matches no run
  std::vector<uint32_t> preds_;      // the current task's predecessors, found by the map
  // Reclaimed tasks that failed, for a set_dependencies() naming one.
  std::unordered_set<uint32_t> failed_reclaimed_;
  std::vector<DepEntry> deps_;
  uint32_t dep_next_ = 0;           // never-used entries start here
  uint32_t dep_free_ = 0;           // free list head (entry + 1)
  std::vector<uint32_t> uses_;      // per window slot: kMaxTaskArgs intermediates it references
  std::vector<GuardCheck> guards_;  // per window slot: kMaxTaskArgs guard checks
  TensorMap map_;
  HeapRing rings_[kHeapRings];
  std::unique_ptr<RingIntermediate[]> ims_;
  uint32_t im_capacity_ = 0;
  uint32_t im_next_ = 0;  // never-used entries start here
  std::vector<uint32_t> im_free_;
  std::map<uint64_t, uint32_t> live_;  // block address -> intermediate, for hold()
  std::vector<std::vector<uint32_t>> scopes_;
  BorrowedAllocations borrowed_;
};

class TmrRuntime final : public ChipRuntime {
 public:
  static Result<std::unique_ptr<ChipRuntime>> create(Device& device, const RuntimeOptions& options, RunDoneFn on_done);
  ~TmrRuntime() override;

  Result<std::unique_ptr<Pending>> build_grant(uint32_t grant) const override;
  void commit_grant(Pending& pending) noexcept override;
  uint32_t width() const override { return static_cast<uint32_t>(sets_.size()); }
  uint64_t arena_bytes() const override;
  Status build(const HostApi& api, const ChipCallable& callable, const TaskArgs& run_args, const RuntimeEnv& env,
               const diag::RunTrace& trace) override;
  void discard(uint32_t) override {}
  void launch(uint32_t slot) override;
  // The orchestration runs on the device, never with a HostApi binding.
  bool binding_held(uint32_t) const override { return false; }
  uint32_t last_tasks(uint32_t slot, uint32_t* out, uint32_t capacity) const override {
    return dispatcher_.last_done(slot, out, capacity);
  }
  bool poll(uint32_t aicpu) override;
  uint64_t poll_again_by(uint32_t aicpu) override {
    return aicpu < device_.geometry().aicpu_threads ? dispatcher_.poll_again_by(aicpu) : 0;
  }
  uint32_t orchestrator_threads() const override { return 1; }
  uint64_t idle_spin_ns(uint32_t aicpu, uint64_t spin_ns) const override {
    return aicpu < device_.geometry().aicpu_threads ? spin_ns : turnaround_.spin_ns(spin_ns);
  }

 private:
  friend class Set;
  friend class StreamBuilder;
  struct GrantState;

  TmrRuntime(Device& device, uint32_t window_capacity, RunDoneFn on_done);
  Result<StreamSizes> sizes_for(const RuntimeEnv& env) const;
  uint64_t descriptor_capacity() const;
  void stream(Set& s);
  GraphTask& task_of(ReadyItem item) const { return sets_[item.slot]->tasks_[item.task].task; }
  // Who ends a task: an AICPU thread that read its FIN, or the run's
  // orchestrator, which ran its kernel itself or placed it poisoned.
  enum class Ender : uint8_t { kAicpu, kOrchestrator };
  void complete_subtask(const CoreDispatcher::Inflight& f, const char* failure, std::vector<ReadyItem>& ready);
  // Ends subtask `sub` of the task in set `s`'s window slot `slot`, whose
  // kernel reported `failure` (null: none), and, at its last subtask, the
  // task: what a FIN read on AICPU thread `aicpu` does, and what the
  // orchestrator does after running a kernel itself.
  void end_subtask_of(Set& s, uint32_t slot, uint32_t sub, const char* failure, uint32_t aicpu,
                      std::vector<ReadyItem>& ready, Ender by);
  // Ends the task in window slot `slot` (`failed`: it or a predecessor
  // failed) and, iteratively, each poisoned successor that it leaves with no
  // fanin; queues the successors that became ready into `ready`. The
  // orchestrator keeps what it ended as credits; any other ender drops it
  // from the run's remaining count.
  void finish_task(Set& s, uint32_t slot, bool failed, std::vector<ReadyItem>& ready, Ender by);
  // CoreDispatcher's chain_after: a consumer of `after` that waits on it
  // alone, of `kind`, not SPMD, marked chained. A consumer is counted in its
  // fanin before it joins a producer's list, and its submission holds one
  // more until it is placed, so a count of one seen from `after`'s list is
  // `after` alone, with the consumer's arguments written. A task with guards
  // has none (its guard check may poison them after its kernel succeeded).
  bool chain_after(ReadyItem after, TaskKind kind, ReadyItem& next) const;
  // Drops `n` of the run's remaining count; the one reaching zero ends the
  // run, and one reaching the orchestrator's wake-up mark rings it.
  void drop_remaining(Set& s, uint32_t n);
  void finish_run(Set& s);

  Device& device_;
  DeviceMemory& memory_;
  const uint32_t window_capacity_;
  RunDoneFn on_done_;
  std::vector<std::unique_ptr<Set>> sets_;
  CoreDispatcher dispatcher_;
  std::mutex launched_mu_;
  std::deque<uint32_t> launched_;  // sets whose orchestration waits for the orchestrator thread
  // Launches pushed onto launched_, counted once each push is done: the idle
  // orchestrator polls this word, not launched_mu_. Had it locked the mutex
  // on every poll, a launching host thread would often find it held, and one
  // side or the other would sleep in the kernel on it: 2-4 us between the
  // launch and its pickup in a scratch build's stamps.
  std::atomic<uint64_t> launches_{0};
  uint64_t launches_taken_ = 0;  // the orchestrator thread's alone
  // The orchestrator waiting for a set's tasks to finish (Set::wait_for_room):
  // (set + 1) << 32 | the remaining_ count at or below which a finisher rings
  // progress_; 0 while it is not waiting. Here, not in the set: a finisher
  // reads it after its decrement, when the set may have been handed back.
  std::atomic<uint64_t> waiting_{0};
  Doorbell progress_;
  // The host's last turnaround, which sets the orchestrator's wait for a launch.
  HostTurnaround turnaround_;
};

}  // namespace simpler::tmr
