// NodeWorker: the engine behind Worker at Level::Node (L3) and
// Level::Network (L4): the level is a label. It maps the shared heap and
// every mailbox, forks its ForkServer before starting any thread of its own,
// has it fork every child (next-level workers: chips with a
// ChipChildHandler, or nodes with a NodeChildHandler; sub workers with a
// SubWorkerHandler), then runs the Scheduler. It admits whole runs in FIFO order, at most pipeline_depth
// at once (begin_run takes no lease, R41), builds each run on the caller's
// thread through an Orchestrator, and keeps the registry of caller-owned
// buffers and the live runs borrowing them (R47).
// Threads: the controlling thread calls everything public; the scheduler
// thread calls back into retire/free hooks. Owns children, heap and scheduler.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/host_range.h"
#include "base/user_code.h"
#include "ipc/forked_child.h"
#include "node/external_worker.h"
#include "node/scheduler.h"
#include "node/shared_heap.h"
#include "node/worker_lane.h"
#include "simpler/call_config.h"
#include "simpler/orchestrator.h"
#include "simpler/run_handle.h"
#include "simpler/worker_config.h"

namespace simpler {

// Device addresses at the node level name their chip and the child of it
// that allocated them: bit 62 marks a device address, bits 56..61 hold the
// child's incarnation (0 for the first, one more per replacement), bits
// 48..55 the chip index, the low 48 bits the chip's own address. So a
// replacement's buffers never share an address with its dead predecessor's,
// which are reported lost; a chip is replaced at most
// kNodeMaxIncarnations - 1 times. Shared-heap addresses are plain host
// pointers (below 2^47).
inline constexpr uint64_t kNodeDeviceTag = 1ull << 62;
inline constexpr uint64_t kNodeIncarnationShift = 56;
inline constexpr uint64_t kNodeMaxIncarnations = 64;
inline constexpr uint64_t kNodeChipShift = 48;
inline constexpr uint64_t kNodeChildAddrMask = (1ull << kNodeChipShift) - 1;
inline constexpr uint32_t kNodeMaxChips = 255;
// Each is a forked process with a mailbox of its own.
inline constexpr uint32_t kNodeMaxSubWorkers = 255;
inline bool is_node_device_addr(uint64_t a) { return (a & kNodeDeviceTag) != 0; }

// What a NodeWorker is built from. Level::Node: its next level is
// config.chips chips running `chip_callables`. Level::Network: its next level
// is one forked node per entry of `nodes`, running `node_callables`.
struct NodeSpec {
  Level level = Level::Node;
  WorkerConfig config;
  std::vector<ChipCallable> chip_callables;
  std::vector<NodeCallable> node_callables;
  std::vector<NodeSpec> nodes;
  std::vector<SubFunction> functions;
  // The shared heaps of the levels above, mapped before this process was
  // forked: tensors there are taken as they are (their owner checked them).
  std::vector<HostRange> inherited;
  // How often each child may be replaced (SpawnOptions::respawn_budget per
  // respawn_window_ns); tests that kill children on purpose widen it.
  size_t respawn_budget = kRespawnBudget;
  uint64_t respawn_window_ns = kRespawnWindowNs;
  // An entry of a network's `nodes` with this set is not forked: the factory
  // builds the port that reaches it (a node on another MPI rank), after
  // every local child is forked; the rest of that entry is unused.
  std::shared_ptr<const ExternalWorkerFactory> external;
  int remote_rank = -1;  // with `external`: the MPI rank it reaches, for errors and duplicates
};

// A started child whose handler granted at least `requested` sets (R68):
// fewer fails, and the child is closed. `what` names it in errors. A
// next-level child is asked for the pipeline_depth, so one reporting 0 is
// refused too; a sub worker holds no sets and is asked for 0.
Result<std::unique_ptr<ForkedChild>> require_grant(Result<std::unique_ptr<ForkedChild>> started, uint64_t requested,
                                                   const std::string& what);

class NodeWorker {
 public:
  // Validates the spec (naming the field, and the next-level worker it is
  // in) before anything is mapped or forked.
  static Status validate(const NodeSpec& spec);
  static Result<std::unique_ptr<NodeWorker>> create(NodeSpec spec);
  ~NodeWorker();

  // Level::Node only: a network's next-level workers have no device memory
  // addressable from it.
  Result<DeviceBuffer> malloc_on(uint32_t worker, uint64_t bytes);
  Result<DeviceBuffer> malloc_shared(uint64_t bytes);
  Status free(DeviceBuffer buffer);
  Status copy_to(DeviceBuffer dst, const void* src, uint64_t bytes, uint64_t dst_offset);
  Status copy_from(void* dst, DeviceBuffer src, uint64_t bytes, uint64_t src_offset);
  // Device memory of next-level worker `worker` (a chip, or the sum over a
  // node's chips), through its control frame, exactly (R72). A worker whose
  // child died answers through its replacement; one failed for good is
  // refused (ABORTED), naming it.
  Result<MemoryInfo> memory_info_on(uint32_t worker);
  // The sum over every next-level worker (0 / 0 for none); an overflowing
  // sum is refused, never wrapped. With a worker failed for good there is no
  // such sum: ABORTED, naming each failed worker and giving the living ones'
  // sum (memory_info_on reads each living one).
  Result<MemoryInfo> memory_info();

  // A run's diagnostics: `call` as the public API takes it (checked, its
  // directory created, before anything of the run exists), and the name of
  // this process in the run's trace when it is a network's node child
  // (node<i>; its chips then appear as node<i>/chip<j>), empty otherwise.
  struct RunDiagnostics {
    CallConfig call;
    std::string trace_label;
  };
  // `on_terminal`, if set, is called once with the run's result on the
  // thread that completes it (this one, for a refusal).
  RunHandle submit(const std::function<Status(Orchestrator&)>& orchestration,
                   std::function<void(const Status&)> on_terminal = {}, const RunDiagnostics& diagnostics = {});
  // As submit, but never waits for admission: nullopt (nothing created,
  // nothing called) while pipeline_depth runs are admitted.
  std::optional<RunHandle> try_submit(const std::function<Status(Orchestrator&)>& orchestration,
                                      std::function<void(const Status&)> on_terminal = {},
                                      const RunDiagnostics& diagnostics = {});
  // Whether the calling thread is inside one of this worker's orchestrations
  // (they run in submit, on the submitting thread). Any thread.
  bool running_its_user_code() const { return UserCodeMark::running_for(this); }
  // Drains every admitted run (past `drain` each held run is failed), stops
  // the scheduler and closes every child. After it, no run is live.
  Status close(std::chrono::milliseconds drain);
  // A thread that polls anyway stands in for the node's scheduler thread
  // (Scheduler::drive / release_driver): one driving thread, before close().
  bool drive_scheduler() { return scheduler_->drive(); }
  void release_scheduler() { scheduler_->release_driver(); }

  // Introspection for tests and the observer.
  uint32_t admitted_runs() const;
  // The node scheduler's run-resource sets (R41): free, live, quarantined.
  ArenaCounts run_set_counts() const;
  size_t next_level_workers() const { return next_.size(); }
  size_t sub_workers() const { return subs_.size(); }
  // A forked next-level worker (not an external one: is_external(i)).
  ForkedChild& next_child(size_t i) { return *next_[i]; }
  bool is_external(size_t i) const { return external_[i] != nullptr; }
  ForkedChild& sub_child(size_t i) { return *subs_[i]; }
  SharedHeap& heap() { return *heap_; }

 private:
  friend class NodeOrchestrator;
  struct DeviceAlloc {
    uint32_t worker;
    uint64_t child_addr;
    uint64_t bytes;
    uint64_t registration;  // the child it lives in (ForkedChild::incarnation)
  };

  explicit NodeWorker(NodeSpec spec);
  Status spawn_children();
  // Builds every external next-level worker; after spawn_children, before any thread.
  Status start_external();
  // What a next-level worker is called in errors ("chip worker", "node worker").
  const char* next_kind() const { return spec_.level == Level::Network ? "node worker" : "chip worker"; }
  // Own heap first, then the inherited ones.
  HostRanges shared_ranges() const;
  enum class Admission { kAdmitted, kFull, kClosing };
  Admission try_admit();
  bool begin_run();  // false when closing
  // A run and its handle, which takes `on_terminal`; under host memory
  // exhaustion RESOURCE_EXHAUSTED, and `on_terminal` is still the caller's.
  Result<std::unique_ptr<NodeRun>> new_run(std::function<void(const Status&)>& on_terminal,
                                           const RunDiagnostics& diagnostics);
  // INVALID_ARGUMENT naming the field.
  Status check_diagnostics(const CallConfig& call) const;
  // Per (next-level worker, task): why that remote node's files for the task
  // were refused (the fragment and dump they held are missing).
  using RefusedFiles = std::map<std::pair<uint32_t, uint32_t>, std::string>;
  // Takes the remote nodes' notes on the run's files (scheduler thread, at
  // retire; each note can be taken once).
  RefusedFiles take_refused_files(const NodeRun& run) const;
  // A traced run's trace.json: this process's host lanes and every next-level
  // child's fragment (scheduler thread, at retire, before the handle completes).
  Status export_trace(const NodeRun& run, const RefusedFiles& refused) const;
  std::string task_name(const NodeTask& t) const;
  // A refused submission: `on_terminal` is called with `why`, the handle is done.
  static RunHandle refused(const Status& why, const std::function<void(const Status&)>& on_terminal);
  // Counts the run's borrows and hands it to the scheduler; under host memory
  // exhaustion undoes the counts and leaves `run` with the caller.
  Status schedule(std::unique_ptr<NodeRun>& run);
  // Builds an admitted run on this thread and hands it to the scheduler.
  void build_and_schedule(std::unique_ptr<NodeRun> run, const std::function<Status(Orchestrator&)>& orchestration);
  void end_run();
  void on_retire(NodeRun& run);
  // OK unless next-level worker `worker` failed for good; then why, naming it.
  Status check_alive(uint32_t worker) const;
  // A device argument bound for chip `worker`, or why not (a lost buffer among them).
  Result<DeviceAlloc> device_arg(const DeviceBuffer& b, uint32_t worker) const;
  Result<DeviceAlloc> device_alloc(uint64_t node_addr, const char* what) const;
  // Whether `a`'s chip died (and was replaced) since `a` was allocated.
  bool is_lost(const DeviceAlloc& a) const;
  Status lost(const char* what, uint64_t node_addr, const DeviceAlloc& a) const;
  // Runs a control command on device buffer `a`; a buffer whose chip died
  // before or under it is reported lost, naming the buffer and the chip.
  Status on_device_buffer(const char* what, uint64_t node_addr, const DeviceAlloc& a,
                          const std::function<Status(MailboxEndpoint&)>& command);
  // Runs a control command that may be repeated on next-level worker
  // `worker`; when the child dies under it, once more on its replacement.
  template <typename T>
  Result<T> ask_living(uint32_t worker, const std::function<Result<T>(MailboxEndpoint&)>& command);
  MailboxEndpoint& endpoint_of(uint32_t worker) { return next_[worker]->endpoint(); }

  const NodeSpec spec_;
  const WorkerConfig& config_ = spec_.config;
  std::vector<Digest> next_digests_;  // by callable id: what a next-level task may run
  std::vector<Digest> sub_digests_;   // by function id, hashed once: a submit_sub checks against it
  std::unique_ptr<SharedHeap> heap_;
  std::unique_ptr<ForkServer> server_;                     // forks every child; outlives them
  std::vector<std::unique_ptr<ForkedChild>> next_;         // null where external_ is set
  std::vector<std::unique_ptr<ExternalWorker>> external_;  // by next-level index; null for a forked one
  std::vector<std::unique_ptr<ForkedChild>> subs_;
  std::vector<std::unique_ptr<MailboxPort>> ports_;
  std::unique_ptr<Scheduler> scheduler_;
  std::shared_ptr<detail::RunDriver> waiter_driver_;  // the scheduler's; set once, before any submit

  mutable std::mutex mem_mu_;
  std::map<uint64_t, DeviceAlloc> device_allocs_;  // by node address
  std::map<uint64_t, uint64_t> shared_allocs_;     // caller-owned heap blocks: addr -> bytes
  std::map<uint64_t, uint32_t> borrows_;           // node address -> live runs using it

  mutable std::mutex admit_mu_;
  uint32_t admitted_ = 0;  // runs in the FIFO: admitted, not yet terminal
  bool closing_ = false;
  Doorbell admit_bell_;
  std::atomic<uint64_t> next_run_id_{1};
  std::atomic<uint64_t> next_task_id_{1};
};

}  // namespace simpler
