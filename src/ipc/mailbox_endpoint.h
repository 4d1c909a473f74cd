// MailboxEndpoint: the parent side of one mailbox. It registers the region
// (checking the extent first), publishes requests into free frames (TASK_READY,
// or PREPARE_READY for a staged run it later activates through the entry), reclaims
// frames on ACKs and entries on terminals, and poisons itself when the child
// is gone or stopped, giving every held run one terminal with one cause.
// Nothing the child writes is trusted: a terminal reaches only the occupant
// its entry proves, and a write the protocol does not allow kills the child.
// reregister() readies the same region for a child that replaces a dead one.
// Threads: one publisher thread (the Scheduler) calls publish, poll,
// available_request_transport and close-path methods; control commands may
// come from any thread (serialized here). Owns no memory of the mapping.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/doorbell.h"
#include "ipc/mailbox_layout.h"
#include "simpler/callable.h"

namespace simpler {

// Whether the child can still answer; implemented by whoever owns the child.
class ChildLiveness {
 public:
  virtual ~ChildLiveness() = default;
  // OK while the child may still answer; afterwards the cause (reaped, killed).
  // Thread-safe.
  virtual Status check() = 0;
  // Ends a child that stopped answering and reaps it; check() reports it after.
  virtual void kill(const std::string& why) = 0;
};

struct EndpointOptions {
  SpinPolicy spin;
  // A held run with no terminal this long after publication means the child
  // hangs: it is killed and the endpoint poisoned. Needs a ChildLiveness; 0 = none.
  uint64_t run_deadline_ns = 0;
  // How often a parked wait wakes to ask the ChildLiveness.
  uint64_t liveness_period_ns = 10'000'000;
};

struct DeviceMemoryReport {
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
};

struct PublishSpec {
  uint64_t run_id = 0;
  uint64_t dispatch_id = 0;
  uint32_t task_slot = 0;
  uint32_t set_slot = kMailboxNoSet;  // the child records the set it takes
  uint64_t lease_generation = 0;
  Digest callable{};
  std::span<const uint8_t> config;
  std::span<const uint8_t> args_blob;
  // Published PREPARE_READY (the staged lane): the child prepares it and
  // launches it only after activate().
  bool staged = false;
};

struct Publication {
  uint32_t frame = 0;
  uint32_t entry = 0;
  uint64_t entry_generation = 0;
  uint64_t publication = 0;
};

struct EndpointEvent {
  enum class Kind : uint8_t { kAccepted, kTerminal };
  Kind kind = Kind::kTerminal;
  uint64_t run_id = 0;
  uint64_t dispatch_id = 0;
  uint32_t task_slot = 0;
  uint32_t entry = 0;
  Status status;  // kTerminal
  MailboxDisposition disposition = kDispositionNone;
  bool accepted = false;          // kTerminal: the launch word was set
  bool endpoint_failure = false;  // kTerminal: delivered by the endpoint's stop, not the run
};

class MailboxEndpoint {
 public:
  // Registration (R70): refuses a grant outside [1, cap] or one `extent`
  // cannot hold before writing a byte; then writes the control frame's words,
  // each frame header and a cleared entry table, and nothing else.
  static Result<std::unique_ptr<MailboxEndpoint>> create(void* base, size_t extent, uint64_t granted_sets,
                                                         EndpointOptions options = {});
  MailboxEndpoint(const MailboxEndpoint&) = delete;
  MailboxEndpoint& operator=(const MailboxEndpoint&) = delete;

  void set_liveness(ChildLiveness* liveness) { liveness_ = liveness; }
  const MailboxView& view() const { return view_; }

  // Waits for INIT_READY and checks the child's wire constants, listing every
  // disagreement (R18). deadline_ns: absolute now_ns().
  Status wait_ready(uint64_t deadline_ns);
  // wait_ready's answer without waiting: nullopt while the child initialises.
  std::optional<Status> ready_state() const;

  // Registration again, over the same region, for a child that replaces a
  // dead one: every word as create() writes it, nothing held, not poisoned,
  // and registration() one higher. `start_child` runs before any control
  // command can reach the new registration (the parent forks the child
  // there). Publisher thread, with every run this endpoint held already
  // given its terminal; waits for a control command in flight.
  Status reregister(const std::function<Status()>& start_child);
  // 1 for create(), one more per reregister(). Any thread.
  uint64_t registration() const { return registration_.load(std::memory_order_acquire); }

  // Free request frames (0 once poisoned). Reclaims ACKed frames first.
  uint32_t available_request_transport();
  // Occupies a free entry (generation odd) and fills a free frame. Refuses
  // oversized payloads, a full entry table and a poisoned or shut-down
  // endpoint with a Status, writing nothing. No free frame is an admitter
  // defect, not backpressure (admitters consult available_request_transport()
  // before claiming work): the endpoint is poisoned first, then the
  // publication fails with kInternal saying so.
  Result<Publication> publish(const PublishSpec& spec);
  // For a run published staged and still held: ACTIVATE (`launch`) or CANCEL,
  // once, through the entry, so it needs no request frame. The run's deadline
  // restarts here: until now it waited on its predecessors, not on the child.
  Status activate(const Publication& p, bool launch);

  // Never blocks. Appends acceptance (at most once per dispatch, always
  // before that dispatch's terminal) and terminal events; releases each entry
  // whose terminal it reports. Notices a stopped or dead child and a run past
  // its deadline, and then poisons.
  void poll(std::vector<EndpointEvent>& out);
  // Spins then parks until the child rang, the liveness period passed or
  // deadline_ns; true when it was rung (poll then).
  bool wait(uint64_t deadline_ns);

  // Gives every held run a terminal with `cause` (next poll reports them) and
  // refuses all later publication. The first cause wins.
  void poison(const Status& cause);
  std::optional<Status> poisoned() const { return poisoned_; }
  size_t held_runs() const { return held_.size(); }
  uint64_t frames_reclaimed() const { return frames_reclaimed_; }

  // Sticky shutdown: the child sweeps every held run and exits.
  void request_shutdown();

  // Control commands over the control frame, independent of request frames
  // and entries (R19). Any thread. `registration`, when not 0, is the one an
  // address belongs to: a command for an earlier registration is refused
  // (ABORTED) unsent, since the child that allocated it is gone.
  // control_malloc stores the registration it ran under in *served.
  Result<uint64_t> control_malloc(uint64_t bytes, uint64_t deadline_ns, uint64_t* served = nullptr);
  Status control_free(uint64_t addr, uint64_t deadline_ns, uint64_t registration = 0);
  Status control_copy_to(uint64_t addr, uint64_t offset, std::span<const uint8_t> bytes, uint64_t deadline_ns,
                         uint64_t registration = 0);
  Status control_copy_from(uint64_t addr, uint64_t offset, std::span<uint8_t> out, uint64_t deadline_ns,
                           uint64_t registration = 0);
  // The child's device memory, forwarded exactly (64-bit, R72); a reply that
  // is malformed or has free > total is refused.
  Result<DeviceMemoryReport> control_memory_info(uint64_t deadline_ns);

 private:
  struct FrameRecord {
    bool busy = false;
    uint32_t entry = 0;
    uint64_t entry_generation = 0;
    uint64_t publication = 0;
  };
  struct EntryRecord {
    uint64_t generation = 0;  // mirror of the entry's generation, which only this side writes
    bool held = false;
    bool accepted_reported = false;
    uint64_t run_id = 0;
    uint64_t dispatch_id = 0;
    uint32_t task_slot = 0;
    uint64_t published_ns = 0;
    bool staged = false;       // published PREPARE_READY, not yet activated or cancelled
    uint64_t publication = 0;  // the only publication the child may echo into this occupant's ACK
  };

  MailboxEndpoint(MailboxView view, size_t extent, EndpointOptions options);
  // Writes the registration into the region and resets this side's records.
  void register_region();
  void reclaim_frames();
  void scan_entries();
  // A terminal's words as entry_violation read and checked them: the event
  // is built from these, never from a second read of memory the child can
  // still write.
  struct TerminalWords {
    int32_t rc = 0;
    uint32_t disposition = 0;
  };
  // Why held entry `i`, whose state word read `state`, breaks the protocol;
  // "" when every word the child wrote there is one it may write (then, for
  // a terminal state, `terminal` holds the words checked).
  std::string entry_violation(uint32_t i, uint32_t state, TerminalWords& terminal) const;
  void release(uint32_t entry);
  void deliver_poison();
  // `registration`: as for the control commands; *served, when set, gets the
  // registration the command ran under.
  Result<ControlReply> command(MailboxControlOp op, std::initializer_list<uint64_t> args, std::span<const uint8_t> in,
                               std::span<uint8_t> out, uint64_t deadline_ns, uint64_t registration = 0,
                               uint64_t* served = nullptr);

  MailboxView view_;
  const size_t extent_;
  EndpointOptions options_;
  ChildLiveness* liveness_ = nullptr;
  FrameRecord frames_[kMailboxRequestFrames];
  std::vector<EntryRecord> entries_;
  std::vector<uint32_t> free_entries_;  // a stack; lowest index on top
  std::vector<uint32_t> held_;
  uint64_t next_publication_ = 0;
  uint64_t frames_reclaimed_ = 0;
  uint64_t next_liveness_ns_ = 0;
  std::optional<Status> poisoned_;
  bool shutdown_ = false;
  // Events not yet handed to poll(): a vector reserved at create() for every
  // held entry's acceptance and terminal, and cleared (capacity kept) by each
  // poll, so a poll that delivers allocates nothing (R44).
  std::vector<EndpointEvent> pending_;

  std::mutex control_mu_;  // a control command, or a registration
  uint64_t cmd_seq_ = 0;
  std::atomic<uint64_t> registration_{1};  // written under control_mu_
};

}  // namespace simpler
