// Terminal diagnostic banks (issue 12, R55-R66): the bank table alone, then
// the chip that takes a bank for each diagnostic run (ChipWorker on the
// small simulated chip). Orders are forced with gate kernels, the execution
// context and the table's arm refusal; every wait has a deadline.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "base/doorbell.h"
#include "base/leak.h"
#include "chip/chip_worker.h"
#include "diag/terminal_banks.h"
#include "gate.h"
#include "simpler/simpler.h"
#include "test_util.h"

namespace simpler {
namespace {

using namespace std::chrono_literals;
using testing::deadline;
using testing::eventually;
using testing::Gate;

// One gate per run.
constexpr int kGates = 8;
Gate* g_gates = nullptr;

extern "C" void bank_gate_kernel(int64_t* args) { g_gates[args[0]].pass(); }

extern "C" void bank_add_one_kernel(int64_t* args) {
  const DeviceTensor* t = tensor_arg(args, 0);
  for (int64_t i = 0; i < t->shape[0]; ++i) tensor_data<float>(t)[i] += 1.0f;
}

extern "C" void bank_failing_kernel(int64_t*) { simpler_kernel_fail("injected kernel failure"); }

enum Callable : uint32_t { kAddOne = 0, kGated = 1, kFails = 2 };

struct Chip {
  explicit Chip(uint32_t depth = 4, uint32_t launch_depth = 0, std::chrono::milliseconds run_timeout = 10min) {
    // Leaked on purpose (see Gate), and marked so: a test that builds several
    // chips replaces g_gates, and LeakSanitizer reports what nothing points to.
    g_gates = abandon(new Gate[kGates]);
    KernelLibrary k;
    EXPECT_TRUE(k.add_function(0, CoreType::AIV, "bank_add_one_kernel", bank_add_one_kernel).ok());
    EXPECT_TRUE(k.add_function(1, CoreType::AIV, "bank_gate_kernel", bank_gate_kernel).ok());
    EXPECT_TRUE(k.add_function(2, CoreType::AIV, "bank_failing_kernel", bank_failing_kernel).ok());
    std::vector<ChipCallable> cs;
    cs.emplace_back(
        "add_one", [](ChipOrchestrator& o, const TaskArgs& a) { return o.submit_aiv(0, a).status(); }, k,
        std::vector<Param>{Param::inout()});
    cs.emplace_back(
        "gated", [](ChipOrchestrator& o, const TaskArgs& a) { return o.submit_aiv(1, a).status(); }, k,
        std::vector<Param>{Param::scalar()});
    cs.emplace_back(
        "fails", [](ChipOrchestrator& o, const TaskArgs& a) { return o.submit_aiv(2, a).status(); }, k,
        std::vector<Param>{Param::scalar()});
    WorkerConfig cfg;
    cfg.runtime = "host_build_graph";
    cfg.geometry = *Geometry::by_name("small");
    cfg.pipeline_depth = depth;
    cfg.launch_depth = launch_depth;
    cfg.max_tasks_per_run = 16;
    cfg.device_memory_bytes = 64ull << 20;
    cfg.run_timeout = run_timeout;
    auto w = ChipWorker::create(cfg, std::move(cs));
    EXPECT_TRUE(w.ok()) << w.status().to_string();
    worker = std::move(w).value();
    auto b = worker->malloc(16 * 4);
    EXPECT_TRUE(b.ok());
    buf = *b;
    std::vector<float> zeros(16, 0.f);
    EXPECT_TRUE(worker->copy_to(buf, zeros.data(), 16 * 4, 0).ok());
  }
  // A run left queued (a test that failed) makes close wait its whole drain: keep it short.
  ~Chip() {
    if (worker != nullptr) (void)worker->close(5s);
  }
  TaskArgs inout() const {
    TaskArgs a;
    a.add_tensor(buf.view({16}, DType::F32), Tag::InOut);
    return a;
  }
  static TaskArgs gate(int64_t i) {
    TaskArgs a;
    a.add_scalar(i);
    return a;
  }
  float value() const {
    float x = -1;
    EXPECT_TRUE(worker->copy_from(&x, buf, 4, 0).ok());
    return x;
  }
  TerminalBankTable& banks() { return worker->terminal_banks(); }
  // Every bank acquired so far is back, in quarantine, or still held: no fourth place.
  void expect_every_bank_accounted() {
    const BankStats s = banks().stats();
    const BankCounts c = banks().counts();
    EXPECT_EQ(s.acquired, s.returned() + s.quarantined + c.held);
    EXPECT_EQ(c.quarantined, s.quarantined - s.finalize_returned);
    EXPECT_EQ(c.free + c.held + c.quarantined, kTerminalBanksPerContext);
  }
  std::unique_ptr<ChipWorker> worker;
  DeviceBuffer buf;
};

// Zeroed, aligned caller storage for one native run.
struct Storage {
  Storage()
      : p(static_cast<unsigned char*>(
            ::operator new (native_run_storage_size(), std::align_val_t{native_run_storage_alignment()}))) {
    std::memset(p, 0, native_run_storage_size());
  }
  ~Storage() { ::operator delete (p, std::align_val_t{native_run_storage_alignment()}); }
  void* get() { return p; }
  unsigned char* p;
};

// A failed run, as far as its bank goes: acquired, armed, cut before its
// terminal publication. Only `producers_stopped` differs between callers.
Settlement failed_run(TerminalBankTable& t, uint64_t epoch, bool producers_stopped) {
  EXPECT_TRUE(t.try_acquire(epoch).has_value());
  EXPECT_TRUE(t.arm(epoch).ok());
  TerminalSnapshot* snap = t.lookup(epoch);
  EXPECT_NE(snap, nullptr);
  if (snap != nullptr) snap->set_status(make_error(StatusCode::kKernelFailed, "task 3 failed"));
  return t.run_close(epoch, /*completed=*/false, producers_stopped);
}

// --- the table -------------------------------------------------------------

// R55: acquire then arm then close is clean; arming without acquiring is
// refused, and the close then finds no bank and reads partial_cut_unknown.
TEST(TerminalBanks, R55BanksAreKeyedByEpoch) {
  testing::Watchdog dog;
  TerminalBankTable t;
  auto bank = t.try_acquire(41);
  ASSERT_TRUE(bank.has_value());
  ASSERT_TRUE(t.arm(41).ok());
  TerminalSnapshot* snap = t.lookup(41);
  ASSERT_NE(snap, nullptr);
  EXPECT_EQ(snap->epoch, 41u);
  EXPECT_EQ(t.lookup(42), nullptr) << "lookup is by epoch";
  snap->set_status(Status());
  t.publish(41);
  const Settlement clean = t.run_close(41, /*completed=*/true, /*producers_stopped=*/true);
  EXPECT_EQ(clean.verdict, SettlementVerdict::kClean);
  EXPECT_EQ(clean.bank, static_cast<int32_t>(*bank));
  EXPECT_TRUE(clean.returned);

  const Status armed = t.arm(42);
  EXPECT_EQ(armed.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(armed.message().find("run 42 holds no terminal bank"), std::string::npos) << armed.message();
  const Settlement cut = t.run_close(42, /*completed=*/true, /*producers_stopped=*/true);
  EXPECT_EQ(cut.verdict, SettlementVerdict::kPartialCutUnknown);
  EXPECT_EQ(cut.bank, -1);
  EXPECT_FALSE(cut.returned);
  EXPECT_EQ(t.counts().free, kTerminalBanksPerContext);
}

// R57: the same failed run, twice: with the producer-stop proof its bank is
// returned; without it (nothing consumed, nothing proved) it is quarantined.
TEST(TerminalBanks, R57ReturnRequiresProof) {
  testing::Watchdog dog;
  TerminalBankTable with_proof;
  TerminalBankTable without_proof;
  const Settlement returned = failed_run(with_proof, 7, /*producers_stopped=*/true);
  const Settlement kept = failed_run(without_proof, 7, /*producers_stopped=*/false);
  EXPECT_TRUE(returned.returned);
  EXPECT_EQ(returned.proof, BankProof::kProducersStopped);
  EXPECT_EQ(with_proof.counts().free, kTerminalBanksPerContext);
  EXPECT_FALSE(kept.returned);
  EXPECT_TRUE(kept.quarantined);
  EXPECT_EQ(kept.proof, BankProof::kNone);
  EXPECT_EQ(without_proof.counts().quarantined, 1u);
  EXPECT_EQ(without_proof.counts().free, kTerminalBanksPerContext - 1);
  // Both were cut: neither claims completeness.
  EXPECT_EQ(returned.verdict, SettlementVerdict::kPartialCutUnknown);
  EXPECT_EQ(kept.verdict, SettlementVerdict::kPartialCutUnknown);
  // A quarantined bank stays so: a second close of the epoch changes nothing.
  EXPECT_TRUE(without_proof.run_close(7, false, true).quarantined);
  EXPECT_EQ(without_proof.counts().quarantined, 1u);
}

// R62: finalize returns every bank, quarantined ones included; after
// initialize all three are free again.
TEST(TerminalBanks, R62FinalizeReturnsEveryBank) {
  testing::Watchdog dog;
  TerminalBankTable t;
  failed_run(t, 1, /*producers_stopped=*/false);
  failed_run(t, 2, /*producers_stopped=*/false);
  ASSERT_EQ(t.counts().quarantined, 2u);
  ASSERT_EQ(t.counts().free, 1u);
  t.finalize();
  EXPECT_FALSE(t.try_acquire(3).has_value()) << "a finalized table hands out nothing";
  t.initialize();
  EXPECT_EQ(t.counts().free, kTerminalBanksPerContext);
  EXPECT_EQ(t.counts().quarantined, 0u);
  for (uint64_t e = 10; e < 10 + kTerminalBanksPerContext; ++e) EXPECT_TRUE(t.try_acquire(e).has_value()) << e;
  EXPECT_EQ(t.stats().finalize_returned, 2u);
}

// R65 (the table's part): banks go out by epoch, one per epoch, and are
// refused beyond the bank count, by a finalized table and to an epoch that
// cannot take one; each refusal hands out nothing.
TEST(TerminalBanks, R65HandsBanksOutByEpochAndRefusesBeyondTheBankCount) {
  testing::Watchdog dog;
  TerminalBankTable t;
  std::vector<uint32_t> got;
  for (uint64_t e = 1; e <= kTerminalBanksPerContext; ++e) {
    auto b = t.try_acquire(e);
    ASSERT_TRUE(b.has_value());
    got.push_back(*b);
  }
  EXPECT_EQ(got, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_FALSE(t.can_acquire());
  EXPECT_FALSE(t.try_acquire(4).has_value()) << "beyond the bank count";
  EXPECT_EQ(t.rollback_not_started(2).bank, 1);
  EXPECT_FALSE(t.try_acquire(1).has_value()) << "epoch 1 holds a bank already";
  EXPECT_FALSE(t.try_acquire(0).has_value()) << "epoch 0 is no run";
  auto again = t.try_acquire(4);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*again, 1u) << "the released bank, now keyed by epoch 4";
  t.finalize();
  EXPECT_FALSE(t.try_acquire(5).has_value()) << "finalized";
  EXPECT_EQ(t.stats().acquire_refused, 4u);
  EXPECT_EQ(t.stats().acquired, 4u);
}

// What the completion path writes: the run's terminal facts, each core's last
// task, and through the extension point a recorder's lanes; a recorder
// offering more than the snapshot holds is told so, never cut short silently.
TEST(TerminalBanks, ASnapshotHoldsTheTerminalFactsAndTheRecordersLanes) {
  testing::Watchdog dog;
  struct Recorder : TerminalContributor {
    void write_terminal(uint64_t epoch, TerminalSnapshot& s) override {
      for (uint32_t lane = 0; lane < TerminalSnapshot::kMaxLanes + 1; ++lane) {
        s.add_lane(LaneTerminal{/*recorder=*/9, lane, /*total=*/epoch, /*collected=*/epoch - 1, /*dropped=*/1, 0});
      }
    }
  } recorder;
  Chip chip;
  chip.worker->add_terminal_contributor(&recorder);
  RunHandle r = chip.worker->submit(kAddOne, chip.inout(), /*diagnostic=*/true);
  ASSERT_TRUE(r.wait_for(30s).ok());
  auto snap = chip.worker->terminal_snapshot(r.run_id());
  ASSERT_TRUE(snap.ok()) << snap.status().to_string();
  EXPECT_EQ(snap->lane_count, TerminalSnapshot::kMaxLanes);
  EXPECT_TRUE(snap->lanes_truncated);
  EXPECT_EQ(snap->lanes[5].lane, 5u);
  EXPECT_EQ(snap->lanes[5].total, r.run_id());
  EXPECT_EQ(snap->lanes[5].collected + snap->lanes[5].dropped, snap->lanes[5].total);
  EXPECT_TRUE(snap->processing_complete);
  EXPECT_EQ(snap->tasks, 1u);
  EXPECT_EQ(snap->code, StatusCode::kOk);
  // Each core's last task of this run: the one task ran on one AIV core.
  ASSERT_EQ(snap->core_count, 6u) << "the small chip has 2 clusters of 3 cores";
  uint32_t ran = 0;
  for (uint32_t core = 0; core < snap->core_count; ++core) {
    if (snap->last_task[core] == TerminalSnapshot::kNoTask) continue;
    ++ran;
    EXPECT_EQ(snap->last_task[core], 0u) << "core " << core;
    EXPECT_NE(core % 3, 0u) << "an AIV task on an AIC core";
  }
  EXPECT_EQ(ran, 1u);
}

// --- the chip ----------------------------------------------------------------

// R56: success, prepare failure and a partial (failed) run each leave the
// held count at its baseline, every bank accounted for.
TEST(TerminalBanks, R56SuccessPrepareFailureAndPartialSettle) {
  testing::Watchdog dog;
  Chip chip;
  RunHandle ok = chip.worker->submit(kAddOne, chip.inout(), true);
  ASSERT_TRUE(ok.wait_for(30s).ok());
  EXPECT_EQ(chip.banks().counts().held, 0u);
  EXPECT_TRUE(chip.banks().settlement(ok.run_id())->returned);
  chip.expect_every_bank_accounted();

  TaskArgs wrong;  // a scalar where a tensor is expected: refused before any bank
  wrong.add_scalar(1);
  RunHandle refused = chip.worker->submit(kAddOne, wrong, true);
  EXPECT_EQ(refused.wait_for(30s).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(chip.banks().counts().held, 0u);
  EXPECT_EQ(chip.banks().stats().acquired, 1u) << "a prepare failure takes no bank";
  chip.expect_every_bank_accounted();

  RunHandle partial = chip.worker->submit(kFails, Chip::gate(0), true);
  EXPECT_EQ(partial.wait_for(30s).code(), StatusCode::kKernelFailed);
  EXPECT_EQ(chip.banks().counts().held, 0u);
  EXPECT_TRUE(chip.banks().settlement(partial.run_id())->returned);
  chip.expect_every_bank_accounted();
}

// R56: a launch unwound before the device took it (NotStarted) and a refused
// arm settle their bank too.
TEST(TerminalBanks, R56NotStartedAndRefusedArmSettle) {
  testing::Watchdog dog;
  Chip chip(4, 1);
  chip.banks().refuse_next_arm(1, internal_error("injected arm refusal"));
  RunHandle refused = chip.worker->submit(kAddOne, chip.inout(), true);
  EXPECT_EQ(refused.wait_for(30s).message(), "injected arm refusal");
  EXPECT_EQ(chip.banks().counts().held, 0u);
  chip.expect_every_bank_accounted();

  // NotStarted: a native diagnostic run queued behind launch_depth meets a
  // refused execution context at the marker.
  RunHandle blocker = chip.worker->submit(kGated, Chip::gate(0));
  ASSERT_TRUE(g_gates[0].wait_entered());
  Storage s;
  auto lease = chip.worker->try_acquire_lease();
  ASSERT_TRUE(lease.has_value());
  NativeRunDescriptor d;
  d.lease = *lease;
  d.arena_bank = lease->slot;
  RunConfig rc;
  rc.diagnostic = true;
  auto epoch = chip.worker->prepare(s.get(), native_run_storage_size(), d, kAddOne, chip.inout(), rc);
  ASSERT_TRUE(epoch.ok()) << epoch.status().to_string();
  Status launched;
  std::thread launcher([&] { launched = chip.worker->launch(s.get(), *epoch); });
  ASSERT_TRUE(eventually([&] { return chip.worker->waiting_for_bank() == std::vector<uint64_t>{*epoch}; }));
  chip.worker->execution_context().suspend();
  g_gates[0].release();
  launcher.join();
  chip.worker->execution_context().restore();
  EXPECT_NE(launched.message().find("execution context refused"), std::string::npos) << launched.to_string();
  EXPECT_EQ(chip.banks().counts().held, 0u);
  EXPECT_EQ(chip.banks().settlement(*epoch)->verdict, SettlementVerdict::kNotStarted);
  chip.expect_every_bank_accounted();
  EXPECT_EQ(chip.worker->finalize(s.get(), *epoch).code(), StatusCode::kAborted);
  EXPECT_TRUE(blocker.wait_for(30s).ok());
  EXPECT_EQ(chip.value(), 0.0f) << "neither run reached the device";
}

// R56: close settles the bank of a run still on the device (quarantine, no
// proof), and the table's finalize at close takes it back.
TEST(TerminalBanks, R56CloseAndFinalizeSettle) {
  testing::Watchdog dog;
  Chip chip;
  RunHandle stuck = chip.worker->submit(kGated, Chip::gate(0), true);
  ASSERT_TRUE(g_gates[0].wait_entered());
  ASSERT_EQ(chip.banks().counts().held, 1u);
  EXPECT_EQ(chip.worker->close(0ms).code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(stuck.wait_for(30s).code(), StatusCode::kDeadlineExceeded);
  const std::optional<Settlement> s = chip.banks().settlement(stuck.run_id());
  ASSERT_TRUE(s.has_value());
  EXPECT_TRUE(s->quarantined) << "no proof for a run still on the device";
  EXPECT_EQ(chip.banks().stats().finalize_returned, 1u);
  EXPECT_EQ(chip.banks().counts().free, kTerminalBanksPerContext);
  chip.expect_every_bank_accounted();
  g_gates[0].release();  // the abandoned kernel ends; its completion is dropped at the gate
}

// R56, R57 on the chip: a run that outlived run_timeout has no proof (its
// kernel may still write), so its bank is quarantined, and stays so when the
// kernel ends later; close's finalize takes it back.
TEST(TerminalBanks, R56TimeoutQuarantinesUntilFinalize) {
  testing::Watchdog dog;
  Chip chip(4, 0, 50ms);
  RunHandle wedged = chip.worker->submit(kGated, Chip::gate(0), true);
  EXPECT_EQ(wedged.wait_for(30s).code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(chip.banks().counts().quarantined, 1u);
  EXPECT_EQ(chip.banks().settlement(wedged.run_id())->producers_stopped, false);
  g_gates[0].release();
  ASSERT_TRUE(eventually([&] { return chip.worker->set_counts().live == 0; }));
  EXPECT_EQ(chip.banks().counts().quarantined, 1u) << "a late end is no reason to hand the bank on";
  chip.expect_every_bank_accounted();
  (void)chip.worker->close(30s);
  EXPECT_EQ(chip.banks().counts().free, kTerminalBanksPerContext);
  chip.expect_every_bank_accounted();
}

// R58: the simulated chip's completion path proves its producers stopped. A
// failed run, with nothing retained (no snapshot is read), returns its bank.
TEST(TerminalBanks, R58TheSimDrainSuppliesTheProducerStopProof) {
  testing::Watchdog dog;
  Chip chip;
  chip.banks().set_retain_artifacts(false);
  RunHandle r = chip.worker->submit(kFails, Chip::gate(0), true);
  EXPECT_EQ(r.wait_for(30s).code(), StatusCode::kKernelFailed);
  const std::optional<Settlement> s = chip.banks().settlement(r.run_id());
  ASSERT_TRUE(s.has_value());
  EXPECT_TRUE(s->producers_stopped);
  EXPECT_EQ(s->proof, BankProof::kProducersStopped);
  EXPECT_TRUE(s->returned);
  EXPECT_EQ(chip.worker->terminal_snapshot(r.run_id()).status().code(), StatusCode::kNotFound) << "nothing was read";
  EXPECT_EQ(chip.banks().stats().returned_consumed, 0u);
  EXPECT_EQ(chip.banks().counts().free, kTerminalBanksPerContext);
}

// R59: completion and producer-stop reach run_close separately; no error path
// passes completed = true. Table-driven over the chip's error paths.
TEST(TerminalBanks, R59NoErrorPathClaimsCompletion) {
  testing::Watchdog dog;
  struct Case {
    const char* name;
    std::function<uint64_t(Chip&)> run;  // returns the run's epoch once it is terminal
  };
  const std::vector<Case> cases = {
      {"kernel failure",
       [](Chip& c) {
         RunHandle r = c.worker->submit(kFails, Chip::gate(0), true);
         EXPECT_EQ(r.wait_for(30s).code(), StatusCode::kKernelFailed);
         return r.run_id();
       }},
      {"refused arm",
       [](Chip& c) {
         c.banks().refuse_next_arm(1, internal_error("refused"));
         RunHandle r = c.worker->submit(kAddOne, c.inout(), true);
         EXPECT_FALSE(r.wait_for(30s).ok());
         return r.run_id();
       }},
      {"run_timeout",
       [](Chip& c) {
         RunHandle r = c.worker->submit(kGated, Chip::gate(1), true);
         EXPECT_EQ(r.wait_for(30s).code(), StatusCode::kDeadlineExceeded);
         return r.run_id();
       }},
      {"abandoning close",
       [](Chip& c) {
         RunHandle r = c.worker->submit(kGated, Chip::gate(2), true);
         EXPECT_TRUE(g_gates[2].wait_entered());
         (void)c.worker->close(0ms);
         return r.run_id();
       }},
  };
  for (const Case& c : cases) {
    Chip chip(4, 0, std::string(c.name) == "run_timeout" ? 50ms : 10min);
    const uint64_t epoch = c.run(chip);
    const std::optional<Settlement> s = chip.banks().settlement(epoch);
    ASSERT_TRUE(s.has_value()) << c.name;
    EXPECT_FALSE(s->completed) << c.name;
    EXPECT_NE(s->verdict, SettlementVerdict::kClean) << c.name;
    for (int g = 0; g < kGates; ++g) g_gates[g].release();
  }
  // And the contrast: a run that completes says so.
  Chip chip;
  RunHandle r = chip.worker->submit(kAddOne, chip.inout(), true);
  ASSERT_TRUE(r.wait_for(30s).ok());
  EXPECT_TRUE(chip.banks().settlement(r.run_id())->completed);
  EXPECT_EQ(chip.banks().settlement(r.run_id())->verdict, SettlementVerdict::kClean);
}

// R60: with retention off, a NotStarted rollback still returns the bank, and
// the same run launches once the context is back.
TEST(TerminalBanks, R60NotStartedRollbackReturnsTheCredit) {
  testing::Watchdog dog;
  Chip chip(4, 1);
  chip.banks().set_retain_artifacts(false);
  RunHandle blocker = chip.worker->submit(kGated, Chip::gate(0));
  ASSERT_TRUE(g_gates[0].wait_entered());
  Storage s;
  auto lease = chip.worker->try_acquire_lease();
  ASSERT_TRUE(lease.has_value());
  NativeRunDescriptor d;
  d.lease = *lease;
  d.arena_bank = lease->slot;
  RunConfig rc;
  rc.diagnostic = true;
  auto epoch = chip.worker->prepare(s.get(), native_run_storage_size(), d, kAddOne, chip.inout(), rc);
  ASSERT_TRUE(epoch.ok()) << epoch.status().to_string();
  Status launched;
  std::thread launcher([&] { launched = chip.worker->launch(s.get(), *epoch); });
  ASSERT_TRUE(eventually([&] { return !chip.worker->waiting_for_bank().empty(); }));
  chip.worker->execution_context().suspend();
  g_gates[0].release();
  launcher.join();
  chip.worker->execution_context().restore();
  EXPECT_EQ(launched.code(), StatusCode::kFailedPrecondition) << launched.to_string();
  EXPECT_EQ(chip.banks().stats().acquired, 1u) << "the bank was taken at the marker";
  EXPECT_EQ(chip.banks().stats().returned_submitted_nothing, 1u);
  // Asserted: a bank still held by this epoch would leave the relaunch below parked for good.
  ASSERT_EQ(chip.banks().counts().free, kTerminalBanksPerContext) << "the credit is back";
  // Unwound, not retired: the same run launches, once.
  ASSERT_TRUE(chip.worker->launch(s.get(), *epoch).ok());
  EXPECT_TRUE(chip.worker->finalize(s.get(), *epoch).ok());
  EXPECT_TRUE(blocker.wait_for(30s).ok());
  EXPECT_EQ(chip.value(), 1.0f);
  EXPECT_EQ(chip.banks().counts().free, kTerminalBanksPerContext);
}

// R61: an acquire whose arm refuses gives the bank back; nothing ran, and the
// next diagnostic run gets a bank.
TEST(TerminalBanks, R61RefusedArmReturnsTheCredit) {
  testing::Watchdog dog;
  Chip chip;
  chip.banks().refuse_next_arm(kTerminalBanksPerContext, internal_error("injected arm refusal"));
  for (uint32_t i = 0; i < kTerminalBanksPerContext; ++i) {
    RunHandle r = chip.worker->submit(kAddOne, chip.inout(), true);
    EXPECT_EQ(r.wait_for(30s).message(), "injected arm refusal");
    EXPECT_EQ(chip.banks().counts().free, kTerminalBanksPerContext) << i;
  }
  EXPECT_EQ(chip.banks().stats().returned_submitted_nothing, kTerminalBanksPerContext);
  EXPECT_EQ(chip.value(), 0.0f) << "a refused arm launches nothing";
  RunHandle next = chip.worker->submit(kAddOne, chip.inout(), true);
  ASSERT_TRUE(next.wait_for(30s).ok());
  EXPECT_EQ(chip.value(), 1.0f);
}

// R63: bank count + 1 proved-stopped failures in a row leave the table
// whole: the next diagnostic run still gets a bank.
TEST(TerminalBanks, R63CapacitySurvivesProvedStoppedFailures) {
  testing::Watchdog dog;
  Chip chip;
  // Nothing consumes the snapshots: the producer-stop proof alone must bring each bank back.
  chip.banks().set_retain_artifacts(false);
  for (uint32_t i = 0; i < kTerminalBanksPerContext + 1; ++i) {
    RunHandle r = chip.worker->submit(kFails, Chip::gate(0), true);
    EXPECT_EQ(r.wait_for(30s).code(), StatusCode::kKernelFailed) << i;
  }
  EXPECT_EQ(chip.banks().counts().free, kTerminalBanksPerContext);
  RunHandle next = chip.worker->submit(kAddOne, chip.inout(), true);
  const Status st = next.wait_for(10s);
  EXPECT_TRUE(st.ok()) << st.to_string() << "; waiting for a bank: " << chip.worker->waiting_for_bank().size();
}

// R64: a retaining close of a failed, proved-stopped run returns the bank,
// and the artifact says processing_complete: false with the cut-unknown verdict.
TEST(TerminalBanks, R64RetainedCloseReturnsTheBankWithoutClaimingCompleteness) {
  testing::Watchdog dog;
  Chip chip;
  RunHandle r = chip.worker->submit(kFails, Chip::gate(0), true);
  EXPECT_EQ(r.wait_for(30s).code(), StatusCode::kKernelFailed);
  EXPECT_EQ(chip.banks().counts().free, kTerminalBanksPerContext);
  auto a = chip.worker->terminal_snapshot(r.run_id());
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->epoch, r.run_id());
  EXPECT_FALSE(a->processing_complete);
  EXPECT_EQ(a->verdict, SettlementVerdict::kPartialCutUnknown);
  EXPECT_EQ(a->code, StatusCode::kKernelFailed);
  EXPECT_NE(a->message_view().find("injected kernel failure"), std::string_view::npos) << a->message_view();
  EXPECT_EQ(a->tasks, 1u);
}

// R65: with every bank held, a diagnostic successor is not launched, not
// failed, and named by id; after one bank is released it runs exactly once.
TEST(TerminalBanks, R65ADiagnosticSuccessorWithNoBankStaysPreparedUntilOneIsReleased) {
  testing::Watchdog dog;
  Chip chip(5, 5);
  std::vector<RunHandle> holders;
  for (int g = 0; g < 3; ++g) {
    holders.push_back(chip.worker->submit(kGated, Chip::gate(g), true));
    ASSERT_TRUE(g_gates[g].wait_entered());
  }
  ASSERT_EQ(chip.banks().counts().held, kTerminalBanksPerContext);
  RunHandle successor = chip.worker->submit(kAddOne, chip.inout(), true);
  EXPECT_EQ(chip.worker->waiting_for_bank(), std::vector<uint64_t>{successor.run_id()});
  EXPECT_FALSE(successor.done());
  EXPECT_EQ(chip.worker->launched_now(), 3u) << "launch_depth 5 had room: only the bank held it back";
  EXPECT_EQ(chip.value(), 0.0f);
  g_gates[0].release();
  ASSERT_TRUE(successor.wait_for(30s).ok());
  EXPECT_EQ(chip.value(), 1.0f) << "launched exactly once";
  EXPECT_TRUE(chip.worker->waiting_for_bank().empty());
  for (int g = 1; g < 3; ++g) g_gates[g].release();
  for (auto& h : holders) EXPECT_TRUE(h.wait_for(30s).ok());
  auto snap = chip.worker->terminal_snapshot(successor.run_id());
  ASSERT_TRUE(snap.ok());
  EXPECT_EQ(snap->verdict, SettlementVerdict::kClean);
}

// R65: the front run that found no bank keeps its place and is the one the
// next release serves; the run behind it waits for the release after.
TEST(TerminalBanks, R65ARunThatFoundNoBankStillCollectsAndIsServedOnTheNextRelease) {
  testing::Watchdog dog;
  Chip chip(6, 6);
  for (int g = 0; g < 3; ++g) {
    chip.worker->submit(kGated, Chip::gate(g), true);
    ASSERT_TRUE(g_gates[g].wait_entered());
  }
  RunHandle front = chip.worker->submit(kGated, Chip::gate(3), true);
  RunHandle behind = chip.worker->submit(kAddOne, chip.inout(), true);
  EXPECT_EQ(chip.worker->waiting_for_bank(), (std::vector<uint64_t>{front.run_id(), behind.run_id()}));
  g_gates[0].release();
  ASSERT_TRUE(g_gates[3].wait_entered()) << "the front run is served first";
  EXPECT_EQ(chip.worker->waiting_for_bank(), std::vector<uint64_t>{behind.run_id()});
  EXPECT_FALSE(behind.done());
  g_gates[1].release();
  ASSERT_TRUE(behind.wait_for(30s).ok());
  g_gates[2].release();
  g_gates[3].release();
  ASSERT_TRUE(front.wait_for(30s).ok());
  auto snap = chip.worker->terminal_snapshot(front.run_id());
  ASSERT_TRUE(snap.ok()) << "the bankless front run still collects";
  EXPECT_TRUE(snap->processing_complete);
}

// R66: with diagnostics off the bank count limits nothing: G = 8, eight runs
// held and launched at once, and no bank touched.
TEST(TerminalBanks, R66BanksBoundSnapshotsNotRuns) {
  testing::Watchdog dog;
  Chip chip(8, 8);
  std::vector<RunHandle> runs;
  // Each submit launches at once while launch_depth has room (the small chip
  // has 4 AIV cores, so only 4 kernels run; all 8 runs are on the device).
  for (int g = 0; g < 8; ++g) runs.push_back(chip.worker->submit(kGated, Chip::gate(g)));
  ASSERT_TRUE(g_gates[0].wait_entered());
  EXPECT_EQ(chip.worker->set_counts().live, 8u);
  EXPECT_EQ(chip.worker->launched_now(), 8u);
  EXPECT_EQ(chip.banks().stats().acquired, 0u);
  EXPECT_EQ(chip.banks().stats().acquire_refused, 0u);
  EXPECT_EQ(chip.banks().counts().free, kTerminalBanksPerContext);
  for (int g = 0; g < 8; ++g) g_gates[g].release();
  for (auto& r : runs) EXPECT_TRUE(r.wait_for(30s).ok());
}

}  // namespace
}  // namespace simpler
