// The child side of one mailbox: the serve loop that takes requests off the
// request frames, hands them to a RunHandler and publishes each run's progress
// into its entry. A request published PREPARE_READY (staged) is held until
// the parent writes ACTIVATE or CANCEL into its entry. serve() runs on one thread (the forked child's main thread,
// or a test thread); RunTickets complete from any thread. The MailboxChild
// must outlive every ticket its handler still holds.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/doorbell.h"
#include "ipc/mailbox_layout.h"
#include "ipc/store_primitive.h"
#include "ipc/test_hooks.h"
#include "simpler/callable.h"

namespace simpler {

// One request, copied out of its frame: the child owns these bytes.
struct RunRequest {
  uint32_t entry_index = 0;
  uint64_t entry_generation = 0;
  uint64_t publication = 0;
  uint64_t run_id = 0;
  uint64_t dispatch_id = 0;
  uint32_t task_slot = 0;
  uint64_t run_epoch = 0;  // child-unique, minted at staging
  // Published PREPARE_READY: prepare it, but launch only on activate().
  bool staged = false;
  Digest callable{};
  std::vector<uint8_t> config;
  std::vector<uint8_t> args_blob;  // untrusted: decode with decode_args_blob
};

class MailboxChild;

// A handler's hold on the entry one run occupies. Copyable; any thread.
class RunTicket {
 public:
  // At the real launch marker; sticky, at most once, before complete().
  void accepted() const;
  // The run's terminal: rc, text, disposition, then the terminal state as the
  // last store to the entry. Later calls, and calls after the child stopped
  // or swept, store nothing.
  void complete(const Status& result, MailboxDisposition disposition = kDispositionNone) const;
  // The run took run-resource set `slot`: recorded in the entry, so held-set
  // evidence reads it (R76). Before complete(); stores nothing after it.
  void hold_set(uint32_t slot) const;
  uint32_t entry_index() const { return entry_; }
  uint64_t generation() const { return generation_; }

 private:
  friend class MailboxChild;
  RunTicket(MailboxChild* child, uint32_t entry, uint64_t generation)
      : child_(child), entry_(entry), generation_(generation) {}
  MailboxChild* child_;
  uint32_t entry_;
  uint64_t generation_;
};

// How long a handler's last run of the same kind may have taken for it to
// take the next on the serve-loop thread (RunHandler::try_run_inline): a
// frame the parent publishes meanwhile, a command or shutdown then waits no
// longer than a few futex wakes of a parked thread would take anyway.
inline constexpr uint64_t kInlineRunBudgetNs = 50'000;

// Per kind of run a handler serves (a callable, a sub function): whether its
// recent runs took at most the budget, which makes the next one a candidate
// for try_run_inline. A kind is short once a run of it was, and long again
// only after two runs in a row over the budget: on a loaded machine one run
// that lost its CPU for a time slice does not send the next to a thread hop.
// The price: a kind that turns slow for good holds the loop for one run more.
// Unseen, a kind is long, so it runs inline only once it was seen to be
// short. Any thread (two threads' records may race: the last one stands); a
// kind out of range is never short.
class InlineBudget {
 public:
  explicit InlineBudget(size_t kinds, uint64_t budget_ns = kInlineRunBudgetNs)
      : kinds_(kinds), budget_ns_(budget_ns), history_(new std::atomic<uint8_t>[kinds]) {
    for (size_t i = 0; i < kinds_; ++i) history_[i].store(0, std::memory_order_relaxed);
  }
  bool is_short(size_t kind) const {
    if (kind >= kinds_) return false;
    const uint8_t h = history_[kind].load(std::memory_order_relaxed);
    return (h & kSeen) != 0 && (h & (kLastLong | kBeforeLong)) != (kLastLong | kBeforeLong);
  }
  // A run of `kind` that began at `began_ns` (now_ns()) has just ended.
  void record(size_t kind, uint64_t began_ns) {
    if (kind >= kinds_) return;
    const uint8_t h = history_[kind].load(std::memory_order_relaxed);
    const bool before_long = (h & kSeen) == 0 || (h & kLastLong) != 0;
    const bool last_long = now_ns() - began_ns > budget_ns_;
    history_[kind].store(static_cast<uint8_t>(kSeen | (last_long ? kLastLong : 0) | (before_long ? kBeforeLong : 0)),
                         std::memory_order_relaxed);
  }

 private:
  static constexpr uint8_t kSeen = 1, kLastLong = 2, kBeforeLong = 4;
  const size_t kinds_;
  const uint64_t budget_ns_;
  std::unique_ptr<std::atomic<uint8_t>[]> history_;
};

// kCtrlMemoryInfo's reply, as every handler that serves it writes it: the
// total in the reply value, the free bytes as one uint64 in `data`.
Result<ControlReply> memory_info_reply(uint64_t total_bytes, uint64_t free_bytes, uint8_t* data, uint32_t capacity);

class RunHandler {
 public:
  virtual ~RunHandler() = default;
  // In the child before INIT_READY (after fork: threads may start here). An
  // error is published as INIT_FAILED.
  virtual Status init() { return Status(); }
  // After a successful init: the run-resource sets this handler resolved,
  // published for the parent's under-grant check (R68); 0 when it holds none.
  virtual uint64_t granted_sets() const { return 0; }
  // On the serve-loop thread. Must not wait for the run: the loop keeps
  // serving frames while it executes; completion comes later through `ticket`.
  virtual void start(RunRequest request, RunTicket ticket) = 0;
  // On the serve-loop thread, offered every non-staged request (already
  // ACKed) before start(). The handler may take it right here and return
  // true, which saves the hop to a thread of its own; the loop serves
  // nothing else until this returns, so take only work known to be short.
  // `loop_quiet` says nothing else waits on the loop (no other frame ready,
  // no command, no shutdown, no staged run awaiting activation): a handler
  // that runs the request to its terminal here takes it only then; one that
  // only prepares and hands it on may take it either way. False sends it to
  // start().
  virtual bool try_run_inline(const RunRequest& request, const RunTicket& ticket, bool loop_quiet) { return false; }
  // True when start() accepts a staged request and prepares it natively,
  // holding it until activate(). Otherwise the child keeps a staged request
  // itself and calls start() with it only at ACTIVATE.
  virtual bool stages_natively() const { return false; }
  // Serve-loop thread, once per staged request a native stager started:
  // launch it (`launch`), or end it unlaunched through its ticket.
  virtual void activate(uint32_t entry_index, uint64_t generation, bool launch) {}
  // `data` holds the command's `in_bytes` and has room for `capacity` reply bytes.
  virtual Result<ControlReply> control(const ControlCommand& cmd, uint8_t* data, uint32_t in_bytes, uint32_t capacity);
  // Before the exit sweep (not after a stop): finish or abandon every started
  // run by the deadline.
  virtual void drain(uint64_t deadline_ns) {}
  // Serve-loop thread, on every look for work while the loop spins: one round
  // of work the handler would otherwise leave to a thread of its own, which
  // parks while the loop keeps calling (a node child's Scheduler: a request
  // then reaches its node run without a hand-off). True when it moved.
  virtual bool poll() { return false; }
  // Serve-loop thread, when the loop stops calling poll() (it parks, or ends):
  // the handler's own thread takes that work back.
  virtual void stop_polling() {}
  // Before init(), on the serve-loop thread: the bell the loop parks on.
  // True when the handler rings it (from any thread) whenever poll() would
  // find work: the loop then polls after every wake as well and never hands
  // that work back (stop_polling is not called).
  virtual bool attach_loop_bell(Doorbell& bell) { return false; }
};

struct ChildOptions {
  SpinPolicy spin;
  // null: PlainStores; in test builds a CheckingStores over them (T15, H1).
  StorePrimitive* stores = nullptr;
  // A process-shared bell rung with the mailbox's own parent bell, so one
  // parent thread can park on behalf of several children.
  Doorbell* shared_parent_bell = nullptr;
  uint64_t drain_timeout_ns = 10'000'000'000ull;
  // R18 test hook: rewrites the wire constants this child publishes.
  std::function<void(std::vector<WireConstant>&)> perturb_wire;
};

class MailboxChild {
 public:
  MailboxChild(MailboxView view, RunHandler& handler, ChildOptions options = {});
  MailboxChild(const MailboxChild&) = delete;
  MailboxChild& operator=(const MailboxChild&) = delete;

  // Checks the layout, initializes the handler, then serves until the sticky
  // shutdown (exit sweep, kChildExitClean) or an unattributable header
  // (reason published, kChildExitEndpointStopped). kChildExitInitFailed when
  // init failed.
  int serve();

 private:
  friend class RunTicket;
  struct Owed {
    uint64_t generation = 0;  // the occupant this child staged
    bool accepted = false;
    bool completed = false;
  };

  int fail_init(const Status& why);
  bool work_pending() const;
  // The ready request frame with the oldest publication, if any (see the .cpp).
  struct ReadyFrame {
    size_t frame;
    bool staged;
  };
  std::optional<ReadyFrame> oldest_ready_frame() const;
  // Nothing waits on the loop: no frame ready (the one just taken reads IDLE
  // unless the parent refilled it), no command, no shutdown, no staged run.
  bool quiet() const;
  // Delivers every ACTIVATE / CANCEL the parent wrote for a staged run.
  void serve_activations();
  void end_staged(size_t k, bool launch, const Status& why);
  uint64_t serve_command(uint64_t seq);
  // False when the header is unattributable (the endpoint must stop).
  bool take(size_t f, bool staged, std::string& stop_reason);
  int stop(const std::string& reason);
  int exit_sweep();
  void accept(uint32_t entry, uint64_t generation);
  void complete(uint32_t entry, uint64_t generation, const Status& result, MailboxDisposition disposition);
  void hold_set(uint32_t entry, uint64_t generation, uint32_t slot);
  void ring_parent() {
    if (std::this_thread::get_id() == loop_thread_.load(std::memory_order_relaxed)) ++loop_rings_;
    view_.control().parent_bell.ring();
    if (options_.shared_parent_bell != nullptr) options_.shared_parent_bell->ring();
  }

  MailboxView view_;
  RunHandler& handler_;
  ChildOptions options_;
  PlainStores plain_;
#ifdef SIMPLER_TEST_HOOKS
  CheckingStores checked_;
#endif
  StorePrimitive* stores_;
  uint64_t next_epoch_ = 1;
  uint64_t handled_cmd_ = 0;  // the last command sequence answered
  // Rings of the parent's bell made on the serve loop: take() asks whether
  // the run it tried inline rang after its ACK, which then need not ring.
  // A ring of another thread would not be ordered after the ACK's stores.
  // Atomic: handler threads compare it while serve() sets it.
  std::atomic<std::thread::id> loop_thread_{};
  uint64_t loop_rings_ = 0;
  // The handler's private copy of a command's payload: allocated once, since
  // zero-filling the whole capacity per command costs more than most commands.
  std::unique_ptr<uint8_t[]> command_data_;

  // Staged runs not yet activated (serve-loop thread only); `held` keeps the
  // request of a handler that does not stage natively.
  struct Awaiting {
    uint32_t entry = 0;
    uint64_t generation = 0;
    std::optional<RunRequest> held;
  };
  std::vector<Awaiting> awaiting_;

  std::mutex mu_;  // entry stores from tickets vs. stop and sweep
  bool sealed_ = false;
  std::unordered_map<uint32_t, Owed> owed_;  // staged runs by entry index, until their terminal
};

}  // namespace simpler
