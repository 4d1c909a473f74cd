// ResidentRuntime: the core-resident scheduler route (`resident`, seed 002).
// The host builds each run's whole graph as host_build_graph does; after
// launch the cores schedule themselves: each core thread claims ready tasks
// from per-cluster ready lists (its own cluster's first, then stealing from
// the others), runs them, completes them, releases its successors' fanins
// into its own cluster's lists and wakes idle peers. A mix task is
// gang-scheduled on one cluster. The AICPU threads only supervise: they hand
// a launched run's roots to the clusters and retire a drained run; none of
// them observes a task start or finish. Threads as in runtime/runtime.h, and
// core_poll() on each core thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/common/host_graph.h"
#include "runtime/common/ready_queue.h"
#include "runtime/common/task_graph.h"
#include "runtime/resident/args_capture.h"
#include "runtime/runtime.h"

namespace simpler::resident {

// The core-side hand-off points of a task, in order. Mechanism R's BEFORE
// barrier sits at kBeforeExecute and its AFTER barrier at kAfterExecute,
// ahead of kBeforeRelease.
enum class HandOff : uint8_t { kClaimed, kBeforeExecute, kAfterExecute, kBeforeRelease };

#ifdef SIMPLER_TEST_HOOKS
// Test builds only: observers called on the core thread at each hand-off
// (`from_cluster`: where a claimed task was taken from; the core's own
// cluster unless it was stolen), and when a core joined its cluster's gang
// and waits for the rest of it. Installed while no run is live.
struct Hooks {
  std::function<void(HandOff point, uint32_t core, uint32_t task_id, uint32_t sub, uint32_t from_cluster)> hand_off;
  std::function<void(uint32_t core, uint32_t task_id)> gang_wait;
  // Mechanism R: its hooks, its budgets and chunk size for runs built while
  // installed, and each dumping run's capture block as it is allocated.
  CaptureHooks capture;
  CaptureConfig capture_config;
  std::function<void(uint32_t slot, uint64_t bytes)> capture_block;
};
// Null uninstalls; `hooks` outlives its installation.
void set_hooks(const Hooks* hooks);
#endif

class ResidentRuntime final : public ChipRuntime, public CoreProgram, public CaptureEnv {
 public:
  static Result<std::unique_ptr<ChipRuntime>> create(Device& device, const RuntimeOptions& options, RunDoneFn on_done);
  ~ResidentRuntime() override;

  Result<std::unique_ptr<Pending>> build_grant(uint32_t grant) const override;
  void commit_grant(Pending& pending) noexcept override;
  uint32_t width() const override { return static_cast<uint32_t>(slots_.size()); }
  uint64_t arena_bytes() const override { return capacity_.arena_bytes(); }
  Status build(const HostApi& api, const ChipCallable& callable, const TaskArgs& run_args, const RuntimeEnv& env,
               const diag::RunTrace& trace) override;
  void discard(uint32_t slot) override;
  void launch(uint32_t slot) override;
  bool binding_held(uint32_t slot) const override;
  uint32_t last_tasks(uint32_t slot, uint32_t* out, uint32_t capacity) const override;
  // The supervisor: starts launched runs and retires drained ones.
  bool poll(uint32_t aicpu) override;
  CoreProgram* core_program() override { return this; }
  bool core_poll(uint32_t core, CoreExecutor& exec) override;

 private:
  struct Slot;
  struct GrantState;
  struct Claim;

  // An intrusive FIFO of ready tasks of one kind on one cluster, linked
  // through the slots' `next` arrays: a task sits in at most one list at a
  // time, so the lists together need no capacity of their own.
  class ReadyList {
   public:
    void push(ReadyItem item, const std::vector<std::unique_ptr<Slot>>& slots);
    bool pop(ReadyItem& out, const std::vector<std::unique_ptr<Slot>>& slots);
    bool empty_hint() const { return size_.load(std::memory_order_seq_cst) == 0; }

   private:
    std::mutex mu_;
    ReadyItem head_{kNone, 0};
    ReadyItem tail_{kNone, 0};
    std::atomic<uint32_t> size_{0};
  };

  // A cluster's ready lists and its gang: the one mix task its three cores
  // run together. gang_ is (seq << 2) | state; the claimer alone writes
  // gang_item_ and resets the masks, inside kClaiming.
  struct alignas(64) Cluster {
    ReadyList lists[3];  // by TaskKind
    std::atomic<uint64_t> gang{0};
    ReadyItem gang_item{kNone, 0};
    uint32_t gang_from = 0;            // the cluster its task was taken from
    std::atomic<uint32_t> arrived{0};  // bit per core of the cluster (core % 3)
    std::atomic<uint32_t> left{0};
  };

  // What only core `c`'s thread writes, except `idle`, which wakers read.
  struct alignas(64) CoreState {
    std::atomic<bool> idle{false};
    Participant capture;           // the occupancy this core is in on a dumping run
    CaptureCoreState capture_ids;  // its phase_seq and request_tick counters
    uint64_t joined_gang = 0;      // the gang seq this core joined and has not run yet (0: none)
    uint64_t last_gang = 0;        // the last gang seq it joined
    KernelFailure failure;
  };

  static constexpr uint32_t kNone = UINT32_MAX;

  ResidentRuntime(Device& device, GraphCapacity capacity, RunDoneFn on_done);

  // The four hand-off points of the core side. On a dumping run
  // before_execute and after_execute are Mechanism R's barriers; a non-OK
  // before_execute means the subtask must not execute.
  bool claim_task(uint32_t core, Claim& claim);
  Status before_execute(uint32_t core, const Claim& claim);
  void after_execute(uint32_t core, const Claim& claim, bool ok, Status capture);
  void release_successors(uint32_t core, Slot& s, uint32_t task);

  bool claim_gang(uint32_t core, Claim& claim);
  bool claim_single(uint32_t core, Claim& claim);
  bool pop_kind(uint32_t cluster, TaskKind kind, ReadyItem& item, uint32_t& from);
  void push_ready(uint32_t cluster, ReadyItem item, TaskKind kind);
  // Rings up to `n` idle cores that can take a task of `kind`, nearest first
  // (the peers of `cluster`, AIV before AIC for an AIV task), then the other clusters.
  void wake_idle(uint32_t cluster, TaskKind kind, uint32_t n, uint32_t except_core);
  void leave_gang(uint32_t core);
  void finish_run(Slot& s);
  // Runs every live dumping run's service step for AICPU thread `aicpu`'s lane.
  bool serve_captures(uint32_t aicpu);
  // Frees a run's capture block once no AICPU thread serves it.
  void release_capture(Slot& s);
  Doorbell& core_bell(uint32_t core) override;
  void ring_aicpu(uint32_t lane) override;
  // Tells set `s`'s supervisor that its phase changed.
  void notify_supervisor(const Slot& s);
  GraphTask& task_of(ReadyItem item) const;

  Device& device_;
  DeviceMemory& memory_;
  const GraphCapacity capacity_;
  RunDoneFn on_done_;
  const uint32_t clusters_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::unique_ptr<Cluster[]> cluster_;
  std::unique_ptr<CoreState[]> core_;
  std::atomic<uint32_t> ready_[3] = {};  // tasks in the lists, by kind: the cheap test before a scan
  // Per supervisor, the launches and drains it has not handled yet: it reads
  // the set table only then, so an idle poll never races a regrant.
  struct alignas(64) Supervisor {
    std::atomic<uint32_t> events{0};
  };
  std::unique_ptr<Supervisor[]> pending_;
  std::atomic<uint32_t> capturing_{0};
  Doorbell serving_bell_;  // rung when an AICPU thread leaves a run's service step  // live dumping runs: the AICPU
                           // threads serve their lanes
};

}  // namespace simpler::resident
