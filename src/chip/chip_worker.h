// ChipWorker: one chip (L2): the device of WorkerConfig::backend and the
// runtime of WorkerConfig::runtime, both found in their registries and seen
// only through their interfaces. It owns the device, its runner (the HostApi
// backend), the runtime, the run-resource arena and every per-set owner, all
// exactly as wide as the grant (pipeline_depth), and the native-run
// lifecycle: prepare -> launch -> poll / wait -> finalize. Worker::submit is
// prepare + launch with finalize on completion.
//
// Threads: one controlling thread calls everything except the phase calls;
// phase calls come from any thread and may race on one run (R49): each holds
// the run for its whole call, finalize waits for the others to leave, and of
// a launch and a finalize (or two finalizes) racing, the loser is refused; the
// completion path runs on AICPU threads and touches only the run table, the
// launch queue and each run's terminal fields. A watchdog thread of its own
// (with run_timeout) ends submitted runs that outlive their deadline.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/doorbell.h"
#include "chip/execution_context.h"
#include "chip/native_run.h"
#include "chip/run_resource_arena.h"
#include "chip/run_state.h"
#include "device/device.h"
#include "diag/background_writer.h"
#include "diag/chrome_trace.h"
#include "diag/terminal_banks.h"
#include "runtime/runtime.h"
#include "simpler/worker_config.h"

namespace simpler {

class ChipWorker {
 public:
  static Result<std::unique_ptr<ChipWorker>> create(const WorkerConfig& config, std::vector<ChipCallable> callables);
  // R91: UNIMPLEMENTED, naming call.dump_args and the runtimes that capture,
  // when `dump` asks for an argument dump that `runtime` cannot capture.
  // Checked before anything is created (a trace directory included).
  static Status check_dump_supported(DumpArgs dump, const std::string& runtime);
  ~ChipWorker();

  Result<DeviceBuffer> malloc(uint64_t bytes);
  Status free(DeviceBuffer buffer);
  Status copy_to(DeviceBuffer dst, const void* src, uint64_t bytes, uint64_t dst_offset);
  Status copy_from(void* dst, DeviceBuffer src, uint64_t bytes, uint64_t src_offset);
  MemoryInfo memory_info() const;

  // --- run-resource sets -------------------------------------------------
  std::optional<Lease> try_acquire_lease() { return arena_->try_acquire(); }
  bool release_lease(const Lease& lease);
  bool quarantine_lease(const Lease& lease) { return arena_->quarantine(lease); }
  ArenaCounts set_counts() const { return arena_->counts(); }
  uint32_t grant() const { return grant_.load(std::memory_order_acquire); }
  uint32_t launch_depth() const { return launch_depth_; }
  // Width of every per-set owner, by name (R20): each equals the grant.
  std::vector<std::pair<std::string, uint32_t>> owner_widths() const;
  // Two-phase regrant: refused while any set is live or quarantined or any run
  // is registered; builds every owner off to the side; a std::bad_alloc during
  // the build leaves the old grant whole; the commit cannot fail.
  Status set_run_resource_grant(uint32_t grant);

  // --- native lifecycle ---------------------------------------------------
  // Validates and binds without launching: checks the storage, the lease
  // (generation, once), the bank and the arguments, builds the graph. Returns
  // the run's epoch, its identity for every later phase call.
  Result<uint64_t> prepare(void* storage, size_t storage_bytes, const NativeRunDescriptor& desc, uint32_t callable,
                           const TaskArgs& args, RunConfig config = {});
  // Returns once the run passed the launch marker (parking, without CPU, while
  // launch_depth runs are already launched).
  Status launch(void* storage, uint64_t epoch);
  // Never blocks.
  Result<PollState> poll(void* storage, uint64_t epoch);
  // Also rung (on the device thread that ends it) after each run a caller
  // finalizes is done, besides its set's bell: one thread may then park on
  // it for any of its runs (a chip child's serve loop). Set before the first
  // launch; the bell must outlive this worker's runs.
  void set_done_bell(Doorbell* bell) { done_bell_ = bell; }
  // Waits for the terminal and returns it; releases nothing. deadline_ns is an
  // absolute now_ns() time, 0 for none.
  Status wait(void* storage, uint64_t epoch, uint64_t deadline_ns = 0);
  // Waits, copies back, releases the set and empties the storage; aborts a
  // prepared run that was never launched. Returns the run's terminal.
  Status finalize(void* storage, uint64_t epoch);

  // --- asynchronous runs (Worker::submit) ----------------------------------
  RunHandle submit(uint32_t callable, const TaskArgs& args);
  // With this run's diagnostics instead of WorkerConfig::call; a swimlane
  // or an argument dump makes it a diagnostic run (RunConfig::diagnostic).
  RunHandle submit(uint32_t callable, const TaskArgs& args, const CallConfig& call);
  // With WorkerConfig::call, and `diagnostic` as RunConfig::diagnostic.
  RunHandle submit(uint32_t callable, const TaskArgs& args, bool diagnostic);

  // --- terminal diagnostics (R55-R66) ----------------------------------------
  // The chip context's terminal banks: a diagnostic run takes one when it is
  // launched; a run that finds none stays queued, not on the device, until
  // one comes back, in launch order (R65). Non-diagnostic runs never touch it.
  TerminalBankTable& terminal_banks() { return banks_; }
  // The terminal snapshot of a closed diagnostic run, by its epoch (a
  // RunHandle's run_id()); any thread.
  Result<TerminalSnapshot> terminal_snapshot(uint64_t epoch) const { return banks_.artifact(epoch); }
  // Diagnostic runs queued for launch, in launch order, none on the device yet.
  std::vector<uint64_t> waiting_for_bank() const;
  // Every run queued for launch (launch_depth, a bank, its caller stream), in launch order.
  std::vector<uint64_t> queued_launches() const;
  // A recorder adding its terminal data to every diagnostic run's snapshot;
  // controlling thread, before the first run; `c` outlives the worker.
  void add_terminal_contributor(TerminalContributor* c) { contributors_.push_back(c); }

  // Drains launched and queued runs (up to `drain_timeout`), then stops the
  // device. If runs are still on the device then (or the chip is wedged),
  // every submitted run still without a terminal gets one (DEADLINE_EXCEEDED
  // if launched, ABORTED if queued), and the device, the runtime and every
  // run storage are abandoned (leaked on purpose, never freed under a device
  // that may still write them); DEADLINE_EXCEEDED is returned.
  Status close(std::chrono::milliseconds drain_timeout);
  // Set once a submitted run outlived run_timeout: its kernel does not
  // return, and a kernel thread cannot be stopped. Later submits are refused.
  bool wedged() const { return wedged_.load(std::memory_order_acquire); }
  // OK while the chip takes work; else why not, and for good: the device's
  // sticky fault (DEVICE_FAULT; every run that ends after it ends with it,
  // and submit, prepare, malloc and the copies are refused naming it until
  // the Worker is closed and created again), or the wedge. Any thread.
  Status health() const;

  // Whether the calling thread runs this chip's user code: its host-side
  // orchestration (inside prepare) or any device thread (kernels, a
  // device-side orchestration). Any thread.
  bool running_its_user_code() const;

  ExecutionContext& execution_context() { return context_; }
  DeviceRunner& runner() { return *runner_; }
  const ChipRuntime& runtime() const { return *runtime_; }
  uint32_t launched_now() const;
  uint32_t launched_peak() const;
  size_t registered_runs() const;
  size_t run_table_buckets() const;
  void* native_storage_for_test(uint32_t slot) { return storage_[slot].get(); }

  // What the runtime's done callback reaches instead of the worker: it
  // forwards each completion until an abandoning close() shuts it, and is
  // abandoned with the runtime, so a kernel that ends after the owner
  // destroyed the worker touches only this gate, which is kept alive.
  class CompletionGate {
   public:
    explicit CompletionGate(ChipWorker* worker) : worker_(worker) {}
    void deliver(uint32_t slot, RunOutcome outcome);
    // Once this returns, no completion is inside the worker and none enters it.
    void shut();
    // Completions that arrived after shut() and were dropped.
    uint64_t dropped() const { return dropped_.load(std::memory_order_acquire); }
    Doorbell& dropped_bell() { return dropped_bell_; }

   private:
    ChipWorker* const worker_;
    std::atomic<uint32_t> inside_{0};
    std::atomic<bool> shut_{false};
    std::atomic<uint64_t> dropped_{0};
    Doorbell left_bell_;
    Doorbell dropped_bell_;
  };
  // Stays valid after an abandoning close() and the worker's destruction.
  CompletionGate* completion_gate_for_test() { return gate_.get(); }

 private:
  RunHandle submit(uint32_t callable, const TaskArgs& args, const CallConfig& call, bool diagnostic);
  struct alignas(NativeRunContext) StorageBlock {
    unsigned char bytes[sizeof(NativeRunContext)];
  };
  struct alignas(64) PaddedBell {
    Doorbell bell;
  };
  // A launched submitted run as the watchdog and close() see it. Whoever moves
  // `deadline` from the run's value to kClaiming (the watchdog, close()), or
  // to kUnwatched (on_run_done), delivers the run's terminal; the others keep
  // their hands off. A claimer reads the fields while kClaiming, and
  // on_run_done waits out kClaiming, so the set cannot be reused under it.
  struct alignas(64) WatchedRun {
    static constexpr uint64_t kUnwatched = 0;
    static constexpr uint64_t kNoDeadline = UINT64_MAX - 2;
    static constexpr uint64_t kClaiming = UINT64_MAX - 1;
    static constexpr uint64_t kClaimed = UINT64_MAX;
    std::atomic<uint64_t> deadline{kUnwatched};
    std::shared_ptr<detail::RunState> handle;  // set before deadline is published
    Lease lease;
    uint64_t epoch = 0;
    bool diagnostic = false;
  };

  // A phase call's hold on a live run: counted in the run's users_ for the
  // whole call, so finalize cannot destroy the context under it.
  class RunRef {
   public:
    RunRef(ChipWorker* w, NativeRunContext* ctx) : w_(w), ctx_(ctx) {}
    RunRef(RunRef&& o) noexcept : w_(o.w_), ctx_(std::exchange(o.ctx_, nullptr)) {}
    RunRef(const RunRef&) = delete;
    RunRef& operator=(const RunRef&) = delete;
    RunRef& operator=(RunRef&&) = delete;
    ~RunRef();
    NativeRunContext* operator->() const { return ctx_; }
    NativeRunContext* get() const { return ctx_; }
    // Hands the hold to retire(), which counts it and then destroys the context.
    void disown() { ctx_ = nullptr; }

   private:
    ChipWorker* w_;
    NativeRunContext* ctx_;
  };

  ChipWorker(const WorkerConfig& config, std::vector<ChipCallable> callables);
  // Who prepares: a native run's caller, whose later phase calls find the run
  // by its epoch, or submit(), which checked the arguments and the call
  // config before it waited for a set, and drives the run itself.
  enum class Preparer { kNativeRun, kSubmit };
  Result<uint64_t> prepare_as(Preparer by, void* storage, size_t storage_bytes, const NativeRunDescriptor& desc,
                              uint32_t callable, const TaskArgs& args, RunConfig config);
  Result<uint64_t> prepare_unchecked(Preparer by, void* storage, size_t storage_bytes, const NativeRunDescriptor& desc,
                                     uint32_t callable, const TaskArgs& args, RunConfig config);
  // OK, or `call`'s refusal naming what health() reports.
  Status refuse_unhealthy(const char* call) const;
  // The same for a device fault only: a wedged chip still serves memory calls.
  Status refuse_if_faulted(const char* call) const;
  Status check_signature(const ChipCallable& c, const TaskArgs& args) const;
  // RESOURCE_EXHAUSTED (naming pipeline_depth) when g graph arenas do not fit
  // device memory, the product checked in 64 bits.
  Status check_graph_arenas(uint32_t g) const;
  Status check_buffer(const DeviceBuffer& b, uint64_t offset, uint64_t bytes, const char* what) const;
  // A run's argument tensors stay pinned from prepare until it retires (R52):
  // free() of one of them is refused meanwhile (issue 9 item 1).
  Status pin_arguments(NativeRunContext& ctx);
  void unpin_arguments(NativeRunContext& ctx);
  Result<RunRef> lookup(void* storage, uint64_t epoch, const char* call);
  Result<Lease> acquire_set();
  void enqueue_launch(NativeRunContext* ctx);
  // Under launch_mu_: whether `ctx` may go on the device now as far as
  // terminal banks go (a diagnostic run takes its bank here).
  bool take_bank(NativeRunContext* ctx);
  // Under launch_mu_: no run launched before `ctx` on its caller stream is
  // still queued or on the device (R53).
  bool stream_clear(const NativeRunContext* ctx) const;
  // Launches queued runs, in order, while launch_depth and the banks allow;
  // a run held back by its caller stream is passed by.
  void launch_queued();
  void do_launch(NativeRunContext* ctx);
  // The launch was unwound before the device took the run (a refused arm,
  // a refused execution context): its bank comes back, a submitted run ends
  // with `why`, a native one is Prepared again and launch() returns `why`.
  void not_started(NativeRunContext* ctx, Status why);
  // The completion path's terminal diagnostics: fills the run's snapshot and
  // settles its bank.
  void close_terminal(NativeRunContext* ctx, const RunOutcome& out);
  void on_run_done(uint32_t slot, RunOutcome outcome);
  // What a retiring run leaves to write: its argument dump's manifest and its
  // trace.json, taken out of the context so they can outlive it.
  struct DiagOutput {
    std::unique_ptr<ArgsDumpCollector> dump;
    bool producers_stopped = false;  // the run ended on the device
    diag::LaneWindow trace_window;   // pairs with the recorder's begin_run (id 0: none)
    std::unique_ptr<diag::Lane> trace_lane;
    diag::ChipRunTrace trace;  // run 0: nothing to export
    std::string trace_dir;
    bool empty() const { return dump == nullptr && trace_window.id == 0; }
  };
  DiagOutput take_diag_output(NativeRunContext& ctx);
  // Writes `out` (manifest, trace.json), ends the run's recording and keeps
  // its lane for a later run; an OK `result` becomes the first write error.
  Status finish_diag_output(DiagOutput out, Status result);
  // A lane for a traced run's edges and submits: a spare one, else a new one.
  Result<std::unique_ptr<diag::Lane>> take_trace_lane();
  // A dumping run's collector and capture table, or why it cannot dump.
  Status start_dump(NativeRunContext& ctx);
  void watchdog_main();
  // What a claim took over: the run's handle (null: no claim), set and epoch.
  struct Claim {
    std::shared_ptr<detail::RunState> handle;
    Lease lease;
    uint64_t epoch = 0;
    bool diagnostic = false;
  };
  // Takes the right to deliver the terminal of the submitted run launched on
  // `slot`, if its deadline still reads `expected` (0: any run there).
  Claim claim_terminal(uint32_t slot, uint64_t expected);
  void stop_watchdog();
  // Discards a prepared run that never launched and retires it as aborted.
  Status abort_prepared(NativeRunContext* ctx, uint32_t own_holds);
  // Unregisters, waits until only `own_holds` phase calls are inside, then
  // destroys the context and releases its set.
  Status retire(NativeRunContext* ctx, Status result, uint32_t own_holds);

  const WorkerConfig config_;
  const std::vector<ChipCallable> callables_;
  uint32_t launch_depth_;  // written under launch_mu_ (a regrant), read under it by the launch path
  ExecutionContext context_;
  std::unique_ptr<CompletionGate> gate_;  // outlives the runtime that calls it
  std::unique_ptr<Device> device_;
  std::unique_ptr<DeviceRunner> runner_;
  std::unique_ptr<ChipRuntime> runtime_;
  bool runtime_captures_args_ = false;  // RuntimeInfo::captures_args
  std::unique_ptr<RunResourceArena> arena_;
  std::atomic<uint32_t> grant_{0};
  TerminalBankTable banks_;
  std::vector<TerminalContributor*> contributors_;

  // Per-set owners, each exactly grant() wide.
  GenerationFilter filter_;                             // the newest generation admitted per slot
  std::vector<uint64_t> bank_epoch_;                    // which run holds each arena bank
  std::vector<std::unique_ptr<StorageBlock>> storage_;  // native-run storage of submitted runs
  std::vector<NativeRunContext*> running_;              // launched run per set
  std::unique_ptr<PaddedBell[]> set_bells_;             // launch signal and terminal, per set
  std::unique_ptr<WatchedRun[]> watched_;               // launched submitted run, per set

  mutable std::mutex runs_mu_;
  std::unordered_map<uint64_t, NativeRunContext*> runs_;  // by epoch; contexts live in caller storage

  mutable std::mutex launch_mu_;
  std::deque<NativeRunContext*> launch_queue_;
  uint32_t launched_ = 0;
  uint32_t launched_peak_ = 0;
  // R53, a per-set owner grant() wide under launch_mu_: the caller stream of
  // the run launched from each set and its launch order, from launch() until
  // it leaves the device; stream 0 while none.
  struct CallerOrder {
    uint64_t stream = 0;
    uint64_t seq = 0;
  };
  std::vector<CallerOrder> caller_orders_;
  uint64_t launch_seq_ = 0;

  // Phase calls (~RunRef) and completions (on_run_done) that let go of a run
  // and then ring its set's bell: once they let go, finalize may retire the
  // run and a regrant may free the bells, so a regrant waits them out first.
  std::atomic<uint32_t> leaving_{0};
  Doorbell left_bell_;
  Doorbell admission_bell_;             // rung when a set is released, a run drains, or the worker closes
  Doorbell* done_bell_ = nullptr;       // set_done_bell
  std::atomic<uint32_t> in_flight_{0};  // runs queued for launch or launched
  std::atomic<bool> closing_{false};

  std::mutex watch_mu_;  // the watchdog's scan against a regrant swapping watched_
  Doorbell watchdog_bell_;
  std::atomic<bool> watchdog_stop_{false};
  std::thread watchdog_;
  std::atomic<bool> wedged_{false};
  mutable std::mutex wedged_mu_;
  Status wedged_why_;  // the first run that outlived run_timeout

  // Diagnostic output of runs retired on a device thread; stopped by close().
  diag::BackgroundWriter diag_writer_;
  // Per trace_dir, the traced runs whose trace.json is queued on the writer.
  std::mutex pending_exports_mu_;
  std::unordered_map<std::string, uint32_t> pending_exports_;
  // The writer thread's: runs whose trace.json a queued later one replaces,
  // completed right after that one is written.
  struct Superseded {
    std::shared_ptr<detail::RunState> handle;
    Status result;
    RunStats stats;
  };
  std::vector<Superseded> superseded_;
  // Orchestrator lanes of finished traced runs, reused rather than allocated per run.
  std::mutex spare_lanes_mu_;
  std::vector<std::unique_ptr<diag::Lane>> spare_trace_lanes_;
};

}  // namespace simpler
