// TerminalBankTable: the terminal diagnostic banks of one chip context
// (R55-R66). A diagnostic run takes a bank by its run epoch before it is
// launched; the run's completion path writes its TerminalSnapshot there; the
// bank comes back only with a proof, otherwise it is quarantined until
// finalize(). Any thread (one mutex; no call blocks or calls out while holding
// it). The table owns the banks, their snapshots and the retained artifacts.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string_view>

#include "simpler/status.h"

namespace simpler {

// Banks per chip context: they bound how many runs' terminal snapshots exist
// at once, never how many runs exist (R66).
inline constexpr uint32_t kTerminalBanksPerContext = 3;
// Snapshots of closed runs kept for readers (by epoch); the oldest goes first.
inline constexpr uint32_t kRetainedTerminalArtifacts = 16;

enum class SettlementVerdict : uint8_t {
  kNone = 0,           // not settled yet
  kClean,              // the run completed and its snapshot was published and consumed
  kNotStarted,         // the run submitted nothing to the device
  kPartialCutUnknown,  // anything else: where the run was cut is not known
};
const char* settlement_verdict_name(SettlementVerdict v);

// Why a bank went back to the free list (R57); kNone: it did not.
enum class BankProof : uint8_t { kNone = 0, kSnapshotConsumed, kSubmittedNothing, kProducersStopped };
const char* bank_proof_name(BankProof p);

// One lane's terminal accounting, added by a recorder (swimlane, argument
// dump) through TerminalSnapshot::add_lane. `total == collected + dropped`
// is the recorder's own promise; the snapshot carries the numbers as given.
struct LaneTerminal {
  uint32_t recorder = 0;  // the recorder's own id (it names its kinds)
  uint32_t lane = 0;      // e.g. an AICPU thread or a core
  uint64_t total = 0;
  uint64_t collected = 0;
  uint64_t dropped = 0;
  uint32_t flags = 0;  // the recorder's (e.g. "terminal closed")
};

// A run's terminal diagnostic facts, fixed capacity, so the completion path
// writes it without allocating.
struct TerminalSnapshot {
  static constexpr uint32_t kMessageBytes = 160;  // the status message's prefix, NUL-terminated
  static constexpr uint32_t kMaxCores = 128;      // a5 has 108
  static constexpr uint32_t kMaxLanes = 32;
  static constexpr uint32_t kNoTask = UINT32_MAX;

  uint64_t epoch = 0;
  StatusCode code = StatusCode::kOk;
  char message[kMessageBytes] = {};
  uint32_t tasks = 0;           // tasks in the run's graph
  uint32_t tasks_executed = 0;  // subtasks that ran a kernel
  uint64_t device_ns = 0;       // launch to the last completion
  // Per core, the last task of this run it finished (kNoTask: none). Filled
  // only when the runtime reports it (core_count == 0: not reported).
  uint32_t core_count = 0;
  uint32_t last_task[kMaxCores] = {};
  // The run completed and its record was published whole.
  bool processing_complete = false;
  bool published = false;
  SettlementVerdict verdict = SettlementVerdict::kNone;
  // The extension point: each recorder adds its lanes' terminal accounting.
  uint32_t lane_count = 0;
  bool lanes_truncated = false;  // a recorder offered more than kMaxLanes
  LaneTerminal lanes[kMaxLanes] = {};

  void set_status(const Status& s);
  // False (and lanes_truncated set) when full.
  bool add_lane(const LaneTerminal& lane);
  std::string_view message_view() const;
};

// A recorder that adds its terminal data to a diagnostic run's snapshot: the
// chip calls every registered contributor on the run's completion path, after
// the run's producers stopped and before the snapshot is published. Must not
// allocate or block.
class TerminalContributor {
 public:
  virtual ~TerminalContributor() = default;
  virtual void write_terminal(uint64_t epoch, TerminalSnapshot& snapshot) = 0;
};

// How a run's bank was settled: what run_close (or the rollback) was told,
// what it concluded, and whether the bank came back.
struct Settlement {
  uint64_t epoch = 0;
  int32_t bank = -1;  // -1: no bank was held for the epoch
  bool completed = false;
  bool producers_stopped = false;
  SettlementVerdict verdict = SettlementVerdict::kNone;
  BankProof proof = BankProof::kNone;
  bool returned = false;     // back on the free list
  bool quarantined = false;  // held until finalize()
};

struct BankCounts {
  uint32_t free = 0;
  uint32_t held = 0;  // acquired or armed
  uint32_t quarantined = 0;
};

// Cumulative, since construction: acquired == returned_* + quarantined + held
// (finalize moves quarantined banks to finalize_returned).
struct BankStats {
  uint64_t acquired = 0;
  uint64_t acquire_refused = 0;
  uint64_t returned_consumed = 0;
  uint64_t returned_submitted_nothing = 0;
  uint64_t returned_producers_stopped = 0;
  uint64_t quarantined = 0;
  uint64_t finalize_returned = 0;  // banks finalize() took back from quarantine or a holder
  uint64_t returned() const { return returned_consumed + returned_submitted_nothing + returned_producers_stopped; }
};

class TerminalBankTable {
 public:
  TerminalBankTable() = default;
  TerminalBankTable(const TerminalBankTable&) = delete;
  TerminalBankTable& operator=(const TerminalBankTable&) = delete;

  // A free bank for `epoch`, or nullopt: every bank is held or quarantined,
  // the table is finalized, or the epoch (0, or one already holding a bank)
  // cannot take one.
  std::optional<uint32_t> try_acquire(uint64_t epoch);
  bool can_acquire() const;
  // Binds the epoch's acquired bank to the run: clears its snapshot and makes
  // it writable. Refused (changing nothing) without an acquired bank for the
  // epoch (R55), or by refuse_next_arm.
  Status arm(uint64_t epoch);
  // The armed bank's snapshot for the run's completion path to fill, or null.
  // Only that run's producer writes it, between arm and publish.
  TerminalSnapshot* lookup(uint64_t epoch);
  // The producer finished writing: the record is whole.
  void publish(uint64_t epoch);
  // The run submitted nothing to the device: the bank comes back (R60, R61).
  Settlement rollback_not_started(uint64_t epoch);
  // The run stopped using its bank. `completed`: it finished its processing;
  // `producers_stopped`: nothing can still write the bank (R59: two facts).
  // Returned with a proof, else quarantined (R57). A retaining table copies
  // the snapshot to its artifacts first, which consumes it.
  Settlement run_close(uint64_t epoch, bool completed, bool producers_stopped);
  // Every bank back, quarantined ones included (R62); acquire is refused
  // until initialize(). Called once no producer can write any bank.
  void finalize();
  void initialize();

  // Whether closes keep a readable artifact (on by default). Off, nothing
  // consumes a snapshot and only a producer-stop proof returns a bank.
  void set_retain_artifacts(bool on);
  // The next n arms refuse with `why` (a refused arm, R61).
  void refuse_next_arm(uint32_t n, Status why);

  BankCounts counts() const;
  BankStats stats() const;
  // The retained snapshot of a closed run (NOT_FOUND once evicted or never retained).
  Result<TerminalSnapshot> artifact(uint64_t epoch) const;
  // How the epoch's bank was last settled, among the last kRetainedTerminalArtifacts settlements.
  std::optional<Settlement> settlement(uint64_t epoch) const;

 private:
  enum class State : uint8_t { kFree, kAcquired, kArmed, kQuarantined };
  struct Bank {
    State state = State::kFree;
    uint64_t epoch = 0;
    TerminalSnapshot snapshot;
  };
  int find_locked(uint64_t epoch) const;  // a bank held or quarantined for the epoch, or -1
  void record_locked(const Settlement& s);
  void release_locked(Bank& b);

  mutable std::mutex mu_;
  std::array<Bank, kTerminalBanksPerContext> banks_;
  bool initialized_ = true;
  bool retain_ = true;
  uint32_t refuse_arms_ = 0;
  Status refuse_why_;
  BankStats stats_;
  std::array<TerminalSnapshot, kRetainedTerminalArtifacts> artifacts_;
  uint32_t next_artifact_ = 0;
  std::array<Settlement, kRetainedTerminalArtifacts> settlements_;
  uint32_t next_settlement_ = 0;
};

}  // namespace simpler
