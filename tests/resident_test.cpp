// The resident route (runtime `resident`, seed 002) beyond the conformance
// suite it runs with every runtime: a mix task's gang start, work stealing
// between clusters, no AICPU thread at a task boundary, the refusal of an
// argument dump before any bind (R91) and why a run-boundary read cannot
// stand in for a task-boundary capture (R92). Interleavings are forced with
// the route's test hooks and kernels that wait on latches, never with sleeps.
#include <gtest/gtest.h>

#include <pthread.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "chip/chip_worker.h"
#include "device/sim/sticky_fault.h"
#include "diag/args_dump_file.h"
#include "kernels.h"
#include "runtime/resident/resident_runtime.h"
#include "scratch_dir.h"
#include "simpler/simpler.h"
#include "test_util.h"

namespace simpler {
namespace {

using namespace testing;
using resident::HandOff;
using resident::Hooks;

constexpr const char* kResident = "resident";

// Installs `hooks` for one test and removes them on every exit.
struct HookScope {
  explicit HookScope(const Hooks& h) { resident::set_hooks(&h); }
  ~HookScope() { resident::set_hooks(nullptr); }
};

WorkerConfig resident_config(Geometry g = Geometry::small(), uint32_t depth = 1) {
  WorkerConfig c = small_config(depth, 256);
  c.runtime = kResident;
  c.geometry = std::move(g);
  return c;
}

std::string this_thread_name() {
  char name[32] = {};
  pthread_getname_np(pthread_self(), name, sizeof name);
  return name;
}

// ---- Gang start of a mix task ----------------------------------------------------------------

// H (AIV) holds its core until released; P (AIC) ends once H runs, and
// produces X; M (mix) reads X. So M becomes ready while H still holds one of
// the cluster's two AIV cores: its AIC and other AIV subtasks must wait for
// that core, and each of M's kernels records whether H had finished.
std::atomic<int> g_h_entered{0};
std::atomic<int> g_h_release{0};
std::atomic<int> g_h_finished{0};
std::atomic<int> g_mix_started{0};
std::atomic<int> g_mix_saw_h_finished[3];

void hold_kernel(int64_t*) {
  g_h_entered.store(1);
  if (!eventually([] { return g_h_release.load() != 0; })) simpler_kernel_fail("hold: never released");
  g_h_finished.store(1);
}
void after_h_kernel(int64_t* args) {
  if (!eventually([] { return g_h_entered.load() != 0; })) simpler_kernel_fail("after_h: H never started");
  tensor_data<int64_t>(tensor_arg(args, 0))[0] = 7;
}
template <int kSub>
void mix_probe_kernel(int64_t*) {
  // Recorded before the start is counted: the test releases H on a start.
  g_mix_saw_h_finished[kSub].store(g_h_finished.load());
  g_mix_started.fetch_add(1);
}

TEST(Resident, AMixTasksThreeSubtasksStartTogetherOnOneCluster) {
  g_h_entered = 0;
  g_h_release = 0;
  g_h_finished = 0;
  g_mix_started = 0;
  for (auto& s : g_mix_saw_h_finished) s = -1;
  enum : uint32_t { kHold = 1, kAfterH, kMixAic, kMixAiv0, kMixAiv1 };
  ChipCallable callable(
      "gang",
      [](ChipOrchestrator& o, const TaskArgs& a) -> Status {
        SIMPLER_RETURN_IF_ERROR(o.submit_aiv(kHold, TaskArgs{}).status());
        TaskArgs p;
        p.add_tensor(a[0].tensor, Tag::OutputExisting);
        SIMPLER_RETURN_IF_ERROR(o.submit_aic(kAfterH, p).status());
        TaskArgs m;
        m.add_tensor(a[0].tensor, Tag::Input);
        return o.submit_mix({kMixAic, kMixAiv0, kMixAiv1}, m).status();
      },
      make_kernels({{kHold, CoreType::AIV, "hold", hold_kernel},
                    {kAfterH, CoreType::AIC, "after_h", after_h_kernel},
                    {kMixAic, CoreType::AIC, "mix_probe_aic", mix_probe_kernel<0>},
                    {kMixAiv0, CoreType::AIV, "mix_probe_aiv0", mix_probe_kernel<1>},
                    {kMixAiv1, CoreType::AIV, "mix_probe_aiv1", mix_probe_kernel<2>}}),
      std::vector<Param>{Param::inout()});
  std::mutex mu;
  std::set<uint32_t> waiting;                                 // cores that joined M's gang and waited
  std::map<uint32_t, std::pair<uint32_t, uint32_t>> mix_ran;  // sub -> (core, from_cluster)
  Hooks hooks;
  hooks.gang_wait = [&](uint32_t core, uint32_t) {
    std::lock_guard<std::mutex> lock(mu);
    waiting.insert(core);
  };
  hooks.hand_off = [&](HandOff point, uint32_t core, uint32_t task, uint32_t sub, uint32_t from) {
    if (point != HandOff::kBeforeExecute || task != 2) return;
    std::lock_guard<std::mutex> lock(mu);
    mix_ran[sub] = {core, from};
  };
  HookScope scope(hooks);
  Harness hw(std::move(callable), resident_config(Geometry{"one_cluster", 1, 1}));
  const DeviceBuffer x = upload(hw.w, std::vector<int64_t>{0});
  TaskArgs args;
  args.add_tensor(x.view({1}, DType::I64), Tag::InOut);
  RunHandle run = hw.submit(args);
  // H is released once two of the cluster's cores wait in M's gang, or, if
  // the gang did not hold them, once one of M's kernels started.
  ASSERT_TRUE(eventually([&] {
    std::lock_guard<std::mutex> lock(mu);
    return waiting.size() >= 2 || g_mix_started.load() != 0;
  })) << "neither two gang waits nor a start of M while H held its core";
  g_h_release.store(1);
  ASSERT_TRUE(wait_run(run).ok());
  EXPECT_EQ(g_mix_started.load(), 3);
  for (int sub = 0; sub < 3; ++sub) {
    EXPECT_EQ(g_mix_saw_h_finished[sub].load(), 1)
        << "M's subtask " << sub << " started while H held a core of its cluster";
  }
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(waiting.size(), 2u) << "the two free cores waited for the third";
  ASSERT_EQ(mix_ran.size(), 3u);
  for (uint32_t sub = 0; sub < 3; ++sub) EXPECT_EQ(mix_ran[sub].first, sub) << "subtask " << sub << " on core";
  EXPECT_TRUE(hw.w.close().ok());
}

// ---- Work stealing ---------------------------------------------------------------------------

// R produces X; three successors read it and must run at the same moment
// (rendezvous_kernel fails its task otherwise). They are released into the
// ready list of the cluster whose core ended R, which has two AIV cores: the
// third runs only if a core of the other cluster takes it from there.
TEST(Resident, AClusterWithAnEmptyListStealsFromAnother) {
  g_arrived = 0;
  enum : uint32_t { kFill = 1, kMeet };
  ChipCallable callable(
      "steal",
      [](ChipOrchestrator& o, const TaskArgs& a) -> Status {
        TaskArgs r;
        r.add_tensor(a[0].tensor, Tag::OutputExisting).add_scalar(int64_t{1});
        SIMPLER_RETURN_IF_ERROR(o.submit_aiv(kFill, r).status());
        for (int i = 0; i < 3; ++i) {
          TaskArgs s;
          s.add_tensor(*a[1].tensor.tile({i}, {1}), Tag::OutputExisting).add_scalar(int64_t{3});
          s.add_tensor(a[0].tensor, Tag::Input);
          SIMPLER_RETURN_IF_ERROR(o.submit_aiv(kMeet, s).status());
        }
        return Status();
      },
      make_kernels({{kFill, CoreType::AIV, "fill", fill_kernel}, {kMeet, CoreType::AIV, "meet", rendezvous_kernel}}),
      std::vector<Param>{Param::inout(), Param::inout()});
  std::mutex mu;
  uint32_t r_cluster = UINT32_MAX;
  std::vector<std::pair<uint32_t, uint32_t>> claims;  // successors: (core's cluster, from_cluster)
  Hooks hooks;
  hooks.hand_off = [&](HandOff point, uint32_t core, uint32_t task, uint32_t, uint32_t from) {
    std::lock_guard<std::mutex> lock(mu);
    if (point == HandOff::kBeforeRelease && task == 0) r_cluster = core / 3;
    if (point == HandOff::kClaimed && task != 0) claims.emplace_back(core / 3, from);
  };
  HookScope scope(hooks);
  Harness hw(std::move(callable), resident_config());
  const DeviceBuffer x = upload(hw.w, std::vector<int64_t>{0});
  const DeviceBuffer out = upload(hw.w, std::vector<int64_t>{0, 0, 0});
  TaskArgs args;
  args.add_tensor(x.view({1}, DType::I64), Tag::InOut).add_tensor(out.view({3}, DType::I64), Tag::InOut);
  Status st = hw.run(args);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(download<int64_t>(hw.w, out, 3), (std::vector<int64_t>{1, 1, 1}));
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_NE(r_cluster, UINT32_MAX);
  ASSERT_EQ(claims.size(), 3u);
  int stolen = 0;
  for (auto [cluster, from] : claims) {
    EXPECT_EQ(from, r_cluster) << "every successor was queued on R's cluster";
    stolen += cluster != from;
  }
  EXPECT_GE(stolen, 1) << "no core of the other cluster took a successor";
  EXPECT_TRUE(hw.w.close().ok());
}

// ---- No AICPU thread at a task boundary ------------------------------------------------------

// The conformance DAG's shapes (AIC, AIV, mix, SPMD) in one run: every
// hand-off of every task happens on a core thread ("aic3", "aiv4"), none on
// an AICPU thread ("aicpu0"), and each point is reached once per subtask
// (the release once per task).
TEST(Resident, NoAicpuThreadObservesATaskStartOrFinish) {
  g_count = 0;
  enum : uint32_t { kAic = 1, kAiv, kMa, kM0, kM1 };
  ChipCallable callable(
      "shapes",
      [](ChipOrchestrator& o, const TaskArgs& a) -> Status {
        for (int i = 0; i < 4; ++i) {
          TaskArgs t;
          t.add_tensor(a[0].tensor, Tag::InOut);
          SIMPLER_RETURN_IF_ERROR(o.submit_aic(kAic, t).status());
          SIMPLER_RETURN_IF_ERROR(o.submit_aiv(kAiv, t).status());
          SIMPLER_RETURN_IF_ERROR(o.submit_mix({kMa, kM0, kM1}, t).status());
          SIMPLER_RETURN_IF_ERROR(o.submit_aiv_spmd(kAiv, t, 5).status());
        }
        return Status();
      },
      make_kernels({{kAic, CoreType::AIC, "count_aic", count_kernel},
                    {kAiv, CoreType::AIV, "count_aiv", count_kernel},
                    {kMa, CoreType::AIC, "count_ma", count_kernel},
                    {kM0, CoreType::AIV, "count_m0", count_kernel},
                    {kM1, CoreType::AIV, "count_m1", count_kernel}}),
      std::vector<Param>{Param::inout()});
  std::mutex mu;
  std::map<HandOff, int> at;
  std::set<std::string> threads;
  Hooks hooks;
  hooks.hand_off = [&](HandOff point, uint32_t, uint32_t, uint32_t, uint32_t) {
    const std::string name = this_thread_name();
    std::lock_guard<std::mutex> lock(mu);
    ++at[point];
    threads.insert(name);
  };
  HookScope scope(hooks);
  Harness hw(std::move(callable), resident_config(Geometry::a2a3()));
  const DeviceBuffer x = upload(hw.w, std::vector<int64_t>{0});
  TaskArgs args;
  args.add_tensor(x.view({1}, DType::I64), Tag::InOut);
  ASSERT_TRUE(hw.run(args).ok());
  constexpr int kSubtasks = 4 * (1 + 1 + 3 + 5);
  EXPECT_EQ(g_count.load(), kSubtasks);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(at[HandOff::kClaimed], kSubtasks);
  EXPECT_EQ(at[HandOff::kBeforeExecute], kSubtasks);
  EXPECT_EQ(at[HandOff::kAfterExecute], kSubtasks);
  EXPECT_EQ(at[HandOff::kBeforeRelease], 16);
  const std::regex core_thread("^ai[cv][0-9]+$");
  for (const std::string& t : threads) EXPECT_TRUE(std::regex_match(t, core_thread)) << "a hand-off on thread " << t;
  EXPECT_TRUE(hw.w.close().ok());
}

// ---- R91: the refusal before any bind --------------------------------------------------------

struct NativeStorage {
  NativeStorage()
      : p(static_cast<unsigned char*>(
            ::operator new (native_run_storage_size(), std::align_val_t{native_run_storage_alignment()}))) {
    std::memset(p, 0, native_run_storage_size());
  }
  ~NativeStorage() { ::operator delete (p, std::align_val_t{native_run_storage_alignment()}); }
  uint64_t magic() const {
    uint64_t m;
    std::memcpy(&m, p, sizeof m);
    return m;
  }
  unsigned char* p;
};

void add_one_i64(int64_t* args) { tensor_data<int64_t>(tensor_arg(args, 0))[0] += 1; }

// R91, as it holds once Mechanism R ships: the route captures, and the
// refusal stays on every runtime with no per-task producer (`reference`
// here). prepare with an argument dump is refused (UNIMPLEMENTED, the
// project's "unsupported") before any bind, touching nothing: the storage
// stays empty, no arena bank or retained buffer is set up, no run is
// registered, the lease is still the caller's, and the same lease then
// serves a run.
TEST(Resident, R91ADumpOnARuntimeWithoutAProducerIsRefusedBeforeAnyBindTouchingNothing) {
  EXPECT_TRUE((*runtime_named(kResident))->captures_args) << "Mechanism R lifts the refusal on the resident route";
  ASSERT_FALSE((*runtime_named("reference"))->captures_args);
  std::vector<ChipCallable> cs;
  cs.emplace_back(
      "add_one", [](ChipOrchestrator& o, const TaskArgs& a) { return o.submit_aiv(0, a).status(); },
      make_kernels({{0, CoreType::AIV, "add_one", add_one_i64}}), std::vector<Param>{Param::inout()});
  WorkerConfig config = resident_config(Geometry::small(), 2);
  config.runtime = "reference";
  auto w = ChipWorker::create(config, std::move(cs));
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ChipWorker& chip = **w;
  auto b = chip.malloc(8);
  ASSERT_TRUE(b.ok());
  const int64_t zero = 0;
  ASSERT_TRUE(chip.copy_to(*b, &zero, 8, 0).ok());
  TaskArgs args;
  args.add_tensor(b->view({1}, DType::I64), Tag::InOut);
  auto lease = chip.try_acquire_lease();
  ASSERT_TRUE(lease.has_value());
  NativeRunDescriptor desc;
  desc.lease = *lease;
  desc.arena_bank = lease->slot;
  const uint64_t free_before = chip.memory_info().free_bytes;

  for (DumpArgs mode : {DumpArgs::Partial, DumpArgs::Hybrid, DumpArgs::Full}) {
    NativeStorage s;
    RunConfig cfg;
    cfg.call.dump_args = mode;
    cfg.call.trace_dir = "/tmp/simpler_reference_r91_never_written";
    auto refused = chip.prepare(s.p, native_run_storage_size(), desc, 0, args, cfg);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kUnimplemented) << refused.status().to_string();
    EXPECT_TRUE(contains(refused.status().message(), "call.dump_args") &&
                contains(refused.status().message(), "'reference'"))
        << refused.status().to_string();
    EXPECT_EQ(s.magic(), 0u) << "the storage holds a run";
    EXPECT_EQ(chip.runner().arena_addr(desc.arena_bank), 0u) << "an arena bank was set up";
    EXPECT_EQ(chip.runner().retained_addr(lease->slot), 0u) << "the slot's retained buffer was set up";
    EXPECT_FALSE(chip.runtime().binding_held(lease->slot));
    EXPECT_EQ(chip.registered_runs(), 0u);
    EXPECT_EQ(chip.set_counts().live, 1u) << "the lease is still the caller's, and only it";
    EXPECT_EQ(chip.memory_info().free_bytes, free_before);
    EXPECT_FALSE(std::filesystem::exists(cfg.call.trace_dir));
  }
  // The same lease and bank then serve a run.
  NativeStorage s;
  auto epoch = chip.prepare(s.p, native_run_storage_size(), desc, 0, args);
  ASSERT_TRUE(epoch.ok()) << epoch.status().to_string();
  ASSERT_TRUE(chip.launch(s.p, *epoch).ok());
  ASSERT_TRUE(chip.wait(s.p, *epoch, now_ns() + 30'000'000'000ull).ok());
  ASSERT_TRUE(chip.finalize(s.p, *epoch).ok());
  int64_t x = 0;
  ASSERT_TRUE(chip.copy_from(&x, *b, 8, 0).ok());
  EXPECT_EQ(x, 1);
}

// ---- Mechanism R on the route (R93, R105, R117, R118, R129, R130) -------------------------------

std::atomic<int> g_ran[8];
template <int K>
void ran_kernel(int64_t* args) {
  g_ran[K].fetch_add(1);
  tensor_data<int64_t>(tensor_arg(args, 0))[0] += 1;
}

// X += 1, four times in a chain (tasks 0..3), AIV.
ChipCallable inc_chain() {
  return ChipCallable(
      "inc_chain",
      [](ChipOrchestrator& o, const TaskArgs& a) -> Status {
        for (uint32_t f = 0; f < 4; ++f) {
          TaskArgs t;
          t.add_tensor(a[0].tensor, Tag::InOut);
          SIMPLER_RETURN_IF_ERROR(o.submit_aiv(f, t).status());
        }
        return Status();
      },
      make_kernels({{0, CoreType::AIV, "r0", ran_kernel<0>},
                    {1, CoreType::AIV, "r1", ran_kernel<1>},
                    {2, CoreType::AIV, "r2", ran_kernel<2>},
                    {3, CoreType::AIV, "r3", ran_kernel<3>}}),
      std::vector<Param>{Param::inout()});
}

// R93, R118, R130 (A11): with dumps off the route reserves no capture
// block and enters no rendezvous (no gate access at all); with dumps on it
// reserves exactly one 18 KiB block for the run, and frees it at retirement.
TEST(Resident, R93R118TheCaptureBlockIs18KiBWhenDumpingAndAbsentOtherwise) {
  Watchdog dog;
  Harness hw(inc_chain(), resident_config());
  std::atomic<int> blocks{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<int> gate_accesses{0};
  Hooks hooks;
  hooks.capture_block = [&](uint32_t, uint64_t b) {
    blocks.fetch_add(1);
    bytes.store(b);
  };
  hooks.capture.slot_access = [&](uint32_t, uint32_t, resident::SlotWordId, resident::SlotOp) {
    gate_accesses.fetch_add(1);
  };
  HookScope scope(hooks);
  const DeviceBuffer x = upload(hw.w, std::vector<int64_t>{0});
  TaskArgs args;
  args.add_tensor(x.view({1}, DType::I64), Tag::InOut);
  ASSERT_TRUE(hw.run(args).ok());
  // After a first run: its set's arena and retained buffer stay for the next.
  const uint64_t free_before = free_bytes(hw.w);
  ASSERT_TRUE(hw.run(args).ok());
  EXPECT_EQ(blocks.load(), 0) << "dumps off reserved capture storage";
  EXPECT_EQ(gate_accesses.load(), 0) << "dumps off entered the rendezvous";
  CallConfig call;
  call.trace_dir = scratch_dir("resident", "on");
  call.dump_args = DumpArgs::Full;
  ASSERT_TRUE(wait_run(hw.w.submit(hw.h, args, call)).ok());
  EXPECT_EQ(blocks.load(), 1);
  EXPECT_EQ(bytes.load(), 18u * 1024);
  EXPECT_GT(gate_accesses.load(), 0);
  EXPECT_EQ(free_bytes(hw.w), free_before) << "the capture block outlived its run";
  EXPECT_EQ(download<int64_t>(hw.w, x, 1)[0], 12);
}

// R105: a dependent successor is claimed only after its predecessor's AFTER
// phase settled (the settle precedes the predecessor's release of its
// successors on the same core thread; the order comes from one event log).
TEST(Resident, R105ASuccessorIsDispatchedOnlyAfterItsPredecessorsAfterSeal) {
  Watchdog dog;
  Harness hw(inc_chain(), resident_config());
  std::mutex mu;
  std::vector<std::tuple<int, uint32_t, uint32_t>> log;  // (kind, core, task)
  Hooks hooks;
  hooks.capture.point = [&](resident::CapturePoint p, uint32_t core, uint32_t, uint64_t) {
    if (p != resident::CapturePoint::kSettled) return;
    std::lock_guard<std::mutex> lock(mu);
    log.emplace_back(0, core, 0);
  };
  hooks.hand_off = [&](HandOff point, uint32_t core, uint32_t task, uint32_t, uint32_t) {
    if (point != HandOff::kClaimed && point != HandOff::kBeforeRelease) return;
    std::lock_guard<std::mutex> lock(mu);
    log.emplace_back(point == HandOff::kClaimed ? 1 : 2, core, task);
  };
  HookScope scope(hooks);
  const DeviceBuffer x = upload(hw.w, std::vector<int64_t>{0});
  TaskArgs args;
  args.add_tensor(x.view({1}, DType::I64), Tag::InOut);
  CallConfig call;
  call.trace_dir = scratch_dir("resident", "r105");
  call.dump_args = DumpArgs::Full;
  ASSERT_TRUE(wait_run(hw.w.submit(hw.h, args, call)).ok());
  std::lock_guard<std::mutex> lock(mu);
  std::map<uint32_t, size_t> settled_at;  // task -> index of its settle
  std::map<uint32_t, size_t> last_settle_on_core;
  for (size_t i = 0; i < log.size(); ++i) {
    const auto& [kind, core, task] = log[i];
    if (kind == 0) last_settle_on_core[core] = i;
    if (kind == 2) {
      ASSERT_TRUE(last_settle_on_core.count(core)) << "task " << task << " released before any settle on its core";
      settled_at[task] = last_settle_on_core[core];
    }
  }
  ASSERT_EQ(settled_at.size(), 4u);
  for (size_t i = 0; i < log.size(); ++i) {
    const auto& [kind, core, task] = log[i];
    if (kind == 1 && task > 0) {
      EXPECT_GT(i, settled_at[task - 1]) << "task " << task << " was claimed before task " << task - 1 << " settled";
    }
  }
}

// R113, R115, R117, R129 (A10) on the route: the AICPU stops answering, the
// first task's BEFORE publisher times out (abort CAS), then the AICPU
// answers Aborted. The run fails with ARGS_CAPTURE_TIMEOUT, no kernel of
// the chain runs, the dump reads incomplete (accounting unknown), and the
// capture block is freed only when the run retired.
TEST(Resident, R129AnInducedCaptureTimeoutFailsTheRunRunningNothingAndLeavesTheDumpUnknown) {
  Watchdog dog;
  for (auto& r : g_ran) r = 0;
  Harness hw(inc_chain(), resident_config());
  std::atomic<bool> aborted{false};
  Hooks hooks;
  hooks.capture_config.first_budget_ns = 50'000'000;
  hooks.capture_config.second_budget_ns = 20'000'000'000;
  hooks.capture.point = [&](resident::CapturePoint p, uint32_t, uint32_t, uint64_t) {
    if (p == resident::CapturePoint::kAbortCas) aborted.store(true);
  };
  HookScope scope(hooks);
  const DeviceBuffer x = upload(hw.w, std::vector<int64_t>{5});
  TaskArgs args;
  args.add_tensor(x.view({1}, DType::I64), Tag::InOut);
  hooks.capture.serve = {};
  ASSERT_TRUE(hw.run(args).ok());  // the set's arena and retained buffer now exist
  hooks.capture.serve = [&](uint32_t) { return aborted.load(); };
  for (auto& r : g_ran) r = 0;
  const uint64_t free_before = free_bytes(hw.w);
  CallConfig call;
  call.trace_dir = scratch_dir("resident", "abort");
  call.dump_args = DumpArgs::Full;
  // The run's own DEADLINE_EXCEEDED is its result; the test's deadline is 30 s.
  const Status st = hw.w.submit(hw.h, args, call).wait_for(std::chrono::seconds(30));
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "ARGS_CAPTURE_TIMEOUT")) << st.to_string();
  for (int k = 0; k < 4; ++k) EXPECT_EQ(g_ran[k].load(), 0) << "kernel " << k << " ran after the abort";
  EXPECT_EQ(download<int64_t>(hw.w, x, 1)[0], 9) << "the first, undumped run added 4; the aborted one nothing";
  auto dump = load_args_dump(call.trace_dir + "/args_dump");
  ASSERT_TRUE(dump.ok()) << dump.status().to_string();
  EXPECT_FALSE(dump->complete) << "an aborted capture's accounting must read unknown";
  EXPECT_EQ(dump->counts.collected, 0u);
  EXPECT_EQ(dump->counts.total, dump->counts.collected + dump->counts.dropped);
  EXPECT_EQ(free_bytes(hw.w), free_before);
}

// R117, R57 (ties): an aborted capture leaves its lane's terminal unclosed,
// so nothing proves the producer stopped: the run's terminal bank is
// quarantined (not returned) until finalize, and the dump's accounting reads
// unknown. A clean dumping run before it returns its bank, and close's
// finalize takes the quarantined one back.
TEST(Resident, R117AnAbortedCaptureQuarantinesTheBankUntilFinalize) {
  Watchdog dog;
  std::vector<ChipCallable> cs;
  cs.push_back(inc_chain());
  auto made = ChipWorker::create(resident_config(), std::move(cs));
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  ChipWorker& chip = **made;
  auto x = chip.malloc(8);
  ASSERT_TRUE(x.ok());
  const int64_t zero = 0;
  ASSERT_TRUE(chip.copy_to(*x, &zero, 8, 0).ok());
  TaskArgs args;
  args.add_tensor(x->view({1}, DType::I64), Tag::InOut);
  std::atomic<bool> aborted{false};
  std::atomic<bool> silent{false};
  Hooks hooks;
  hooks.capture_config.first_budget_ns = 50'000'000;
  hooks.capture_config.second_budget_ns = 20'000'000'000;
  hooks.capture.point = [&](resident::CapturePoint p, uint32_t, uint32_t, uint64_t) {
    if (p == resident::CapturePoint::kAbortCas) aborted.store(true);
  };
  hooks.capture.serve = [&](uint32_t) { return !silent.load() || aborted.load(); };
  HookScope scope(hooks);
  CallConfig call;
  call.dump_args = DumpArgs::Full;
  call.trace_dir = scratch_dir("resident", "clean");
  RunHandle clean = chip.submit(0, args, call);
  ASSERT_TRUE(clean.wait_for(std::chrono::seconds(30)).ok());
  const std::optional<Settlement> c = chip.terminal_banks().settlement(clean.run_id());
  ASSERT_TRUE(c.has_value());
  EXPECT_TRUE(c->returned) << "a clean capture's bank was not returned";
  EXPECT_EQ(chip.terminal_banks().counts().quarantined, 0u);

  silent.store(true);
  call.trace_dir = scratch_dir("resident", "aborted");
  RunHandle bad = chip.submit(0, args, call);
  const Status st = bad.wait_for(std::chrono::seconds(30));
  EXPECT_TRUE(contains(st.message(), "ARGS_CAPTURE_TIMEOUT")) << st.to_string();
  const std::optional<Settlement> q = chip.terminal_banks().settlement(bad.run_id());
  ASSERT_TRUE(q.has_value());
  EXPECT_TRUE(q->quarantined) << "an aborted capture's bank was handed back";
  EXPECT_FALSE(q->returned);
  EXPECT_FALSE(q->producers_stopped);
  EXPECT_EQ(q->verdict, SettlementVerdict::kPartialCutUnknown);
  EXPECT_EQ(chip.terminal_banks().counts().quarantined, 1u);
  auto dump = load_args_dump(call.trace_dir + "/args_dump");
  ASSERT_TRUE(dump.ok()) << dump.status().to_string();
  EXPECT_FALSE(dump->complete) << "the host must report the argument accounting unknown";
  ASSERT_TRUE(chip.close(std::chrono::seconds(30)).ok());
  EXPECT_EQ(chip.terminal_banks().counts().quarantined, 0u) << "finalize did not take the quarantined bank back";
  EXPECT_GE(chip.terminal_banks().stats().finalize_returned, 1u);
}

// What the route does not capture says so: a dumping run with an SPMD task
// is refused at prepare (its blocks run on any cluster; the gate is one
// cluster's), naming the field and the task.
TEST(Resident, ADumpOfAnSpmdTaskIsRefusedNamingTheTask) {
  ChipCallable callable(
      "spmd",
      [](ChipOrchestrator& o, const TaskArgs& a) -> Status {
        TaskArgs t;
        t.add_tensor(a[0].tensor, Tag::InOut);
        return o.submit_aiv_spmd(0, t, 4).status();
      },
      make_kernels({{0, CoreType::AIV, "r0", ran_kernel<0>}}), std::vector<Param>{Param::inout()});
  Harness hw(std::move(callable), resident_config());
  const DeviceBuffer x = upload(hw.w, std::vector<int64_t>{0});
  TaskArgs args;
  args.add_tensor(x.view({1}, DType::I64), Tag::InOut);
  CallConfig call;
  call.trace_dir = scratch_dir("resident", "spmd");
  call.dump_args = DumpArgs::Full;
  EXPECT_REFUSED(hw.w.submit(hw.h, args, call).result(), StatusCode::kUnimplemented, "dump_args");
}

// ---- R92: a run-boundary read is not a task's data -------------------------------------------

// R92: A increments X (inout), B copies X to Y, C increments X again. What
// the tasks saw at their own boundaries, read on their core at the route's
// hand-off points, differs from both instants an AICPU thread owns on this
// route: before the run, X still holds the value before A (so it is not
// B's input), and after it X holds C's write (so it is not A's output).
TEST(Resident, R92ARunBoundaryReadIsNotATaskBoundaryCapture) {
  ChipCallable callable(
      "chain",
      [](ChipOrchestrator& o, const TaskArgs& a) -> Status {
        TaskArgs inc;
        inc.add_tensor(a[0].tensor, Tag::InOut);
        SIMPLER_RETURN_IF_ERROR(o.submit_aiv(1, inc).status());  // A
        TaskArgs copy;
        copy.add_tensor(a[0].tensor, Tag::Input).add_tensor(a[1].tensor, Tag::OutputExisting);
        SIMPLER_RETURN_IF_ERROR(o.submit_aiv(2, copy).status());  // B
        return o.submit_aiv(1, inc).status();                     // C
      },
      make_kernels({{1, CoreType::AIV, "add_one", add_one_i64}, {2, CoreType::AIV, "copy", copy_kernel}}),
      std::vector<Param>{Param::inout(), Param::inout()});
  Harness hw(std::move(callable), resident_config());
  const DeviceBuffer x = upload(hw.w, std::vector<int64_t>{40});
  const DeviceBuffer y = upload(hw.w, std::vector<int64_t>{0});
  // Device memory is host-mapped on the sim; the hooks run on the cores,
  // ordered after A's kernel and before B's by the route itself.
  const auto* x_on_device = reinterpret_cast<const int64_t*>(x.addr);
  std::atomic<int64_t> a_output{-1};
  std::atomic<int64_t> b_input{-1};
  Hooks hooks;
  hooks.hand_off = [&](HandOff point, uint32_t, uint32_t task, uint32_t, uint32_t) {
    // The boundaries a capture must use: A's end, before its successor is released; B's start.
    if (point == HandOff::kAfterExecute && task == 0) a_output = *x_on_device;
    if (point == HandOff::kBeforeExecute && task == 1) b_input = *x_on_device;
  };
  HookScope scope(hooks);
  const int64_t pre_run = download<int64_t>(hw.w, x, 1)[0];
  TaskArgs args;
  args.add_tensor(x.view({1}, DType::I64), Tag::InOut).add_tensor(y.view({1}, DType::I64), Tag::InOut);
  ASSERT_TRUE(hw.run(args).ok());
  const int64_t post_run = download<int64_t>(hw.w, x, 1)[0];
  EXPECT_EQ(a_output.load(), 41);
  EXPECT_EQ(b_input.load(), 41);
  EXPECT_EQ(download<int64_t>(hw.w, y, 1)[0], 41) << "B consumed A's output";
  EXPECT_NE(pre_run, b_input.load()) << "a pre-run read would be B's input";
  EXPECT_EQ(pre_run, 40);
  EXPECT_NE(post_run, a_output.load()) << "a post-run read would be A's output";
  EXPECT_EQ(post_run, 42);
  EXPECT_TRUE(hw.w.close().ok());
}

// ---- Failures ---------------------------------------------------------------------------------

// A kernel failure fails the run with the text every runtime reports for
// it, and its successors are poisoned, not run.
TEST(Resident, AKernelFailureReadsAsOnHostBuildGraph) {
  auto run_on = [](const char* runtime) {
    g_count = 0;
    ChipCallable callable(
        "fails",
        [](ChipOrchestrator& o, const TaskArgs& a) -> Status {
          TaskArgs bad;
          bad.add_tensor(a[0].tensor, Tag::OutputExisting).add_scalar(int64_t{-5});
          SIMPLER_RETURN_IF_ERROR(o.submit_aiv(1, bad).status());
          TaskArgs after;
          after.add_tensor(a[0].tensor, Tag::InOut);
          return o.submit_aiv(2, after).status();
        },
        make_kernels({{1, CoreType::AIV, "check", check_kernel}, {2, CoreType::AIV, "count", count_kernel}}),
        std::vector<Param>{Param::inout()});
    WorkerConfig c = resident_config();
    c.runtime = runtime;
    Harness hw(std::move(callable), c);
    const DeviceBuffer x = upload(hw.w, std::vector<int64_t>{0});
    TaskArgs args;
    args.add_tensor(x.view({1}, DType::I64), Tag::InOut);
    Status st = hw.run(args);
    EXPECT_EQ(g_count.load(), 0) << runtime << ": a poisoned successor ran";
    EXPECT_TRUE(hw.w.close().ok());
    return st;
  };
  const Status resident = run_on(kResident);
  EXPECT_EQ(resident.code(), StatusCode::kKernelFailed) << resident.to_string();
  EXPECT_EQ(resident, run_on("host_build_graph"));
}

// A sticky device fault (H3) raised when a task starts on a core of this
// route fails the run with the fault, and its successor starts no kernel: the
// core runs kernels through the device's CoreExecutor, which keeps the check.
TEST(Resident, AStickyDeviceFaultFailsTheRunAndStartsNoFurtherKernel) {
  g_count = 0;
  ChipCallable callable(
      "faults",
      [](ChipOrchestrator& o, const TaskArgs& a) -> Status {
        TaskArgs t;
        t.add_tensor(a[0].tensor, Tag::InOut);
        SIMPLER_RETURN_IF_ERROR(o.submit_aiv(1, t).status());
        SIMPLER_RETURN_IF_ERROR(o.submit_aiv(2, t).status());
        return o.submit_aiv(1, t).status();
      },
      make_kernels({{1, CoreType::AIV, "count", count_kernel}, {2, CoreType::AIV, "count_trigger", count_kernel}}),
      std::vector<Param>{Param::inout()});
  Harness hw(std::move(callable), resident_config());
  const DeviceBuffer x = upload(hw.w, std::vector<int64_t>{0});
  TaskArgs args;
  args.add_tensor(x.view({1}, DType::I64), Tag::InOut);
  arm_device_fault_hook(2, 1);
  const Status st = hw.run(args);
  disarm_device_fault_hook();
  EXPECT_EQ(st.code(), StatusCode::kDeviceFault) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "sticky device fault (H3 test hook) when task 1")) << st.to_string();
  EXPECT_EQ(g_count.load(), 1) << "only the task before the fault ran a kernel";
  (void)hw.w.close();
}

}  // namespace
}  // namespace simpler
