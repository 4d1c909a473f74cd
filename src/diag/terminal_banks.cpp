#include "diag/terminal_banks.h"

#include <algorithm>
#include <cstring>

#include "base/errors.h"

namespace simpler {

const char* settlement_verdict_name(SettlementVerdict v) {
  switch (v) {
    case SettlementVerdict::kNone:
      return "none";
    case SettlementVerdict::kClean:
      return "clean";
    case SettlementVerdict::kNotStarted:
      return "not_started";
    case SettlementVerdict::kPartialCutUnknown:
      return "partial_cut_unknown";
  }
  return "?";
}

const char* bank_proof_name(BankProof p) {
  switch (p) {
    case BankProof::kNone:
      return "none";
    case BankProof::kSnapshotConsumed:
      return "snapshot_consumed";
    case BankProof::kSubmittedNothing:
      return "submitted_nothing";
    case BankProof::kProducersStopped:
      return "producers_stopped";
  }
  return "?";
}

void TerminalSnapshot::set_status(const Status& s) {
  code = s.code();
  const size_t n = std::min<size_t>(s.message().size(), kMessageBytes - 1);
  std::memcpy(message, s.message().data(), n);
  message[n] = '\0';
}

bool TerminalSnapshot::add_lane(const LaneTerminal& lane) {
  if (lane_count == kMaxLanes) {
    lanes_truncated = true;
    return false;
  }
  lanes[lane_count++] = lane;
  return true;
}

std::string_view TerminalSnapshot::message_view() const {
  return std::string_view(message, strnlen(message, kMessageBytes));
}

int TerminalBankTable::find_locked(uint64_t epoch) const {
  if (epoch == 0) return -1;
  for (uint32_t i = 0; i < kTerminalBanksPerContext; ++i) {
    if (banks_[i].state != State::kFree && banks_[i].epoch == epoch) return static_cast<int>(i);
  }
  return -1;
}

std::optional<uint32_t> TerminalBankTable::try_acquire(uint64_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  // Three ways to get nothing: a finalized table, an epoch that cannot take
  // a bank (0, or one holding a bank already), and no free bank.
  if (!initialized_ || epoch == 0 || find_locked(epoch) >= 0) {
    ++stats_.acquire_refused;
    return std::nullopt;
  }
  for (uint32_t i = 0; i < kTerminalBanksPerContext; ++i) {
    Bank& b = banks_[i];
    if (b.state != State::kFree) continue;
    b.state = State::kAcquired;
    b.epoch = epoch;
    ++stats_.acquired;
    return i;
  }
  ++stats_.acquire_refused;
  return std::nullopt;
}

bool TerminalBankTable::can_acquire() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!initialized_) return false;
  return std::any_of(banks_.begin(), banks_.end(), [](const Bank& b) { return b.state == State::kFree; });
}

Status TerminalBankTable::arm(uint64_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  const int i = find_locked(epoch);
  if (i < 0) return failed_precondition("arm: run {} holds no terminal bank; acquire one first", epoch);
  Bank& b = banks_[i];
  if (b.state != State::kAcquired) {
    return failed_precondition("arm: run {}'s terminal bank {} is {}", epoch, i,
                               b.state == State::kArmed ? "armed already" : "quarantined");
  }
  if (refuse_arms_ != 0) {
    --refuse_arms_;
    return refuse_why_;
  }
  b.snapshot = TerminalSnapshot{};
  b.snapshot.epoch = epoch;
  b.state = State::kArmed;
  return Status();
}

TerminalSnapshot* TerminalBankTable::lookup(uint64_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  const int i = find_locked(epoch);
  if (i < 0 || banks_[i].state != State::kArmed) return nullptr;
  return &banks_[i].snapshot;
}

void TerminalBankTable::publish(uint64_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  const int i = find_locked(epoch);
  if (i >= 0 && banks_[i].state == State::kArmed) banks_[i].snapshot.published = true;
}

void TerminalBankTable::record_locked(const Settlement& s) {
  settlements_[next_settlement_] = s;
  next_settlement_ = (next_settlement_ + 1) % kRetainedTerminalArtifacts;
}

void TerminalBankTable::release_locked(Bank& b) {
  b.state = State::kFree;
  b.epoch = 0;
}

Settlement TerminalBankTable::rollback_not_started(uint64_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  Settlement s;
  s.epoch = epoch;
  s.verdict = SettlementVerdict::kNotStarted;
  const int i = find_locked(epoch);
  if (i < 0 || banks_[i].state == State::kQuarantined) {
    s.bank = i;
    s.quarantined = i >= 0;
    return s;
  }
  Bank& b = banks_[i];
  s.bank = i;
  if (retain_) {
    TerminalSnapshot& a = artifacts_[next_artifact_];
    a = TerminalSnapshot{};
    a.epoch = epoch;
    a.verdict = s.verdict;
    next_artifact_ = (next_artifact_ + 1) % kRetainedTerminalArtifacts;
  }
  // Whatever the retention: nothing reached the device, so nothing can write
  // the bank (R60).
  s.proof = BankProof::kSubmittedNothing;
  s.returned = true;
  ++stats_.returned_submitted_nothing;
  release_locked(b);
  record_locked(s);
  return s;
}

Settlement TerminalBankTable::run_close(uint64_t epoch, bool completed, bool producers_stopped) {
  std::lock_guard<std::mutex> lock(mu_);
  Settlement s;
  s.epoch = epoch;
  s.completed = completed;
  s.producers_stopped = producers_stopped;
  s.verdict = SettlementVerdict::kPartialCutUnknown;
  const int i = find_locked(epoch);
  s.bank = i;
  // Armed without a bank, or never acquired: nothing is known of the cut
  // (R55). Not logged: a late close of a settled epoch must not hide how it was settled.
  if (i < 0) return s;
  Bank& b = banks_[i];
  if (b.state == State::kQuarantined) {  // settled already, without proof; stays so until finalize
    s.quarantined = true;
    return s;
  }
  const bool published = b.state == State::kArmed && b.snapshot.published;
  if (completed && published) s.verdict = SettlementVerdict::kClean;
  if (retain_) {
    TerminalSnapshot& a = artifacts_[next_artifact_];
    if (published) {
      a = b.snapshot;  // the consumption: the record is whole and its producer is done with it
      s.proof = BankProof::kSnapshotConsumed;
    } else {
      // A record that was never published may still be written: only the
      // facts this call knows are kept.
      a = TerminalSnapshot{};
      a.epoch = epoch;
    }
    a.processing_complete = completed && published;
    a.verdict = s.verdict;
    next_artifact_ = (next_artifact_ + 1) % kRetainedTerminalArtifacts;
  }
  if (b.state == State::kArmed) {
    b.snapshot.processing_complete = completed && published;
    b.snapshot.verdict = s.verdict;
  }
  if (s.proof == BankProof::kNone && producers_stopped) s.proof = BankProof::kProducersStopped;
  switch (s.proof) {
    case BankProof::kSnapshotConsumed:
      ++stats_.returned_consumed;
      break;
    case BankProof::kProducersStopped:
      ++stats_.returned_producers_stopped;
      break;
    default:
      break;
  }
  if (s.proof == BankProof::kNone) {
    // No proof that nothing still writes it: never handed on (R57).
    b.state = State::kQuarantined;
    s.quarantined = true;
    ++stats_.quarantined;
  } else {
    release_locked(b);
    s.returned = true;
  }
  record_locked(s);
  return s;
}

void TerminalBankTable::finalize() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Bank& b : banks_) {
    if (b.state == State::kFree) continue;
    // A holder at finalize has no proof either: it counts as quarantined first.
    if (b.state != State::kQuarantined) ++stats_.quarantined;
    ++stats_.finalize_returned;
    release_locked(b);
  }
  initialized_ = false;
}

void TerminalBankTable::initialize() {
  std::lock_guard<std::mutex> lock(mu_);
  initialized_ = true;
}

void TerminalBankTable::set_retain_artifacts(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  retain_ = on;
}

void TerminalBankTable::refuse_next_arm(uint32_t n, Status why) {
  std::lock_guard<std::mutex> lock(mu_);
  refuse_arms_ = n;
  refuse_why_ = std::move(why);
}

BankCounts TerminalBankTable::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  BankCounts c;
  for (const Bank& b : banks_) {
    switch (b.state) {
      case State::kFree:
        ++c.free;
        break;
      case State::kQuarantined:
        ++c.quarantined;
        break;
      default:
        ++c.held;
    }
  }
  return c;
}

BankStats TerminalBankTable::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

Result<TerminalSnapshot> TerminalBankTable::artifact(uint64_t epoch) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (epoch != 0) {
    for (const TerminalSnapshot& a : artifacts_) {
      if (a.epoch == epoch) return a;
    }
  }
  return not_found(
      "terminal snapshot of run {}: not retained (not a diagnostic run, not closed yet, or evicted by "
      "the {} newer ones kept)",
      epoch, kRetainedTerminalArtifacts);
}

std::optional<Settlement> TerminalBankTable::settlement(uint64_t epoch) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<Settlement> found;
  // Oldest to newest, so the last settlement of the epoch wins.
  for (uint32_t k = 0; k < kRetainedTerminalArtifacts; ++k) {
    const Settlement& s = settlements_[(next_settlement_ + k) % kRetainedTerminalArtifacts];
    if (s.epoch == epoch && epoch != 0) found = s;
  }
  return found;
}

}  // namespace simpler
