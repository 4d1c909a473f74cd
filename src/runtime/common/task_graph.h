// The fanin core every graph-scheduling runtime shares: the task record a
// run's graph holds in device memory, the walk that releases a finished
// task's successors (and the intermediates it was the last user of), and the
// run's first error. A run's graph is written by the building thread
// before launch; afterwards AICPU threads touch only the atomics.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "device/device.h"
#include "runtime/common/run_allocations.h"
#include "simpler/kernel.h"
#include "simpler/task_args.h"

namespace simpler {

enum class TaskKind : uint8_t { AIC = 0, AIV = 1, Mix = 2 };

// A mix task is one AIC subtask and two AIV subtasks, started together.
inline uint32_t subtask_count(TaskKind kind) { return kind == TaskKind::Mix ? 3 : 1; }
inline CoreType subtask_core(TaskKind kind, uint32_t sub) {
  return kind == TaskKind::AIC || (kind == TaskKind::Mix && sub == 0) ? CoreType::AIC : CoreType::AIV;
}

struct alignas(64) GraphTask {
  std::atomic<uint32_t> fanin_left;
  std::atomic<uint32_t> subtasks_left;
  std::atomic<uint32_t> poisoned;
  uint32_t fanin;
  uint32_t id;                       // the task's id in its run, for kernel labels and errors
  uint32_t blocks;                   // SPMD: kernel runs, each its own subtask; 1 otherwise
  std::atomic<uint32_t> next_block;  // SPMD: the next block a core takes
  TaskKind kind;
  uint8_t nargs;
  // Posted behind its last pending predecessor on that one's core (a chain
  // link): the release that makes it ready leaves it out of the ready queue.
  // Only the AICPU thread that owns the core writes and reads it.
  uint8_t chained;
  uint32_t func_id[3];
  simpler_kernel_fn fn[3];
  const char* name[3];  // the kernels' names, for a crash report
  uint32_t fanout_begin;
  uint32_t fanout_count;
  uint32_t uses_begin;  // intermediates this task references, released when it ends
  uint32_t uses_count;
  uint32_t guards_begin;  // guarded device memory: the allocations to check when it ends
  uint32_t guards_count;
  int64_t args[kMaxTaskArgs];
};

// One run's graph as the fanin walk sees it; every array belongs to the run.
struct TaskGraphView {
  GraphTask* tasks;
  const uint32_t* fanout;
  const uint32_t* uses;  // indices of the run's intermediates
  Intermediates* allocations;
};

// Ends `task`, whose kernels ran (`failed` if one reported failure): drops
// its references on intermediates, freeing those it was the last user of
// (counted in `released_early`), and counts down each successor's fanin,
// poisoning the successors of a failed task. A successor whose fanin reaches
// zero goes to on_ready(successor) unless it is poisoned; a poisoned one
// finishes here without running, and so on down its own successors,
// iteratively, so a long poisoned chain cannot overflow the stack. Returns
// how many tasks finished, `task` included. Any AICPU thread.
template <typename OnReady>
uint32_t release_fanout(const TaskGraphView& g, uint32_t task, bool failed, std::atomic<uint32_t>& released_early,
                        OnReady&& on_ready) {
  std::vector<uint32_t> poisoned_done;  // allocates only when a failure poisons a successor
  uint32_t finished = 0;
  for (;;) {
    const GraphTask& t = g.tasks[task];
    for (uint32_t i = 0; i < t.uses_count; ++i) {
      if (g.allocations->release_user(g.uses[t.uses_begin + i])) released_early.fetch_add(1, std::memory_order_relaxed);
    }
    for (uint32_t i = 0; i < t.fanout_count; ++i) {
      const uint32_t succ = g.fanout[t.fanout_begin + i];
      GraphTask& s = g.tasks[succ];
      if (failed) s.poisoned.store(1, std::memory_order_relaxed);
      if (s.fanin_left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        if (s.poisoned.load(std::memory_order_acquire) != 0) {
          poisoned_done.push_back(succ);
        } else {
          on_ready(succ);
        }
      }
    }
    ++finished;
    if (poisoned_done.empty()) return finished;
    task = poisoned_done.back();
    poisoned_done.pop_back();
    failed = true;
  }
}

// Whether `succ`, a successor of a task whose release is still owed (it has
// not ended), waits on that task alone and may follow it on a `kind` core as
// a chain link (CoreDispatcher's chain_after); if so, marks it chained. A
// fanin count of one is then that task's. The acquire pairs with the other
// predecessors' releases, so the core that runs it sees what they wrote.
// Only the AICPU thread that owns the task's core calls it.
inline bool take_as_chain_link(GraphTask& succ, TaskKind kind) {
  if (succ.kind != kind || succ.blocks != 1) return false;
  if (succ.fanin_left.load(std::memory_order_acquire) != 1 || succ.poisoned.load(std::memory_order_relaxed) != 0) {
    return false;
  }
  succ.chained = 1;
  return true;
}

// Whether `task` heads a chain of at least kChainHeadLinks links: its lone
// successor waits on it alone and runs on the same kind of core as a lone
// kernel, and so on down the chain (CoreDispatcher's heads_chain). Read from
// the counts the build wrote (fanin, fanout), which no release changes. A
// pair does not count: one core wake-up for two kernels cost more than
// running both inline in the dispatch benchmark's layered graphs (2 vCPUs).
inline constexpr uint32_t kChainHeadLinks = 2;
inline bool heads_chain(const TaskGraphView& g, uint32_t task) {
  const GraphTask* t = &g.tasks[task];
  for (uint32_t link = 0; link < kChainHeadLinks; ++link) {
    if (t->fanout_count != 1 || t->blocks != 1 || t->kind == TaskKind::Mix) return false;
    const GraphTask& next = g.tasks[g.fanout[t->fanout_begin]];
    if (next.fanin != 1 || next.kind != t->kind) return false;
    t = &next;
  }
  return t->blocks == 1;
}

// Whether `w`, a write, makes the earlier access `a` redundant: every later
// access that conflicts with `a` conflicts with `w`, which is ordered after it.
bool write_covers(const TensorView& w, const TensorView& a);

// The subtask a guard check's error is recorded under: after every kernel
// and block of the task, so a kernel's own failure report comes first.
inline constexpr uint32_t kGuardCheckSubtask = 0xFFFFFFF0u;

// The run's first error: the failure of the lowest (task, subtask), not of
// whichever core finished first, so every runtime (and every run of one)
// reports the same error for the same graph. Any thread.
class FirstError {
 public:
  void reset();
  void record(uint32_t task, uint32_t subtask, Status status);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  Status get() const;

 private:
  mutable std::mutex mu_;
  uint64_t key_ = UINT64_MAX;
  Status status_;
  std::atomic<bool> failed_{false};
};

// Subtasks of a task: a mix task's three kernels, or an SPMD task's blocks.
inline uint32_t subtask_count(TaskKind kind, uint32_t blocks) { return kind == TaskKind::Mix ? 3 : blocks; }
// Which of a task's kernels subtask `sub` runs.
inline uint32_t kernel_of(TaskKind kind, uint32_t sub) { return kind == TaskKind::Mix ? sub : 0; }

// The error of subtask `sub` of task `task` (of `blocks` blocks) whose kernel reported `message`.
Status kernel_failure(uint32_t task, TaskKind kind, uint32_t sub, uint32_t func_id, uint32_t blocks,
                      const char* message);

}  // namespace simpler
