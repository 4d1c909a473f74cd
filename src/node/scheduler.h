// Scheduler: the node's single progress thread and its only publisher (R34).
// It takes whole runs from the inbox, wires their tasks' dependencies through
// the TensorMap (tags over overlapping tensor regions, within and across live
// runs), keeps the READY queue, claims a task READY -> RUNNING only after its
// lane's can_dispatch() said yes (R32, R33), publishes it, and turns endpoint
// terminals into task completions and run terminals. After the READY tasks
// (active first), it stages at most one successor per chip lane: a task whose
// unfinished predecessors are all published on that same chip goes out
// PREPARE_READY, is prepared in the child while they execute, and is
// activated when the last one succeeds (cancelled when one fails).
// Threads: enqueue() from any thread; everything else on the scheduler thread,
// which is a role: the Scheduler's own thread, or a thread standing in for it
// while that one parks (a serve loop through drive(), a thread waiting for a
// run through waiter_driver(), which between its rounds also receives for
// the ports that need polling; one round at a time, under role_mu_), or,
// before start(), a test thread driving step(). Owns the runs.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/doorbell.h"
#include "chip/run_resource_arena.h"
#include "chip/run_state.h"
#include "node/worker_lane.h"
#include "simpler/call_config.h"

namespace simpler {

// The spin of every thread a node run's hand-offs cross: the Scheduler, the
// waiter in RunHandle::wait and the children's serve loops. A hand-off to a
// thread with no CPU waits for a spinner to yield one; a pause costs ~130 ns
// on these VMs (pause-loop exits), so the default 64 pauses per yield held a
// CPU ~8 µs per hop. Yielding on every round hands it over at once.
inline constexpr SpinPolicy kNodeSpin{1, SpinPolicy{}.spin_ns};

struct NodeRun;
struct NodeTask;

// A dependency as its predecessor holds it: the successor, and where the
// predecessor sits in the successor's predecessors.
struct SuccessorEdge {
  NodeTask* task = nullptr;
  uint32_t slot = 0;
};

// When the scheduler published a task and saw its terminal: a traced run's
// host lanes (docs/diagnostics.md). Written on the scheduler thread only
// when the run records a swimlane.
struct TaskTimes {
  uint64_t publish_ns = 0;    // the publication began
  uint64_t published_ns = 0;  // it returned: the child may take the task
  uint64_t end_ns = 0;        // its terminal was seen
  bool staged = false;        // published PREPARE_READY
};

// One member of a group task: its own publication on its own worker.
struct GroupMember {
  uint64_t id = 0;      // node-unique dispatch id
  uint32_t worker = 0;  // chip index; for a sub group, the sub worker it went to
  // The registration of its chip's mailbox (EndpointPort::registration) whose
  // device buffers it names; 0 when it names none.
  uint64_t registration = 0;
  std::vector<uint8_t> blob;
  TaskArgs args;                // node-wide addresses, for the TensorMap
  std::vector<uint8_t> config;  // request-frame config bytes
  TaskTimes times;
};

struct NodeTask {
  // kStaged: published PREPARE_READY with predecessors still running.
  enum class State : uint8_t { kPending, kReady, kStaged, kRunning, kDone };
  uint64_t id = 0;     // node-unique; the dispatch id on the wire (never 0)
  uint32_t index = 0;  // within its run
  NodeRun* run = nullptr;
  bool sub = false;           // a sub function, on any sub worker; else a chip callable
  uint32_t worker = 0;        // chip index; for a sub task, the sub worker it went to
  uint64_t registration = 0;  // as GroupMember::registration
  Digest callable{};
  std::vector<uint8_t> config;   // request-frame config bytes
  std::vector<uint8_t> blob;     // the arguments as the child decodes them
  TaskArgs args;                 // node-wide addresses, for the TensorMap
  std::vector<uint32_t> allocs;  // the run's heap allocations it uses
  State state = State::kPending;
  uint32_t fanin = 0;
  std::vector<SuccessorEdge> successors;
  // Null once that predecessor finished: its run may retire and free it
  // while this task still waits.
  std::vector<NodeTask*> predecessors;
  Status poison;  // set when a predecessor failed: the task completes with it, unrun
  // A group (all-or-nothing over several workers) when non-empty: published
  // only when every member can be, done when every member is, failed by the
  // first member that fails. id, blob and args above are then unused.
  std::vector<GroupMember> members;
  uint32_t members_left = 0;
  Status group_status;
  TaskTimes times;
};

struct HeapAlloc {
  uint64_t addr = 0;
  uint32_t users = 0;
  bool scope_ended = false;
  bool freed = false;
};

struct NodeRun {
  uint64_t id = 0;
  // The run's node-level set, minted at admission (begin_run takes none,
  // R41); the staging guard asks whether it is still owned (R40).
  Lease lease;
  std::shared_ptr<detail::RunState> handle;
  std::vector<std::unique_ptr<NodeTask>> tasks;
  std::vector<HeapAlloc> allocs;
  std::vector<uint64_t> borrowed;  // caller-owned buffers its tasks use (node addresses)
  uint32_t remaining = 0;
  Status first_error;
  // RunStats inputs.
  double build_us = 0;  // the orchestration, on the submitting thread
  uint64_t first_publish_ns = 0;
  uint64_t last_terminal_ns = 0;
  uint32_t executed = 0;        // tasks a child ran to success
  uint32_t released_early = 0;  // scoped intermediates freed before the run's terminal
  // Its diagnostics: with a swimlane the scheduler stamps TaskTimes, and the
  // retire hook writes the run's trace.json from them and the children's
  // fragments; each next-level task's request carries `call` for its child.
  CallConfig call;
  std::string trace_label;  // this process in the trace: empty for the top level's own name
  // Where its children write their parts (diag::child_trace_dir under it):
  // trace_dir/run<id> at the top level, so runs in flight at once never
  // share one; a network's node child's trace_dir is already its own.
  std::string parts_dir;
  uint64_t submit_ns = 0;  // the orchestration began
  uint64_t built_ns = 0;   // it returned
};

class Scheduler {
 public:
  struct Hooks {
    // Scheduler thread, once per run, before its handle completes.
    std::function<void(NodeRun&)> retire;
    std::function<void(uint64_t addr)> free_heap;
  };

  // `bell` is rung by every child and by enqueue(); the thread parks on it.
  // `run_sets`: how many runs may be live at once (the node's pipeline_depth;
  // its admission keeps within it).
  Scheduler(std::vector<EndpointPort*> chips, std::vector<EndpointPort*> subs, Doorbell* bell, Hooks hooks,
            uint32_t run_sets = kDefaultRunSets, uint64_t driver_grace_ns = kDriverGraceNs);
  static constexpr uint32_t kDefaultRunSets = 4096;
  ~Scheduler();

  // False under host memory exhaustion; `run` is then still the caller's.
  bool enqueue(std::unique_ptr<NodeRun>&& run);
  // One round: inbox, endpoint progress, dispatch. True when anything moved.
  bool step();
  void start();
  // Lets every run reach its terminal, then ends the thread. At deadline_ns
  // every endpoint is poisoned so each held run gets its terminal now.
  void stop(uint64_t deadline_ns);

  // The calling thread stands in for the scheduler thread: one round, when
  // the bell rang since its last one (or a tick passed), so a thread that
  // polls anyway (a node child's serve loop) reaches a submitted run without
  // a hand-off, and the Scheduler's own thread parks instead of spinning
  // beside it. That thread takes over again at release_driver(), or once the
  // driver has not called for `driver_grace_ns` (it is inside a long
  // orchestration or command). One driving thread, after start(). True when
  // anything moved.
  bool drive();
  void release_driver();
  // What a RunHandle of this Scheduler's runs waits through: when its run
  // is the only one live, its waiter steps the rounds while it waits and
  // parks on the Scheduler's bell, and the own thread stands by as for
  // drive(); with others in flight it waits as before. A waiter that leaves
  // with runs still live does not wake the own thread (the next wait
  // usually follows at once); that thread takes them over once no waiter
  // has stepped for the grace, and until then a poller of done() steps
  // them. A run enqueued while the own thread stands by is admitted and
  // published by its submitter. Outlives the Scheduler (handles hold it);
  // stop() closes it.
  std::shared_ptr<detail::RunDriver> waiter_driver() const;
  // Waiters stepping the rounds right now: what a test waits for.
  uint32_t driving_waiters() const { return waiters_.load(std::memory_order_acquire); }
  static constexpr uint64_t kDriverGraceNs = 1'000'000;
  // How a test sees the own thread stand by: the rounds it stepped, and
  // whether it is parked (or about to) while a driver stands in.
  uint64_t own_rounds() const { return own_rounds_.load(std::memory_order_relaxed); }
  bool standing_by() const { return takeover_.parked() != 0; }

  // Scheduler thread, or a test between steps.
  size_t ready_count() const { return ready_.size(); }
  size_t live_runs() const { return runs_.size(); }
  WorkerLane& chip_lane(size_t i) { return chip_lanes_[i]; }
  WorkerLane& sub_lane(size_t i) { return sub_lanes_[i]; }
  uint64_t publications() const { return publications_; }
  uint64_t stagings() const { return stagings_; }
  RunResourceArena& run_resources() { return run_resources_; }
  // The node set run `run_id` holds, while it is live.
  std::optional<Lease> lease_of(uint64_t run_id) const {
    auto it = runs_.find(run_id);
    return it == runs_.end() ? std::nullopt : std::optional<Lease>(it->second->lease);
  }

 private:
  struct Access {
    NodeTask* task;
    TensorView view;
    Tag tag;
  };

  void main();
  // The own thread, while a driver stands in: parked until it is released,
  // stops calling for the grace, or stop() is asked.
  void stand_by();
  // Reads the clock only while a driver is attached: a Scheduler nobody
  // drives asks this on every spin round.
  bool driven() const {
    return (driver_attached_.load(std::memory_order_acquire) || waiters_.load(std::memory_order_acquire) != 0) &&
           now_ns() < driver_ns_.load(std::memory_order_relaxed) + driver_grace_ns_;
  }
  class Gate;
  // A waiter's call: keeps the own thread standing by and, when `round`,
  // steps a round as step_if_free() does. Any number of waiters at once.
  std::optional<bool> drive_waiting(bool round, uint64_t* rounds_after) noexcept;
  // A round if no other thread is in one (nullopt when one is: try again),
  // without claiming the role (a poller, a submitter): the own thread stands
  // by no longer for it. Whether the round moved anything; `rounds_after`,
  // when given, gets rounds() as this round left it.
  std::optional<bool> step_if_free(uint64_t* rounds_after = nullptr) noexcept;
  uint64_t rounds() const { return rounds_.load(std::memory_order_acquire); }
  bool idle();
  void admit(std::unique_ptr<NodeRun> run);
  void wire(NodeTask* t);
  bool dispatch_ready();
  void dispatch_claimed(NodeTask* t, WorkerLane& lane, bool staged = false);
  // Refuses a chip task built against device buffers of a child of `worker`
  // that has since died and been replaced: those buffers are gone.
  Status check_registration(uint32_t worker, uint64_t registration);
  // A group: finished now (a worker is gone), left READY (some member's gate
  // says no) or published member by member. True when it moved.
  bool dispatch_group(NodeTask* t);
  void member_done(NodeTask* t, const Status& st);
  // Every tensor access of t (a group's: every member's).
  template <typename F>
  static void for_each_arg(const NodeTask* t, F&& f) {
    if (t->members.empty()) {
      for (size_t i = 0; i < t->args.size(); ++i) f(t->args[i]);
      return;
    }
    for (const GroupMember& m : t->members) {
      for (size_t i = 0; i < m.args.size(); ++i) f(m.args[i]);
    }
  }
  // stage_preparable_run of R40, over every preparable successor.
  bool stage_preparable();
  // Every unfinished predecessor is published (not staged) on t's own chip.
  static bool preparable(const NodeTask* t);
  // The per-endpoint guard: the run still owns its set.
  bool can_stage_run_on_worker(const NodeTask* t) const { return run_resources_.owns(t->run->lease); }
  bool handle_events();
  // t ended with `st`: its successors are released, and each poisoned one
  // whose last predecessor this was ends too, with its poison, and so on down.
  void finish(NodeTask* t, const Status& st);
  // Marks one task done: its accesses, the run's first error, its heap uses.
  void end_task(NodeTask* t, const Status& st);
  // t, done with `st`, no longer holds back e's successor: poisons it when st
  // failed and, at its last predecessor, activates, readies or (poisoned)
  // returns it to be finished.
  NodeTask* release(NodeTask* t, const Status& st, const SuccessorEdge& e);
  void add_accesses(NodeTask* t);
  void forget_accesses(NodeTask* t);
  void retire(NodeRun* run);
  bool retire_finished();
  void release_alloc(HeapAlloc& a);

  std::vector<WorkerLane> chip_lanes_;
  std::vector<WorkerLane> sub_lanes_;
  Doorbell* bell_;
  Hooks hooks_;

  std::mutex inbox_mu_;
  std::vector<std::unique_ptr<NodeRun>> inbox_;
  std::vector<std::unique_ptr<NodeRun>> incoming_;  // swapped with inbox_ each round

  std::unordered_map<uint64_t, std::unique_ptr<NodeRun>> runs_;
  std::unordered_map<uint64_t, NodeTask*> running_;  // by dispatch id
  std::deque<NodeTask*> ready_;
  std::vector<NodeTask*> preparable_;  // successors of published chip tasks, in publication order
  // The TensorMap: the tensor accesses of live tasks, by buffer address
  // (views of different buffers never overlap); an access a later write
  // covers is dropped (wire).
  std::unordered_map<uint64_t, std::vector<Access>> accesses_;
  std::vector<EndpointEvent> events_;
  std::vector<NodeRun*> retiring_;  // every task done; retired at the end of the phase
  uint32_t next_sub_ = 0;
  uint64_t publications_ = 0;
  uint64_t stagings_ = 0;
  RunResourceArena run_resources_;

  // Held for every round: whoever holds it is the scheduler thread.
  std::mutex role_mu_;
  const uint64_t driver_grace_ns_;
  std::atomic<bool> driver_attached_{false};
  std::atomic<uint64_t> driver_ns_{0};  // the driver's last call
  Doorbell takeover_;                   // the own thread stands by here; private to this process
  std::atomic<uint64_t> own_rounds_{0};
  std::atomic<uint64_t> rounds_{0};  // every thread's
  // The driver's own: the bell and the round count at its last round,
  // whether that round moved (so it steps again without a ring), and when,
  // for the tick.
  uint32_t driver_seq_ = 0;
  uint64_t driver_saw_rounds_ = 0;
  bool driver_again_ = true;
  uint64_t driver_step_ns_ = 0;
  // Waiters inside the gate, driving; runs enqueued and not yet retired
  // (a waiter drives only a lone run); whether the own thread stands by
  // (enqueue() then steps the run itself).
  std::atomic<uint32_t> waiters_{0};
  std::atomic<uint32_t> live_{0};
  std::atomic<bool> standby_{false};
  // The ports that need polling (fixed at construction), and their tasks in
  // flight: a waiter whose run has one there receives for it (Gate::wait).
  std::vector<EndpointPort*> polled_ports_;
  std::atomic<uint32_t> polled_inflight_{0};
  std::shared_ptr<Gate> gate_;

  std::atomic<bool> stop_requested_{false};
  std::atomic<uint64_t> stop_deadline_ns_{0};
  bool aborted_ = false;
  std::thread thread_;
};

}  // namespace simpler
