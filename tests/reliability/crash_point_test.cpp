// T2 of the reliability plan: crash-point enumeration, SQLite style. A node
// of 2 forked chip children (two endpoints, the real fork-mode path: fork
// server, ChipChildHandler, simulated device) gets 3 runs per chip in flight,
// held by a gate so both frames and 3 entries of each are busy at once; H1
// (src/ipc/test_hooks.h) kills chip 0 with SIGKILL at its N-th mailbox store,
// :before or :after the store. N = 1, 2, ... until a pass no longer reaches
// the N-th store. Every pass checks: each submitted run has exactly one
// terminal; a run on chip 0 ends ok only if H1's log holds that child's
// DONE terminal store for it; chip 1 completes everything; no kernel ran
// twice (each run's kernel counts its executions in the shared heap); the
// node's run-set accounting is a partition, nothing live at the end, and a
// quarantined set would need a logged cause (the node has none to give, so
// none may be quarantined); after the kill the replacement serves a run.
// Then the health scan. Prints
// `RELIABILITY T2 crash_points=.. ok=.. endpoint_failed=.. quarantined=.. max_recovery_ms=..`.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "health_scan.h"
#include "ipc/test_hooks.h"
#include "node/node_worker.h"
#include "node_test_util.h"
#include "test_util.h"

namespace simpler::testing {
namespace {

constexpr uint32_t kChips = 2;
constexpr uint32_t kRunsPerChip = 3;
constexpr uint32_t kRuns = kChips * kRunsPerChip;
constexpr uint32_t kDepth = kRuns + 1;  // all in flight at once, and the replacement's run after them
constexpr int kGate = 0;
constexpr const char* kTarget = "simpler-chip0";
// The child H1 kills is always chip 0's first. Not read from the node after
// create(): a kill just after the INIT_READY store lets the publisher
// replace that child before create() has even returned.
constexpr uint64_t kFirstIncarnation = 1;

// counter[0] += 1 once gate args[1] is open: how many times the run's kernel
// executed. Each run has a counter of its own in the shared heap.
extern "C" void t2_count_kernel(int64_t* args) {
  const int gate = static_cast<int>(args[1]);
  if (gate >= 0 &&
      !spin_then_park(
          g_node_gates->bell, [&] { return g_node_gates->is_open(gate); }, SpinPolicy{}, now_ns() + kTestWaitNs)) {
    simpler_kernel_fail("t2_count_kernel: gate never opened");
    return;
  }
  tensor_data<int32_t>(tensor_arg(args, 0))[0] += 1;
}

ChipCallable count_callable() {
  KernelLibrary k;
  EXPECT_TRUE(k.add_function(0, CoreType::AIV, "t2_count_kernel", t2_count_kernel).ok());
  return ChipCallable("t2_count", [](ChipOrchestrator& o, const TaskArgs& a) { return o.submit_aiv(0, a).status(); }, k,
                      {Param::inout(), Param::scalar()});
}

// What one pass found.
struct Pass {
  bool fired = false;
  bool created = true;
  uint64_t ok = 0;
  uint64_t failed = 0;
  uint64_t quarantined = 0;
  uint64_t recovery_ns = 0;
};

struct Totals {
  uint64_t points = 0;
  uint64_t ok = 0;
  uint64_t failed = 0;
  uint64_t quarantined = 0;
  uint64_t init_kills = 0;
  uint64_t max_recovery_ns = 0;
  std::map<std::string, uint64_t> kinds;  // which store each kill was at
};

std::string where(uint64_t n, FaultWhen when) {
  return fmt::format("N={}:{}", n, when == FaultWhen::kBefore ? "before" : "after");
}

// One pass: a node, kRuns runs through the gate, the kill (if N is reached),
// the checks. Failures name the pass.
Pass run_pass(uint64_t n, FaultWhen when, const CallableHandle& callable, NodeSpec spec) {
  SCOPED_TRACE(where(n, when));
  Pass pass;
  store_release(g_node_gates->open[kGate], 0u);
  arm_fault_store(kTarget, n, when);
  auto created = NodeWorker::create(std::move(spec));
  if (!created.ok()) {
    // Killed before INIT_READY: the node refuses to start, and no run exists.
    const FaultStoreLog log = fault_store_log();
    EXPECT_TRUE(log.fired) << "the node failed to start with no kill: " << created.status().to_string();
    EXPECT_EQ(log.terminals.size(), 0u);
    pass.fired = log.fired;
    pass.created = false;
    return pass;
  }
  std::unique_ptr<NodeWorker> w = std::move(created).value();
  // A buffer per run, so no run's tensor orders it behind another's.
  std::vector<DeviceBuffer> counters;
  std::vector<int32_t*> count;
  for (uint32_t i = 0; i <= kRuns; ++i) {
    auto b = w->malloc_shared(sizeof(int32_t));
    EXPECT_TRUE(b.ok()) << b.status().to_string();
    if (!b.ok()) return pass;
    counters.push_back(*b);
    count.push_back(reinterpret_cast<int32_t*>(b->addr));
    *count.back() = 0;
  }

  TerminalLedger ledger;
  std::vector<std::atomic<uint64_t>> ended_ns(kRuns + 1);
  std::vector<RunHandle> runs;
  std::vector<uint64_t> ids;
  auto submit = [&](uint32_t i, uint32_t chip) {
    const TensorView c(counters[i], {1}, DType::I32);
    RunHandle h = w->submit(
        [&, c, chip](Orchestrator& o) {
          TaskArgs a;
          a.add_tensor(c, Tag::InOut).add_scalar(kGate);
          return o.submit_next_level(callable, a, chip).status();
        },
        [&ledger, &ended_ns, i](const Status& st) {
          ended_ns[i].store(now_ns());
          ledger.record(i, st);
        });
    ledger.submitted(i);
    runs.push_back(h);
    ids.push_back(h.run_id());
  };
  // Run i on chip i % 2: chip 0 holds runs 0, 2, 4 at once.
  for (uint32_t i = 0; i < kRuns; ++i) submit(i, i % kChips);
  g_node_gates->open_gate(kGate);
  std::vector<Status> results;
  for (RunHandle& h : runs) {
    results.push_back(h.wait_for(kWait));
    EXPECT_TRUE(h.done()) << "run " << h.run_id() << " has no terminal after " << kWait.count() << " s";
  }
  FaultStoreLog log = fault_store_log();
  pass.fired = log.fired;
  if (log.fired) {
    // The replacement (a child of the same name, not killed again) serves.
    const Status replaced = w->next_child(0).await_replacement(kFirstIncarnation, now_ns() + kTestWaitNs);
    EXPECT_TRUE(replaced.ok()) << replaced.to_string();
    EXPECT_FALSE(w->next_child(0).failure().has_value()) << w->next_child(0).failure()->to_string();
    submit(kRuns, 0);
    results.push_back(runs.back().wait_for(kWait));
    EXPECT_TRUE(results.back().ok()) << "the replacement's run: " << results.back().to_string();
    EXPECT_EQ(*count[kRuns], 1) << "the replacement's run executed " << *count[kRuns] << " times";
  }

  // Each chip 0 run that ends ok needs its DONE terminal stored by a child.
  std::map<uint64_t, uint32_t> stored_done;
  for (const LoggedTerminal& t : log.terminals) stored_done[t.run_id] += t.state == kMailboxTaskDone;
  EXPECT_FALSE(log.terminals_truncated);
  for (uint32_t i = 0; i < kRuns; ++i) {
    const Status& st = results[i];
    EXPECT_LE(*count[i], 1) << "run " << ids[i] << "'s kernel executed " << *count[i] << " times";
    if (st.ok()) {
      ++pass.ok;
      EXPECT_EQ(*count[i], 1) << "run " << ids[i] << " ended ok without its kernel executing";
      if (i % kChips == 0) {
        EXPECT_EQ(stored_done[ids[i]], 1u)
            << "run " << ids[i] << " ended ok, but chip 0 stored no DONE terminal for it";
      }
    } else {
      ++pass.failed;
      EXPECT_TRUE(log.fired) << "run " << ids[i] << " failed with no kill: " << st.to_string();
      EXPECT_EQ(i % kChips, 0u) << "run " << ids[i] << " on chip 1, the other endpoint, failed: " << st.to_string();
      EXPECT_EQ(st.code(), StatusCode::kAborted) << st.to_string();
      if (ended_ns[i].load() > log.killed_ns) {
        pass.recovery_ns = std::max(pass.recovery_ns, ended_ns[i].load() - log.killed_ns);
      }
    }
  }
  if (log.fired && log.kind == StoreKind::kEntryTerminal && log.when == FaultWhen::kBefore) {
    // The terminal the kill prevented: that run cannot have ended ok.
    for (uint32_t i = 0; i < kRuns; ++i) {
      if (ids[i] == log.run_id) {
        EXPECT_FALSE(results[i].ok()) << "run " << ids[i] << " ended ok, but its child died before its terminal store";
      }
    }
  }
  const ArenaCounts sets = w->run_set_counts();
  if (auto bad = check_partition("node run sets", sets, kDepth)) ADD_FAILURE() << *bad;
  EXPECT_EQ(sets.live, 0u);
  // No cause is ever logged for a node set: it is the parent's own, and the
  // run holding it ended, so none may stay quarantined.
  EXPECT_EQ(sets.quarantined, 0u);
  pass.quarantined = sets.quarantined;
  for (const DeviceBuffer& b : counters) EXPECT_TRUE(w->free(b).ok());
  const Status closed = w->close(std::chrono::seconds(30));
  // A kill among the close's own stores (the exit sweep) is reported by close.
  log = fault_store_log();
  if (!log.fired) {
    EXPECT_TRUE(closed.ok()) << closed.to_string();
  }
  pass.fired = log.fired;
  w.reset();
  const TerminalLedger::Summary s = ledger.check();
  for (const std::string& p : s.problems) ADD_FAILURE() << "ledger: " << p;
  EXPECT_EQ(s.terminals, s.submitted);
  return pass;
}

TEST(CrashPoints, T2EveryChildStoreIsASurvivableCrashPoint) {
  Watchdog dog(std::chrono::seconds(600));
  const HealthScan health;
  make_node_gates();
  NodeSpec spec;
  spec.config = node_config(kChips, 0, kDepth);
  spec.chip_callables = {count_callable()};
  const CallableHandle callable{0, spec.chip_callables[0].digest()};

  // Sanitizer builds cover every other N on each side, alternating, so
  // every store still meets one of the two kills.
  const uint64_t stride = kSanitized ? 2 : 1;
  // SIMPLER_T2_VERBOSE=1 prints each pass's kill and outcome.
  const char* v = std::getenv("SIMPLER_T2_VERBOSE");
  const bool verbose = v != nullptr && *v != '\0' && *v != '0';
  Totals t;
  const IdentityCounts identity_before = identity_counts();
  const auto t0 = std::chrono::steady_clock::now();
  for (const FaultWhen when : {FaultWhen::kBefore, FaultWhen::kAfter}) {
    uint64_t n = kSanitized && when == FaultWhen::kAfter ? 2 : 1;
    for (;; n += stride) {
      const Pass p = run_pass(n, when, callable, spec);
      if (::testing::Test::HasFatalFailure()) break;
      if (!p.fired) break;  // the child made fewer than N stores: every point is covered
      ++t.points;
      const FaultStoreLog log = fault_store_log();
      ++t.kinds[store_kind_name(log.kind)];
      if (verbose) {
        std::printf("T2 %s: %s store (entry %u, run %llu), ok %llu, failed %llu, recovery %.1f ms\n",
                    where(n, when).c_str(), store_kind_name(log.kind), log.entry,
                    static_cast<unsigned long long>(log.run_id), static_cast<unsigned long long>(p.ok),
                    static_cast<unsigned long long>(p.failed), static_cast<double>(p.recovery_ns) / 1e6);
      }
      t.init_kills += p.created ? 0 : 1;
      t.ok += p.ok;
      t.failed += p.failed;
      t.quarantined += p.quarantined;
      t.max_recovery_ns = std::max(t.max_recovery_ns, p.recovery_ns);
      ASSERT_LT(n, 1000u) << "the enumeration does not end: the child never runs out of stores";
      if (::testing::Test::HasFailure()) break;  // one red pass is enough to read
    }
  }
  disarm_fault_store();
  health.expect_clean();
  // H5: every request a child took carried its own payload.
  const uint64_t identity_checked = identity_counts().checked - identity_before.checked;
  const uint64_t identity_mismatch = identity_counts().mismatches - identity_before.mismatches;
  EXPECT_GT(identity_checked, 0u);
  EXPECT_EQ(identity_mismatch, 0u) << "a child took another publication's payload";
  EXPECT_GT(t.points, 2u * 20u / (kSanitized ? 2 : 1)) << "chip 0 makes more stores than this in a pass";
  std::string kinds;
  for (const auto& [k, v] : t.kinds) kinds += fmt::format("{}{}={}", kinds.empty() ? "" : ",", k, v);
  std::printf("T2: kills by store kind: %s; %llu kills before INIT_READY; %.1f s\n", kinds.c_str(),
              static_cast<unsigned long long>(t.init_kills),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  std::printf(
      "RELIABILITY T2 crash_points=%llu ok=%llu endpoint_failed=%llu quarantined=%llu max_recovery_ms=%.1f "
      "identity_checked=%llu identity_mismatch=%llu\n",
      static_cast<unsigned long long>(t.points), static_cast<unsigned long long>(t.ok),
      static_cast<unsigned long long>(t.failed), static_cast<unsigned long long>(t.quarantined),
      static_cast<double>(t.max_recovery_ns) / 1e6, static_cast<unsigned long long>(identity_checked),
      static_cast<unsigned long long>(identity_mismatch));
}

}  // namespace
}  // namespace simpler::testing
