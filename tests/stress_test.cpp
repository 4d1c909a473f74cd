// T9 of the reliability plan: the chip level under as much concurrency as its
// threading contracts allow, so that ThreadSanitizer (CI runs this binary
// under it) sees every interleaving the oversubscribed 2-core machine makes.
//   (a) Worker::submit from one controlling thread, 8 waiter threads on the
//       handles: seeded random DAGs of 1-16 tasks, some failing on purpose.
//   (b) The native lifecycle from 8 driver threads, each driving its own
//       runs (prepare, launch, poll, wait, finalize; some finalized without
//       launch), with regrants between rounds while every driver is idle.
//   (c) R49: finalize and regrant raced against a phase call parked in
//       wait() and polling on; polls without a pause against finalize;
//       launch against finalize; two finalizes of one run; many times over.
// (a) and (b) run at launch_depth = grant and with a launch queue.
// Every run's outputs are checked bit for bit against a host model, every run
// gets exactly one terminal (TerminalLedger), every blocking wait has a
// deadline, and each test ends with the health scan.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "base/doorbell.h"
#include "base/errors.h"
#include "chip/chip_worker.h"
#include "health_scan.h"
#include "kernels.h"
#include "test_util.h"

namespace simpler::testing {
namespace {

using Clock = std::chrono::steady_clock;

// ---- Lane DAGs ---------------------------------------------------------------------------------
//
// A run's buffer holds kLanes lanes of kLaneLen i64. Its DAG is 1-16 tasks,
// each writing one lane: fill (check_kernel with a value >= 0), affine
// (order-sensitive, on an AIV or an AIC core), copy from another lane, or,
// in a failing run, one check_kernel with a negative value. Tasks meet
// through their lanes' tags, so the DAG has both chains and independent
// branches; the final buffer equals applying the ops in submission order.
constexpr int kLanes = 4;
constexpr int kLaneLen = 8;
constexpr int kMaxTasks = 16;
constexpr int64_t kModulus = 1000003;  // affine_kernel's
constexpr uint64_t kBufferBytes = kLanes * kLaneLen * sizeof(int64_t);
enum FuncId : uint32_t { kAffineAiv = 0, kAffineAic = 1, kCopyFn = 2, kCheckFn = 3 };

struct LaneOp {
  enum Kind : uint8_t { kFill, kAffine, kCopy, kFail } kind = kFill;
  bool aic = false;
  int lane = 0;
  int src = 0;
  int64_t value = 0;
};

// The DAG of a run, from its seed alone: the orchestration and the host model both call it.
std::vector<LaneOp> lane_dag(uint64_t seed, bool failing) {
  uint64_t s = seed;
  const int n = 1 + static_cast<int>(splitmix(s) % kMaxTasks);
  const int fail_at = failing ? static_cast<int>(splitmix(s) % n) : -1;
  std::vector<LaneOp> ops(n);
  for (int i = 0; i < n; ++i) {
    LaneOp& op = ops[i];
    const uint64_t r = splitmix(s) % 8;
    op.lane = static_cast<int>(splitmix(s) % kLanes);
    if (i == fail_at) {
      op.kind = LaneOp::kFail;
      op.value = -1 - static_cast<int64_t>(splitmix(s) % 1000);
    } else if (r < 2) {
      op.kind = LaneOp::kFill;
      op.value = static_cast<int64_t>(splitmix(s) % kModulus);
    } else if (r < 4) {
      op.kind = LaneOp::kCopy;
      op.src = (op.lane + 1 + static_cast<int>(splitmix(s) % (kLanes - 1))) % kLanes;
    } else {
      op.kind = LaneOp::kAffine;
      op.aic = r == 7;
      op.value = static_cast<int64_t>(splitmix(s) % 1000);
    }
  }
  return ops;
}

// What the host knows of a run's buffer: the values, and which lanes hold them
// (a failed run leaves the lanes it touched unknown).
struct LaneModel {
  std::array<int64_t, kLanes * kLaneLen> v{};
  std::array<bool, kLanes> known{};

  static LaneModel random(uint64_t seed) {
    LaneModel m;
    for (auto& x : m.v) x = static_cast<int64_t>(splitmix(seed) % kModulus);
    m.known.fill(true);
    return m;
  }
  int64_t* lane(int l) { return v.data() + l * kLaneLen; }
  void apply(const LaneOp& op) {
    int64_t* dst = lane(op.lane);
    switch (op.kind) {
      case LaneOp::kFill:
        std::fill(dst, dst + kLaneLen, op.value);
        known[op.lane] = true;
        break;
      case LaneOp::kAffine:
        for (int i = 0; i < kLaneLen; ++i) dst[i] = (dst[i] * 3 + op.value) % kModulus;
        break;
      case LaneOp::kCopy:
        std::copy(lane(op.src), lane(op.src) + kLaneLen, dst);
        known[op.lane] = known[op.src];
        break;
      case LaneOp::kFail:
        break;
    }
  }
  // After a failed run: which lanes ran is the runtime's business, so none is known.
  void forget() { known.fill(false); }
  // The first known element that differs from `got`, described; empty when they agree.
  std::string diff(const int64_t* got) const {
    for (int l = 0; l < kLanes; ++l) {
      if (!known[l]) continue;
      for (int i = 0; i < kLaneLen; ++i) {
        const int k = l * kLaneLen + i;
        if (got[k] != v[k]) return fmt::format("lane {} element {}: got {}, the host computed {}", l, i, got[k], v[k]);
      }
    }
    return {};
  }
};

Status lanes_orchestration(ChipOrchestrator& o, const TaskArgs& a) {
  const DeviceBuffer buf = a[0].tensor.buffer();
  auto lane = [&](int l) { return TensorView(buf, {kLaneLen}, DType::I64, static_cast<int64_t>(l) * kLaneLen); };
  for (const LaneOp& op : lane_dag(a[1].scalar, a[2].scalar != 0)) {
    TaskArgs t;
    Status st;
    switch (op.kind) {
      case LaneOp::kFill:
      case LaneOp::kFail:
        t.add_tensor(lane(op.lane), Tag::OutputExisting).add_scalar(op.value);
        st = o.submit_aiv(kCheckFn, t).status();
        break;
      case LaneOp::kAffine:
        t.add_tensor(lane(op.lane), Tag::InOut).add_scalar(op.value);
        st = (op.aic ? o.submit_aic(kAffineAic, t) : o.submit_aiv(kAffineAiv, t)).status();
        break;
      case LaneOp::kCopy:
        t.add_tensor(lane(op.src), Tag::Input).add_tensor(lane(op.lane), Tag::OutputExisting);
        st = o.submit_aiv(kCopyFn, t).status();
        break;
    }
    if (!st.ok()) return st;
  }
  return Status();
}

ChipCallable lanes_callable() {
  KernelLibrary k = make_kernels({{kAffineAiv, CoreType::AIV, "affine_kernel", affine_kernel},
                                  {kAffineAic, CoreType::AIC, "affine_kernel_aic", affine_kernel},
                                  {kCopyFn, CoreType::AIV, "copy_kernel", copy_kernel},
                                  {kCheckFn, CoreType::AIV, "check_kernel", check_kernel}});
  return ChipCallable("lanes", lanes_orchestration, k, {Param::inout(), Param::scalar(), Param::scalar()});
}

TaskArgs lanes_args(const DeviceBuffer& buf, uint64_t seed, bool failing) {
  TaskArgs a;
  a.add_tensor(buf.view({kLanes * kLaneLen}, DType::I64), Tag::InOut).add_scalar_u64(seed).add_scalar(failing ? 1 : 0);
  return a;
}

// The terminal a run must end with: OK, or the failing task's own text.
std::string unexpected_terminal(uint64_t seed, bool failing, const Status& got) {
  if (!failing) return got.ok() ? std::string() : "a run that should pass ended " + got.to_string();
  int64_t value = 0;
  for (const LaneOp& op : lane_dag(seed, true)) {
    if (op.kind == LaneOp::kFail) value = op.value;
  }
  const std::string want = fmt::format("check_kernel: value {} is negative", value);
  if (got.code() == StatusCode::kKernelFailed && contains(got.message(), want)) return {};
  return fmt::format("a failing run (want KERNEL_FAILED with \"{}\") ended {}", want, got.to_string());
}

WorkerConfig stress_config(uint32_t depth, uint32_t launch_depth) {
  WorkerConfig c = small_config(depth, 64);
  c.launch_depth = launch_depth;
  c.device_memory_bytes = 64ull << 20;
  return c;
}

// A kernel that holds its task until the test opens the gate (bounded: it
// fails its task after 30 s), so a run can be held on the device while
// threads line up on it.
struct Gate {
  std::atomic<uint32_t> open{0};
  std::atomic<uint32_t> entered{0};
  Doorbell bell;
};
Gate g_gate;

void gate_kernel(int64_t*) {
  g_gate.entered.fetch_add(1);
  g_gate.bell.ring();
  if (!spin_then_park(
          g_gate.bell, [] { return g_gate.open.load() != 0; }, SpinPolicy{},
          now_ns() + static_cast<uint64_t>(kWait.count()) * 1'000'000'000ull)) {
    simpler_kernel_fail("gate_kernel: the gate never opened");
  }
}

ChipCallable gated_callable() {
  return ChipCallable("gated",
                      [](ChipOrchestrator& o, const TaskArgs&) { return o.submit_aiv(0, TaskArgs{}).status(); },
                      make_kernels({{0, CoreType::AIV, "gate_kernel", gate_kernel}}), {});
}

// Callable 0: lanes; callable 1: gated.
// launch_depth 0 launches up to the grant.
std::unique_ptr<ChipWorker> make_chip(uint32_t depth, uint32_t launch_depth = 0) {
  std::vector<ChipCallable> cs{lanes_callable(), gated_callable()};
  auto w = ChipWorker::create(stress_config(depth, launch_depth), std::move(cs));
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  return w.ok() ? std::move(w).value() : nullptr;
}

// Failures seen on helper threads, reported on the test thread (gtest
// assertions are thread-safe, but a bounded list keeps a broken run readable).
class Failures {
 public:
  void add(std::string what) {
    std::lock_guard<std::mutex> lock(mu_);
    ++count_;
    if (list_.size() < 20) list_.push_back(std::move(what));
  }
  bool report() const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::string& s : list_) ADD_FAILURE() << s;
    if (count_ > list_.size()) ADD_FAILURE() << count_ << " failures in all";
    return count_ == 0;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> list_;
  size_t count_ = 0;
};

uint64_t test_seed() {
  if (const char* s = std::getenv("SIMPLER_STRESS_SEED")) return std::strtoull(s, nullptr, 0);
  return static_cast<uint64_t>(Clock::now().time_since_epoch().count());
}

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// ---- (a) Worker::submit from one thread, waiters on eight --------------------------------------

// Each stress runs with every launched run on the device at once (launch_depth
// 0: the grant), and with a launch queue (3), whose runs completions launch.
class StressAtLaunchDepth : public ::testing::TestWithParam<uint32_t> {};
INSTANTIATE_TEST_SUITE_P(Stress, StressAtLaunchDepth, ::testing::Values(0u, 3u),
                         [](const ::testing::TestParamInfo<uint32_t>& i) {
                           return i.param == 0 ? std::string("LaunchDepthIsTheGrant") : "LaunchDepth3";
                         });

TEST_P(StressAtLaunchDepth, T9ChipSubmitWithEightWaiters) {
  Watchdog dog(std::chrono::seconds(280));
  HealthScan scan;
  const uint64_t seed = test_seed();
  const int runs = kSanitized ? 8000 : 16000;
  constexpr int kWaiters = 8;
  constexpr int kBuffers = 24;  // more than the depth, so waiters hold finished runs while others fly
  std::printf("T9 chip: seed %llu (SIMPLER_STRESS_SEED=%llu repeats it), %d runs\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed), runs);
  auto chip = make_chip(8, GetParam());
  ASSERT_NE(chip, nullptr);

  struct Job {
    uint64_t id;
    uint64_t seed;
    bool failing;
    int buffer;
    RunHandle handle;
    Status status;
  };
  std::vector<DeviceBuffer> buffers;
  Channel<int> free_buffers;
  for (int i = 0; i < kBuffers; ++i) {
    auto b = chip->malloc(kBufferBytes);
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    buffers.push_back(*b);
    free_buffers.push(i);
  }
  std::vector<LaneModel> models(kBuffers);
  Channel<Job> submitted, finished;
  TerminalLedger ledger;
  Failures failures;

  std::vector<std::thread> waiters;
  for (int w = 0; w < kWaiters; ++w) {
    waiters.emplace_back([&] {
      for (;;) {
        bool timed_out = false;
        std::optional<Job> job = submitted.pop(Clock::now() + kWait, &timed_out);
        if (!job) {
          if (timed_out) failures.add("waiter: no run to wait for in 30 s");
          return;
        }
        job->status = job->handle.wait_for(kWait);
        if (!job->handle.done()) {
          failures.add(fmt::format("run {} did not end in 30 s", job->id));
          continue;  // its buffer stays out of use
        }
        ledger.record(job->id, job->status);
        if (std::string bad = unexpected_terminal(job->seed, job->failing, job->status); !bad.empty()) {
          failures.add(fmt::format("run {} (seed {}): {}", job->id, job->seed, bad));
        }
        finished.push(std::move(*job));
      }
    });
  }

  // The controlling thread: verifies a finished run's buffer before reusing it.
  std::vector<int64_t> got(kLanes * kLaneLen);
  uint64_t verified = 0;
  auto take_back = [&](Job job) {
    if (job.status.ok()) {
      EXPECT_TRUE(chip->copy_from(got.data(), buffers[job.buffer], kBufferBytes, 0).ok());
      if (std::string d = models[job.buffer].diff(got.data()); !d.empty()) {
        failures.add(fmt::format("run {} (seed {}): {}", job.id, job.seed, d));
      }
      ++verified;
    }
    free_buffers.push(job.buffer);
  };
  uint64_t rng = seed;
  const auto t0 = Clock::now();
  for (int i = 0; i < runs; ++i) {
    while (std::optional<Job> done = finished.try_pop()) take_back(std::move(*done));
    std::optional<int> buffer = free_buffers.try_pop();
    while (!buffer) {
      bool timed_out = false;
      std::optional<Job> done = finished.pop(Clock::now() + kWait, &timed_out);
      ASSERT_TRUE(done.has_value()) << "no run finished in 30 s; " << i << " submitted";
      take_back(std::move(*done));
      buffer = free_buffers.try_pop();
    }
    Job job{static_cast<uint64_t>(i), splitmix(rng), splitmix(rng) % 8 == 0, *buffer, {}, {}};
    LaneModel& m = models[job.buffer];
    m = LaneModel::random(job.seed ^ 0x5eedull);
    ASSERT_TRUE(chip->copy_to(buffers[job.buffer], m.v.data(), kBufferBytes, 0).ok());
    for (const LaneOp& op : lane_dag(job.seed, job.failing)) m.apply(op);
    if (job.failing) m.forget();
    ledger.submitted(job.id);
    job.handle = chip->submit(0, lanes_args(buffers[job.buffer], job.seed, job.failing));
    submitted.push(std::move(job));
  }
  submitted.close();
  for (std::thread& t : waiters) t.join();
  while (std::optional<Job> done = finished.try_pop()) take_back(std::move(*done));
  const double wall_ms = ms_since(t0);

  const TerminalLedger::Summary s = ledger.check();
  for (const std::string& p : s.problems) ADD_FAILURE() << "ledger: " << p;
  EXPECT_EQ(s.submitted, static_cast<uint64_t>(runs));
  EXPECT_EQ(s.terminals, s.submitted);
  failures.report();
  if (auto bad = check_partition("chip", chip->set_counts(), chip->grant())) ADD_FAILURE() << *bad;
  EXPECT_EQ(chip->set_counts().live, 0u);
  EXPECT_EQ(chip->registered_runs(), 0u);
  for (const DeviceBuffer& b : buffers) EXPECT_TRUE(chip->free(b).ok());
  EXPECT_TRUE(chip->close(std::chrono::milliseconds(30'000)).ok());
  chip.reset();
  scan.expect_clean();
  std::printf(
      "RELIABILITY T9 part=chip_submit launch_depth=%u seed=%llu runs=%llu terminals=%llu ok=%llu failed=%llu "
      "verified=%llu "
      "waiters=%d wall_ms=%.0f\n",
      GetParam(), static_cast<unsigned long long>(seed), static_cast<unsigned long long>(s.submitted),
      static_cast<unsigned long long>(s.terminals), static_cast<unsigned long long>(s.ok),
      static_cast<unsigned long long>(s.failed), static_cast<unsigned long long>(verified), kWaiters, wall_ms);
}

// ---- (b) The native lifecycle from eight drivers -----------------------------------------------

// Zeroed, aligned caller storage for one native run.
class RunStorage {
 public:
  RunStorage()
      : p_(static_cast<unsigned char*>(
            ::operator new (native_run_storage_size(), std::align_val_t{native_run_storage_alignment()}))) {
    std::memset(p_, 0, native_run_storage_size());
  }
  ~RunStorage() { ::operator delete (p_, std::align_val_t{native_run_storage_alignment()}); }
  RunStorage(const RunStorage&) = delete;
  RunStorage& operator=(const RunStorage&) = delete;
  void* get() { return p_; }

 private:
  unsigned char* p_;
};

uint64_t deadline_ns() { return now_ns() + static_cast<uint64_t>(kWait.count()) * 1'000'000'000ull; }

// Takes a free set and prepares and launches callable `callable` on it into
// `storage`; the run's epoch, or why not (the set goes back on a refusal).
Result<uint64_t> prepare_and_launch(ChipWorker& chip, RunStorage& storage, uint32_t callable, const TaskArgs& args) {
  auto lease = chip.try_acquire_lease();
  if (!lease) return failed_precondition("no free set");
  NativeRunDescriptor desc;
  desc.lease = *lease;
  desc.arena_bank = lease->slot;
  auto epoch = chip.prepare(storage.get(), native_run_storage_size(), desc, callable, args);
  if (!epoch.ok()) {
    (void)chip.release_lease(*lease);
    return epoch.status();
  }
  SIMPLER_RETURN_IF_ERROR(chip.launch(storage.get(), *epoch), "launch");
  return *epoch;
}

TEST_P(StressAtLaunchDepth, T9NativeLifecycleFromEightDriversWithRegrants) {
  Watchdog dog(std::chrono::seconds(280));
  HealthScan scan;
  const uint64_t seed = test_seed();
  constexpr int kDrivers = 8;
  const int rounds = kSanitized ? 10 : 20;
  const int per_round = 100;  // runs per driver per round
  // Each driver holds at most two runs at once, so every grant here leaves it a set.
  const std::array<uint32_t, 3> grants{2 * kDrivers, 2 * kDrivers + 5, 2 * kDrivers + 1};
  std::printf("T9 native: seed %llu (SIMPLER_STRESS_SEED=%llu repeats it), %d drivers x %d runs\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed), kDrivers,
              rounds * per_round);
  auto chip = make_chip(grants[0], GetParam());
  ASSERT_NE(chip, nullptr);

  // Two buffers per driver, written once here by the controlling thread; from
  // then on each driver knows their contents from its runs' copy-backs.
  struct Driver {
    std::array<DeviceBuffer, 2> buf;
    std::array<LaneModel, 2> model;
    uint64_t rng = 0;
  };
  std::vector<Driver> drivers(kDrivers);
  for (int d = 0; d < kDrivers; ++d) {
    drivers[d].rng = seed + 1000 * static_cast<uint64_t>(d);
    for (int k = 0; k < 2; ++k) {
      auto b = chip->malloc(kBufferBytes);
      ASSERT_TRUE(b.ok()) << b.status().to_string();
      drivers[d].buf[k] = *b;
      drivers[d].model[k] = LaneModel::random(splitmix(drivers[d].rng));
      ASSERT_TRUE(chip->copy_to(*b, drivers[d].model[k].v.data(), kBufferBytes, 0).ok());
    }
  }
  TerminalLedger ledger;
  Failures failures;
  std::atomic<uint64_t> next_id{0}, cancelled{0}, launched{0};

  // One run of driver `d` on its buffer k, from prepare to (not) launched.
  struct Native {
    RunStorage storage;
    uint64_t id = 0;
    uint64_t epoch = 0;
    uint64_t seed = 0;
    bool failing = false;
    int k = 0;
    std::vector<int64_t> back = std::vector<int64_t>(kLanes * kLaneLen);
  };
  auto prepare = [&](Driver& drv, Native& run) -> bool {
    auto lease = chip->try_acquire_lease();
    if (!lease) {
      failures.add("driver: no free set although the grant covers every driver's runs");
      return false;
    }
    NativeRunDescriptor desc;
    desc.lease = *lease;
    desc.arena_bank = lease->slot;
    RunConfig cfg;
    cfg.copy_back.push_back(HostCopy{drv.buf[run.k], 0, run.back.data(), kBufferBytes});
    run.id = next_id.fetch_add(1);
    ledger.submitted(run.id);
    auto epoch = chip->prepare(run.storage.get(), native_run_storage_size(), desc, 0,
                               lanes_args(drv.buf[run.k], run.seed, run.failing), cfg);
    if (!epoch.ok()) {
      ledger.record(run.id, epoch.status());
      failures.add("prepare refused: " + epoch.status().to_string());
      (void)chip->release_lease(*lease);
      return false;
    }
    run.epoch = *epoch;
    return true;
  };
  auto launch = [&](Native& run) -> bool {
    if (Status st = chip->launch(run.storage.get(), run.epoch); !st.ok()) {
      failures.add(fmt::format("launch of run {}: {}", run.id, st.to_string()));
      return false;
    }
    launched.fetch_add(1);
    // A poll never blocks; either answer is right this early.
    auto p = chip->poll(run.storage.get(), run.epoch);
    if (!p.ok()) failures.add(fmt::format("poll of run {}: {}", run.id, p.status().to_string()));
    return true;
  };
  // wait (bounded), poll, finalize; checks the terminal and the copied-back buffer.
  auto finish = [&](Driver& drv, Native& run) {
    if (Status st = chip->wait(run.storage.get(), run.epoch, deadline_ns());
        st.code() == StatusCode::kDeadlineExceeded && contains(st.message(), "at the deadline")) {
      failures.add(fmt::format("run {} did not end in 30 s", run.id));
      return;  // left registered: the final accounting names it
    }
    auto p = chip->poll(run.storage.get(), run.epoch);
    if (!p.ok() || *p != PollState::Complete)
      failures.add(fmt::format("run {}: poll after wait is not Complete", run.id));
    const Status st = chip->finalize(run.storage.get(), run.epoch);
    ledger.record(run.id, st);
    if (std::string bad = unexpected_terminal(run.seed, run.failing, st); !bad.empty()) {
      failures.add(fmt::format("run {} (seed {}): {}", run.id, run.seed, bad));
    }
    LaneModel& m = drv.model[run.k];
    for (const LaneOp& op : lane_dag(run.seed, run.failing)) m.apply(op);
    if (!st.ok()) {
      m.forget();
      return;
    }
    if (std::string d = m.diff(run.back.data()); !d.empty()) {
      failures.add(fmt::format("run {} (seed {}): {}", run.id, run.seed, d));
    }
    std::copy(run.back.begin(), run.back.end(), m.v.begin());
    m.known.fill(true);
  };
  auto drive = [&](Driver& drv) {
    for (int i = 0; i < per_round; ++i) {
      const uint64_t mode = splitmix(drv.rng) % 20;
      if (mode < 3) {
        // Cancellation: prepared, never launched; the buffer is untouched.
        Native run;
        run.seed = splitmix(drv.rng);
        if (!prepare(drv, run)) return;
        const Status st = chip->finalize(run.storage.get(), run.epoch);
        ledger.record(run.id, st);
        cancelled.fetch_add(1);
        if (st.code() != StatusCode::kAborted || !contains(st.message(), "before launch")) {
          failures.add(fmt::format("run {} finalized before launch ended {}", run.id, st.to_string()));
        }
        continue;
      }
      // One run, or two on both buffers at once, finished in reverse order.
      const int n = mode < 6 ? 2 : 1;
      std::array<Native, 2> runs;
      for (int k = 0; k < n; ++k) {
        runs[k].k = k;
        runs[k].seed = splitmix(drv.rng);
        runs[k].failing = splitmix(drv.rng) % 8 == 0;
        if (!prepare(drv, runs[k]) || !launch(runs[k])) return;
      }
      for (int k = n - 1; k >= 0; --k) finish(drv, runs[k]);
    }
  };

  const auto t0 = Clock::now();
  std::barrier sync(kDrivers + 1);
  std::vector<std::thread> threads;
  for (int d = 0; d < kDrivers; ++d) {
    threads.emplace_back([&, d] {
      for (int r = 0; r < rounds; ++r) {
        sync.arrive_and_wait();  // the round starts
        drive(drivers[d]);
        sync.arrive_and_wait();  // every driver is idle
      }
    });
  }
  uint32_t regrants = 0;
  for (int r = 0; r < rounds; ++r) {
    sync.arrive_and_wait();
    sync.arrive_and_wait();
    // Idle: nothing registered, nothing live; the grant can change.
    if (auto bad = check_partition(fmt::format("round {}", r), chip->set_counts(), chip->grant()))
      ADD_FAILURE() << *bad;
    EXPECT_EQ(chip->registered_runs(), 0u) << "round " << r;
    const Status st = chip->set_run_resource_grant(grants[(r + 1) % grants.size()]);
    EXPECT_TRUE(st.ok()) << "regrant after round " << r << ": " << st.to_string();
    regrants += st.ok() ? 1 : 0;
  }
  for (std::thread& t : threads) t.join();
  const double wall_ms = ms_since(t0);

  const TerminalLedger::Summary s = ledger.check();
  for (const std::string& p : s.problems) ADD_FAILURE() << "ledger: " << p;
  EXPECT_EQ(s.submitted, next_id.load());
  EXPECT_EQ(s.terminals, s.submitted);
  failures.report();
  if (auto bad = check_partition("chip", chip->set_counts(), chip->grant())) ADD_FAILURE() << *bad;
  for (const Driver& drv : drivers) {
    for (const DeviceBuffer& b : drv.buf) EXPECT_TRUE(chip->free(b).ok());
  }
  EXPECT_TRUE(chip->close(std::chrono::milliseconds(30'000)).ok());
  chip.reset();
  scan.expect_clean();
  std::printf(
      "RELIABILITY T9 part=native launch_depth=%u seed=%llu runs=%llu terminals=%llu ok=%llu failed=%llu "
      "cancelled=%llu "
      "regrants=%u drivers=%d wall_ms=%.0f\n",
      GetParam(), static_cast<unsigned long long>(seed), static_cast<unsigned long long>(s.submitted),
      static_cast<unsigned long long>(s.terminals), static_cast<unsigned long long>(s.ok),
      static_cast<unsigned long long>(s.failed), static_cast<unsigned long long>(cancelled.load()), regrants, kDrivers,
      wall_ms);
}

// A phase call on a run that finalize retired (or is retiring) is refused for
// that reason, whatever instant of the retirement it reads the storage at.
bool retired_refusal(const Status& why) {
  return why.code() == StatusCode::kFailedPrecondition &&
         (contains(why.message(), "is not live here") || contains(why.message(), "holds no prepared run"));
}

// ---- (c) R49: finalize and regrant raced against a parked phase call ---------------------------

// R49 many times over: a run held on the device by the gate; one thread parks
// in wait() and then polls until the run is gone; another calls finalize,
// which must wait for it; a regrant meanwhile is refused. Then the gate opens
// and, the moment finalize returns, the controlling thread regrants while the
// first thread may still be leaving wait() or polling. Nothing may be freed
// under it (ASan), and no access may race (TSan).
TEST(Stress, T9R49FinalizeAndRegrantRaceAParkedWait) {
  Watchdog dog(std::chrono::seconds(280));
  HealthScan scan;
  const int iterations = kSanitized ? 1000 : 2000;
  const std::array<uint32_t, 2> grants{2, 3};
  auto chip = make_chip(grants[0]);
  ASSERT_NE(chip, nullptr);
  TerminalLedger ledger;
  Failures failures;
  RunStorage storage;
  uint64_t refused_regrants = 0, regrants = 0, refused_polls = 0;
  const auto t0 = Clock::now();
  for (int it = 0; it < iterations; ++it) {
    g_gate.open.store(0);
    g_gate.entered.store(0);
    auto epoch = prepare_and_launch(*chip, storage, 1, TaskArgs{});
    ASSERT_TRUE(epoch.ok()) << "iteration " << it << ": " << epoch.status().to_string();
    ledger.submitted(*epoch);
    ASSERT_TRUE(spin_then_park(
        g_gate.bell, [] { return g_gate.entered.load() == 1; }, SpinPolicy{}, deadline_ns()))
        << "the gated kernel never started";
    NativeRunContext* ctx = NativeRunContext::from_storage(storage.get());
    std::atomic<uint64_t> polls_refused{0};
    std::thread poller([&, e = *epoch] {
      const Status waited = chip->wait(storage.get(), e, deadline_ns());
      if (!waited.ok()) failures.add(fmt::format("iteration {}: wait ended {}", it, waited.to_string()));
      // Polls until finalize has retired the run: every answer is Complete
      // until the run is gone, then a refusal.
      const uint64_t end = deadline_ns();
      for (;;) {
        auto p = chip->poll(storage.get(), e);
        if (!p.ok()) {
          if (!retired_refusal(p.status())) {
            failures.add(fmt::format("iteration {}: poll ended {}", it, p.status().to_string()));
          }
          polls_refused.fetch_add(1);
          break;
        }
        if (*p != PollState::Complete) failures.add(fmt::format("iteration {}: poll after wait is NotReady", it));
        if (now_ns() > end) {
          failures.add(fmt::format("iteration {}: the run was still registered after 30 s", it));
          break;
        }
      }
    });
    // The poller is parked in wait() (the kernel cannot end) before finalize starts.
    ASSERT_TRUE(eventually([&] { return ctx->users() == 1; })) << "iteration " << it;
    Status finalized = internal_error("finalize never returned");
    std::thread finalizer([&, e = *epoch] { finalized = chip->finalize(storage.get(), e); });
    ASSERT_TRUE(eventually([&] { return ctx->users() == 2; })) << "iteration " << it;
    const Status early = chip->set_run_resource_grant(grants[(it + 1) % 2]);
    EXPECT_EQ(early.code(), StatusCode::kFailedPrecondition) << "a regrant under a held run: " << early.to_string();
    refused_regrants += early.ok() ? 0 : 1;
    g_gate.open.store(1);
    g_gate.bell.ring();
    finalizer.join();
    ledger.record(*epoch, finalized);
    EXPECT_TRUE(finalized.ok()) << "iteration " << it << ": " << finalized.to_string();
    // Races the poller's way out of wait() and its polls.
    const Status regrant = chip->set_run_resource_grant(grants[(it + 1) % 2]);
    EXPECT_TRUE(regrant.ok()) << "iteration " << it << ": " << regrant.to_string();
    regrants += regrant.ok() ? 1 : 0;
    poller.join();
    refused_polls += polls_refused.load();
    if (::testing::Test::HasFailure()) break;
  }
  const double wall_ms = ms_since(t0);
  const TerminalLedger::Summary s = ledger.check();
  for (const std::string& p : s.problems) ADD_FAILURE() << "ledger: " << p;
  failures.report();
  if (auto bad = check_partition("chip", chip->set_counts(), chip->grant())) ADD_FAILURE() << *bad;
  EXPECT_TRUE(chip->close(std::chrono::milliseconds(30'000)).ok());
  chip.reset();
  scan.expect_clean();
  std::printf(
      "RELIABILITY T9 part=r49 runs=%llu terminals=%llu ok=%llu refused_regrants=%llu regrants=%llu "
      "refused_polls=%llu wall_ms=%.0f\n",
      static_cast<unsigned long long>(s.submitted), static_cast<unsigned long long>(s.terminals),
      static_cast<unsigned long long>(s.ok), static_cast<unsigned long long>(refused_regrants),
      static_cast<unsigned long long>(regrants), static_cast<unsigned long long>(refused_polls), wall_ms);
}

// R49/R48 from the other side: a thread polls a run without a pause while
// another finalizes it. Every poll is answered from a live run (Complete or
// NotReady) or refused once the run is retired; a refused poll reads the
// caller's storage while finalize empties it, which must not race (TSan).
TEST(Stress, T9PollsRaceFinalize) {
  Watchdog dog(std::chrono::seconds(280));
  HealthScan scan;
  const int iterations = kSanitized ? 1000 : 2000;
  auto chip = make_chip(2);
  ASSERT_NE(chip, nullptr);
  auto buf = chip->malloc(kBufferBytes);
  ASSERT_TRUE(buf.ok());
  TerminalLedger ledger;
  Failures failures;
  RunStorage storage;
  uint64_t polls = 0;
  const auto t0 = Clock::now();
  for (int it = 0; it < iterations; ++it) {
    // Fills every lane first, so no lane reads what the last run left.
    auto epoch = prepare_and_launch(*chip, storage, 0, lanes_args(*buf, static_cast<uint64_t>(it), false));
    ASSERT_TRUE(epoch.ok()) << "iteration " << it << ": " << epoch.status().to_string();
    ledger.submitted(*epoch);
    std::atomic<bool> polling{false};
    std::atomic<uint64_t> answered{0};
    std::thread poller([&, e = *epoch] {
      const uint64_t end = deadline_ns();
      for (;;) {
        auto p = chip->poll(storage.get(), e);
        polling.store(true);
        if (!p.ok()) {
          if (!retired_refusal(p.status())) {
            failures.add(fmt::format("iteration {}: poll ended {}", it, p.status().to_string()));
          }
          return;
        }
        answered.fetch_add(1);
        std::this_thread::yield();  // the run's own threads share these 2 cores
        if (now_ns() > end) {
          failures.add(fmt::format("iteration {}: the run was still registered after 30 s", it));
          return;
        }
      }
    });
    ASSERT_TRUE(eventually([&] { return polling.load(); }));
    const Status finalized = chip->finalize(storage.get(), *epoch);
    ledger.record(*epoch, finalized);
    EXPECT_TRUE(finalized.ok()) << "iteration " << it << ": " << finalized.to_string();
    poller.join();
    polls += answered.load();
    if (::testing::Test::HasFailure()) break;
  }
  const double wall_ms = ms_since(t0);
  const TerminalLedger::Summary s = ledger.check();
  for (const std::string& p : s.problems) ADD_FAILURE() << "ledger: " << p;
  failures.report();
  if (auto bad = check_partition("chip", chip->set_counts(), chip->grant())) ADD_FAILURE() << *bad;
  EXPECT_TRUE(chip->free(*buf).ok());
  EXPECT_TRUE(chip->close(std::chrono::milliseconds(30'000)).ok());
  chip.reset();
  scan.expect_clean();
  std::printf("RELIABILITY T9 part=polls_race_finalize runs=%llu terminals=%llu ok=%llu polls=%llu wall_ms=%.0f\n",
              static_cast<unsigned long long>(s.submitted), static_cast<unsigned long long>(s.terminals),
              static_cast<unsigned long long>(s.ok), static_cast<unsigned long long>(polls), wall_ms);
}

// R49 for launch: launch and finalize of one prepared run, started together
// from two threads. Finalize either aborts the run before launch (and launch
// is then refused) or waits for the launch and returns the run's terminal;
// it never aborts a run that launch put on the device.
TEST(Stress, T9LaunchRacesFinalize) {
  Watchdog dog(std::chrono::seconds(280));
  HealthScan scan;
  const int iterations = kSanitized ? 1000 : 4000;
  auto chip = make_chip(2);
  ASSERT_NE(chip, nullptr);
  auto buf = chip->malloc(kBufferBytes);
  ASSERT_TRUE(buf.ok());
  TerminalLedger ledger;
  RunStorage storage;
  uint64_t aborted = 0, ran = 0;
  const auto t0 = Clock::now();
  for (int it = 0; it < iterations; ++it) {
    auto lease = chip->try_acquire_lease();
    ASSERT_TRUE(lease.has_value()) << "iteration " << it;
    NativeRunDescriptor desc;
    desc.lease = *lease;
    desc.arena_bank = lease->slot;
    auto epoch = chip->prepare(storage.get(), native_run_storage_size(), desc, 0,
                               lanes_args(*buf, static_cast<uint64_t>(it), false));
    ASSERT_TRUE(epoch.ok()) << epoch.status().to_string();
    ledger.submitted(*epoch);
    std::barrier start(2);
    Status launched = internal_error("launch never returned");
    std::thread launcher([&, e = *epoch] {
      start.arrive_and_wait();
      launched = chip->launch(storage.get(), e);
    });
    start.arrive_and_wait();
    Status finalized = chip->finalize(storage.get(), *epoch);
    launcher.join();
    if (finalized.code() == StatusCode::kFailedPrecondition && contains(finalized.message(), "is launching")) {
      // Caught mid-launch: refused, as R86 says; finalize again once launch returned.
      finalized = chip->finalize(storage.get(), *epoch);
    }
    ledger.record(*epoch, finalized);
    if (finalized.ok()) {
      ++ran;
      EXPECT_TRUE(launched.ok()) << "iteration " << it << ": the run ran but launch says " << launched.to_string();
    } else {
      ++aborted;
      EXPECT_TRUE(finalized.code() == StatusCode::kAborted && contains(finalized.message(), "before launch"))
          << "iteration " << it << ": " << finalized.to_string();
      EXPECT_FALSE(launched.ok()) << "iteration " << it << ": launch put the run on the device, then finalize "
                                  << "aborted it as never launched";
    }
    if (::testing::Test::HasFailure()) break;
  }
  const double wall_ms = ms_since(t0);
  const TerminalLedger::Summary s = ledger.check();
  for (const std::string& p : s.problems) ADD_FAILURE() << "ledger: " << p;
  if (auto bad = check_partition("chip", chip->set_counts(), chip->grant())) ADD_FAILURE() << *bad;
  EXPECT_EQ(chip->registered_runs(), 0u);
  EXPECT_TRUE(chip->free(*buf).ok());
  EXPECT_TRUE(chip->close(std::chrono::milliseconds(30'000)).ok());
  chip.reset();
  scan.expect_clean();
  std::printf("RELIABILITY T9 part=launch_race_finalize runs=%llu terminals=%llu ran=%llu aborted=%llu wall_ms=%.0f\n",
              static_cast<unsigned long long>(s.submitted), static_cast<unsigned long long>(s.terminals),
              static_cast<unsigned long long>(ran), static_cast<unsigned long long>(aborted), wall_ms);
}

// R49 for two finalizes of one launched run, both inside before it ends: one
// returns the run's terminal, the other is refused; neither waits for the
// other for ever.
TEST(Stress, T9TwoFinalizesOfOneRun) {
  Watchdog dog(std::chrono::seconds(280));
  HealthScan scan;
  const int iterations = kSanitized ? 200 : 500;
  auto chip = make_chip(2);
  ASSERT_NE(chip, nullptr);
  TerminalLedger ledger;
  RunStorage storage;
  const auto t0 = Clock::now();
  for (int it = 0; it < iterations; ++it) {
    g_gate.open.store(0);
    g_gate.entered.store(0);
    auto epoch = prepare_and_launch(*chip, storage, 1, TaskArgs{});
    ASSERT_TRUE(epoch.ok()) << "iteration " << it << ": " << epoch.status().to_string();
    ledger.submitted(*epoch);
    NativeRunContext* ctx = NativeRunContext::from_storage(storage.get());
    std::array<Status, 2> finalized;
    std::atomic<int> back{0};
    std::array<std::thread, 2> finalizers;
    for (int k = 0; k < 2; ++k) {
      finalizers[k] = std::thread([&, k, e = *epoch] {
        finalized[k] = chip->finalize(storage.get(), e);
        back.fetch_add(1);
      });
    }
    // Both reached finalize before the run can end: each is inside, holding
    // the run, or was refused already.
    ASSERT_TRUE(eventually([&] { return ctx->users() + static_cast<uint32_t>(back.load()) == 2; }))
        << "iteration " << it;
    g_gate.open.store(1);
    g_gate.bell.ring();
    if (!eventually([&] { return back.load() == 2; })) {
      // Deadlocked: the threads cannot be joined; end the process with the reason.
      std::fprintf(stderr, "iteration %d: two finalizes of one run waited for each other for 30 s\n", it);
      std::_Exit(1);
    }
    for (std::thread& t : finalizers) t.join();
    const int winner = finalized[0].ok() ? 0 : 1;
    EXPECT_TRUE(finalized[winner].ok()) << "iteration " << it << ": " << finalized[winner].to_string();
    EXPECT_TRUE(retired_refusal(finalized[1 - winner]) || contains(finalized[1 - winner].message(), "another call"))
        << "iteration " << it << ": " << finalized[1 - winner].to_string();
    ledger.record(*epoch, finalized[winner]);
    if (::testing::Test::HasFailure()) break;
  }
  const double wall_ms = ms_since(t0);
  const TerminalLedger::Summary s = ledger.check();
  for (const std::string& p : s.problems) ADD_FAILURE() << "ledger: " << p;
  if (auto bad = check_partition("chip", chip->set_counts(), chip->grant())) ADD_FAILURE() << *bad;
  EXPECT_TRUE(chip->close(std::chrono::milliseconds(30'000)).ok());
  chip.reset();
  scan.expect_clean();
  std::printf("RELIABILITY T9 part=two_finalizes runs=%llu terminals=%llu ok=%llu wall_ms=%.0f\n",
              static_cast<unsigned long long>(s.submitted), static_cast<unsigned long long>(s.terminals),
              static_cast<unsigned long long>(s.ok), wall_ms);
}

}  // namespace
}  // namespace simpler::testing
