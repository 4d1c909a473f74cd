// ChipChildHandler: the RunHandler of a chip child. It builds a ChipWorker in
// the child (after fork, in init()) and drives each request through the native
// lifecycle on three threads of its own: a preparer (a SerialRunQueue: takes a
// set, records it in the entry, stages shared-heap tensors onto the device,
// prepares), a launcher (launches in order within launch_depth, acceptance at
// the launch marker) and a completer (finalize, copy-back, terminal). A staged
// run waits, prepared, between the preparer and the launcher for activate(). A
// run whose callable prepares quickly (InlineBudget) is prepared on the serve
// loop instead, and a preparer that finds the launcher idle and a launch slot
// free launches its run itself, and the serve loop, which the device rings
// when a run ends, finalizes a light run that ended (poll) in the completer's
// place: each spares a hand-off to a parked thread. The serve loop calls
// start/try_run_inline/activate/control/drain/poll; the device calls are made
// by the three threads and by the serve loop. A sticky device fault ends every
// run on the device DEVICE_FAULT and refuses later ones (ChipWorker::health);
// once every started run has its terminal the child exits
// (kChildExitDeviceFault), as only a new process resets the device, and the
// parent replaces it.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "base/doorbell.h"
#include "base/host_range.h"
#include "chip/chip_worker.h"
#include "ipc/mailbox_child.h"
#include "ipc/serial_run_queue.h"

namespace simpler {

class ChipChildHandler final : public RunHandler {
 public:
  // A callable's runs are prepared on the serve loop once one took at most
  // `inline_budget_ns` (a test widens it to make the path certain).
  ChipChildHandler(WorkerConfig config, std::vector<ChipCallable> callables, HostRanges shared = {},
                   uint64_t inline_budget_ns = kInlineRunBudgetNs);
  ~ChipChildHandler() override;

  Status init() override;
  uint64_t granted_sets() const override { return worker_ != nullptr ? worker_->grant() : 0; }
  void start(RunRequest request, RunTicket ticket) override;
  // Prepares (and launches) on the serve loop when nothing is queued or being
  // prepared, the callable's recent preparations were within the inline
  // budget (InlineBudget), the run is not diagnostic and a set is free now,
  // whether or not another frame waits: it never waits for the run, and a
  // frame that waits a preparation long is still served sooner than by a
  // wake of the preparer.
  bool try_run_inline(const RunRequest& request, const RunTicket& ticket, bool loop_quiet) override;
  // A staged request is prepared natively (set, device buffers, graph) and
  // held; its shared-heap inputs are copied in only at activation, after
  // its predecessors wrote them.
  bool stages_natively() const override { return true; }
  void activate(uint32_t entry_index, uint64_t generation, bool launch) override;
  Result<ControlReply> control(const ControlCommand& cmd, uint8_t* data, uint32_t in_bytes, uint32_t capacity) override;
  void drain(uint64_t deadline_ns) override;
  // The serve loop is the completer of every light run (Prepared::light),
  // spinning or parked: the device rings the loop's bell when a run ends, and
  // poll() finalizes one that ended and stores its terminal, so the run's
  // end reaches the parent without waking the completer's thread. Without a
  // loop bell every run is the completer's.
  bool attach_loop_bell(Doorbell& bell) override;
  bool poll() override;

  // Runs prepared on the serve loop, and runs their preparer launched
  // itself: what a test of those paths counts. Any thread.
  uint64_t prepared_inline() const { return prepared_inline_.load(std::memory_order_relaxed); }
  uint64_t launched_by_preparer() const { return launched_by_preparer_.load(std::memory_order_relaxed); }
  uint64_t finalized_on_loop() const { return finalized_on_loop_.load(std::memory_order_relaxed); }
  uint64_t loop_polls() const { return loop_polls_.load(std::memory_order_relaxed); }
  bool draining() const { return draining_.load(std::memory_order_acquire); }
  // Every run reached its terminal and the preparer's thread left its call:
  // the next short run is prepared on the loop. A run that ends before its
  // preparer's call returns would otherwise send the next run to that
  // thread's queue, and so on. Any thread.
  bool quiet() { return preparer_.quiet(); }

  // A run is light when it is not diagnostic (whose finalize writes its
  // files) and its staged tensors hold at most this many bytes (whose copy
  // back would hold up the serve loop's frames).
  static constexpr uint64_t kLightStagedBytes = 64 * 1024;

 private:
  // A shared-heap tensor's stand-in on the device for one run.
  struct Staged {
    DeviceBuffer device;
    uint64_t host_addr = 0;
    // The views the run passes, and those it writes, in host terms: only
    // their elements come in and go back. The bytes between them may belong
    // to a run beside this one, which writes them meanwhile.
    std::vector<TensorView> views;
    std::vector<TensorView> writes;
  };
  struct Prepared {
    void* storage;
    uint64_t epoch;
    RunTicket ticket;
    std::vector<Staged> staged;
    bool copy_in_pending = false;  // a staged run: inputs are copied at launch
    bool light = false;            // the serve loop may finalize it (kLightStagedBytes)
  };
  // A staged request from start() until it is launched or has ended.
  struct StagedRun {
    uint64_t generation = 0;
    std::optional<Prepared> prepared;
    int activation = -1;  // -1: none yet; 0: cancel; 1: launch
  };
  struct StorageDeleter {
    void operator()(unsigned char* p) const;
  };

  // The run's diagnostics from the request's config bytes (bounded,
  // validating: they crossed the mailbox), its directory the chip's part of
  // the node run's.
  static Result<RunConfig> diagnostics_of(const RunRequest& req);
  // One request, from the queue's thread (`wait`) or inline on the serve
  // loop. False only without `wait`, when the run is diagnostic or no set is
  // free now: nothing was done and the ticket is untouched.
  bool prepare(const RunRequest& req, const RunTicket& ticket, bool wait);
  // Launches a run taken off to_launch_ (or by its preparer) with launching_
  // set and a launch slot counted, then clears launching_.
  void launch(Prepared run);
  void launcher_main();
  void completer_main();
  // Whether the completer takes `run`: a heavy one, or any once the loop no
  // longer serves (or never had a bell). mu_ held.
  bool for_completer(const Prepared& run) const { return !run.light || !loop_serves_; }
  // Finalizes a run that left to_finalize_, stages its outputs back and
  // stores its terminal: on the completer, or on the serve loop (poll).
  void finish(Prepared run);
  // Fails the run and reports its terminal to the preparer's queue; every set
  // and staged buffer is already returned.
  void fail(const RunTicket& ticket, const Status& st, MailboxDisposition d);
  // Gives every shared-heap tensor a device stand-in and rebinds the args to it.
  Status map_in(TaskArgs& args, std::vector<Staged>& staged);
  Status copy_in(const std::vector<Staged>& staged);
  // Ends a prepared, never-launched run with `why`; mu_ not held.
  void cancel(Prepared& run, const Status& why);
  Status stage_out(const std::vector<Staged>& staged);
  void unstage(std::vector<Staged>& staged);
  Result<uint32_t> callable_for(const Digest& digest) const;
  Result<DeviceBuffer> buffer_at(uint64_t addr) const;
  // After a terminal: exits the process when the device is faulted and no
  // started run is left without its terminal.
  void exit_if_faulted();

  const WorkerConfig config_;
  std::vector<ChipCallable> callables_;
  const HostRanges heap_;
  std::unique_ptr<ChipWorker> worker_;
  std::vector<std::unique_ptr<unsigned char, StorageDeleter>> storage_;  // by set slot
  std::map<uint64_t, DeviceBuffer> buffers_;                             // control-frame allocations
  // Counts stage-outs. A run that reads bytes an earlier run wrote comes only
  // after the earlier one's terminal, which follows its stage-out: the parent
  // orders them, through its own process, where neither this process's memory
  // model nor ThreadSanitizer can follow. Each copy-in acquires this counter,
  // so the same order holds here too.
  std::atomic<uint64_t> staged_out_{0};

  std::mutex mu_;
  std::deque<Prepared> to_launch_;
  std::deque<Prepared> to_finalize_;
  std::map<uint32_t, StagedRun> staged_;  // by entry index
  // Accepted runs whose terminal is not yet stored: an entry reads LAUNCHED
  // until its terminal, so this (not the device's own count) bounds what an
  // observer of the entries can see launched at once.
  uint32_t launched_ = 0;
  uint32_t launch_depth_ = 0;
  // A run is being launched: nothing else launches meanwhile, so runs reach
  // the device in the order they were prepared.
  bool launching_ = false;
  bool stopping_ = false;          // the launcher and completer end once nothing is left for them
  Doorbell* loop_bell_ = nullptr;  // set before init
  // The serve loop finalizes light runs: from attach_loop_bell until drain,
  // which the loop calls once it has stopped looking.
  bool loop_serves_ = false;
  std::atomic<bool> draining_{false};
  // Light runs in to_finalize_: a poll finding none takes no lock.
  std::atomic<uint32_t> light_to_finalize_{0};
  std::atomic<uint64_t> finalized_on_loop_{0};
  std::atomic<uint64_t> loop_polls_{0};  // written by the serve loop only
  InlineBudget budget_;                  // per callable: its recent preparations
  std::atomic<uint64_t> prepared_inline_{0};
  std::atomic<uint64_t> launched_by_preparer_{0};
  Doorbell set_bell_;       // a set was freed
  Doorbell launch_bell_;    // work for the launcher, a launch slot freed, or stopping
  Doorbell finalize_bell_;  // work for the completer, or stopping
  std::thread launcher_;
  std::thread completer_;
  // Every started run until its terminal: what drain() waits for. Last, so
  // it is destroyed first, before anything its thread uses.
  SerialRunQueue preparer_;
};

}  // namespace simpler
