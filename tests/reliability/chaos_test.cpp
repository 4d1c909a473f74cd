// T3 of the reliability plan: random chaos under load. A node of 3 forked
// chip children runs mixed DAGs of 1-16 tasks spread over the chips,
// pipelined, while a chaos thread SIGKILLs a random chip child every
// 200-500 ms (seeded; the seed is printed) and the node replaces it, and a
// CPU hog (`stress-ng --cpu 1`, or a burner process where stress-ng is not
// installed) takes one of the machine's cores. The controlling thread
// submits; 8 waiter threads wait on the handles and check each run.
// Pass: every submitted run has exactly one terminal (no duplicate, none
// missing); each ends OK with outputs equal to the host's bit for bit, or
// ABORTED by a kill; the run-set accounting sampled every 10 ms is never
// broken; the node never goes 10 s without finishing a run (liveness with a
// deadline; the 1 s windows without progress are counted and printed);
// everything drains before the deadline; the health scan is clean.
//
// SIMPLER_CHAOS_SECONDS sets its length (the long tier runs 30 min),
// SIMPLER_CHAOS_SEED repeats a seed.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "base/errors.h"
#include "health_scan.h"
#include "ipc/test_hooks.h"
#include "node/node_worker.h"
#include "node_test_util.h"
#include "test_util.h"

namespace simpler::testing {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kChips = 3;
constexpr uint32_t kDepth = 8;               // the node's pipeline_depth
constexpr int kSlots = 2 * kDepth;           // output slots, each owned by one run at a time
constexpr int kMaxTasks = 16;                // tasks of the largest DAG
constexpr int kN = 16;                       // elements of every tensor
constexpr int kSlotFloats = kMaxTasks * kN;  // task i writes segment i of its run's slot
constexpr int kWaiters = 8;
// A chip's device addresses carry its incarnation in 6 bits, so a chip is
// replaced at most kNodeMaxIncarnations - 1 times; the chaos stops one short.
constexpr uint64_t kKillsPerChip = kNodeMaxIncarnations - 2;

// One run's DAG: task i reads x (src < 0) or task src's output (src < i),
// computes in * m + a on chip `chip` and writes segment i. Multipliers of 1
// or 2 and addends below 4 keep every value an integer below 2^24 through a
// chain of 16, so f32 holds each exactly and the host's answer is the kernel's.
struct Task {
  int src = -1;
  uint32_t chip = 0;
  int64_t m = 1, a = 0;
};
using Dag = std::vector<Task>;

Dag random_dag(uint64_t& rng) {
  Dag d(1 + splitmix(rng) % kMaxTasks);
  for (size_t i = 0; i < d.size(); ++i) {
    d[i].src = i == 0 ? -1 : static_cast<int>(splitmix(rng) % (i + 1)) - 1;
    d[i].chip = static_cast<uint32_t>(splitmix(rng) % kChips);
    d[i].m = 1 + static_cast<int64_t>(splitmix(rng) % 2);
    d[i].a = static_cast<int64_t>(splitmix(rng) % 4);
  }
  return d;
}

std::array<float, kSlotFloats> expected(const Dag& d, const float* x) {
  std::array<float, kSlotFloats> e;
  e.fill(std::numeric_limits<float>::quiet_NaN());
  for (size_t i = 0; i < d.size(); ++i) {
    for (int k = 0; k < kN; ++k) {
      const float in = d[i].src < 0 ? x[k] : e[static_cast<size_t>(d[i].src) * kN + k];
      e[i * kN + k] = in * static_cast<float>(d[i].m) + static_cast<float>(d[i].a);
    }
  }
  return e;
}

Status build(Orchestrator& o, CallableHandle axpb, const Dag& d, const DeviceBuffer& x, const DeviceBuffer& slot) {
  const TensorView xv(x, {kN}, DType::F32);
  for (size_t i = 0; i < d.size(); ++i) {
    const TensorView in = d[i].src < 0 ? xv : TensorView(slot, {kN}, DType::F32, d[i].src * kN);
    const TensorView out(slot, {kN}, DType::F32, static_cast<int64_t>(i) * kN);
    SIMPLER_RETURN_IF_ERROR(o.submit_next_level(axpb, axpb_args(in, out, d[i].m, d[i].a, -1), d[i].chip).status());
  }
  return Status();
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// The CPU hog: `stress-ng --cpu 1` in a process group of its own, or, where
// stress-ng is not installed, one process that burns a core until killed.
class CpuHog {
 public:
  explicit CpuHog(uint64_t seconds) {
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      const std::string t = std::to_string(seconds + 60) + "s";
      execlp("stress-ng", "stress-ng", "--cpu", "1", "--timeout", t.c_str(), "--quiet", static_cast<char*>(nullptr));
      // No stress-ng: burn the core here, for at most the test's length.
      const auto end = Clock::now() + std::chrono::seconds(seconds + 60);
      volatile uint64_t sink = 0;
      while (Clock::now() < end) {
        for (int i = 0; i < 1'000'000; ++i) sink = sink + static_cast<uint64_t>(i);
      }
      _exit(0);
    }
    if (pid_ > 0) setpgid(pid_, pid_);  // either side may run first
  }
  CpuHog(const CpuHog&) = delete;
  CpuHog& operator=(const CpuHog&) = delete;
  ~CpuHog() { stop(); }
  // Kills the group and reaps it all: stress-ng's worker too, which this
  // process adopts (the health scan makes it a subreaper) if it outlives its parent.
  void stop() {
    if (pid_ <= 0) return;
    const pid_t group = std::exchange(pid_, -1);
    kill(-group, SIGKILL);
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < deadline) {
      const pid_t r = waitpid(-group, nullptr, WNOHANG);
      if (r < 0 && errno == ECHILD) return;
      if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ADD_FAILURE() << "the CPU hog's processes did not all exit within 10 s";
  }
  bool started() const { return pid_ > 0; }
  // What ran: "stress-ng" or the fallback burner (exec replaced the name).
  std::string what() const { return comm_of(pid_) == "stress-ng" ? "stress-ng" : "burner"; }

 private:
  pid_t pid_ = -1;
};

// Stop flag with an interruptible wait, for the chaos and sampler threads.
class StopLatch {
 public:
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopped_ = true;
    }
    cv_.notify_all();
  }
  // False once stopped; otherwise true after `d`.
  bool sleep(std::chrono::milliseconds d) {
    std::unique_lock<std::mutex> lock(mu_);
    return !cv_.wait_for(lock, d, [&] { return stopped_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;
};

uint64_t percentile(std::vector<uint64_t> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

TEST(Chaos, T3RandomChipKillsUnderLoad) {
  const uint64_t seconds = env_u64("SIMPLER_CHAOS_SECONDS", kSanitized ? 20 : 60);
  const uint64_t seed = env_u64("SIMPLER_CHAOS_SEED", static_cast<uint64_t>(Clock::now().time_since_epoch().count()));
  Watchdog dog(std::chrono::seconds(seconds + 240));
  std::printf("T3: seed %llu (SIMPLER_CHAOS_SEED repeats it), %llu s\n", static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(seconds));
  HealthScan scan;  // before anything forks

  NodeSpec spec;
  spec.config = node_config(kChips, 0, kDepth);
  spec.config.max_tasks_per_run = kMaxTasks;
  spec.chip_callables = {axpb_callable()};
  // Kills here are the test, not a broken child: each chip may be replaced as
  // often as its incarnation bits allow.
  spec.respawn_budget = kNodeMaxIncarnations;
  const CallableHandle axpb{0, spec.chip_callables[0].digest()};
  auto created = NodeWorker::create(std::move(spec));
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  std::unique_ptr<NodeWorker> w = std::move(created).value();
  auto x = w->malloc_shared(kN * sizeof(float));
  auto out = w->malloc_shared(kSlots * kSlotFloats * sizeof(float));
  ASSERT_TRUE(x.ok() && out.ok());
  auto* xs = reinterpret_cast<float*>(x->addr);
  for (int i = 0; i < kN; ++i) xs[i] = static_cast<float>(i + 1);
  auto* slots = reinterpret_cast<float*>(out->addr);
  const uint64_t heap_blocks = w->heap().live_blocks();

  CpuHog hog(seconds);
  ASSERT_TRUE(hog.started()) << "fork of the CPU hog failed";

  TerminalLedger ledger;
  const IdentityCounts identity_before = identity_counts();
  std::atomic<uint64_t> ok{0}, aborted{0};
  std::mutex mu;  // guards everything below it
  std::vector<std::string> wrong;
  std::vector<uint64_t> ok_latency_us;
  uint64_t last_kill_ns = 0, max_kill_to_terminal_ns = 0;
  auto note = [&](std::string s) {
    std::lock_guard<std::mutex> lock(mu);
    if (wrong.size() < 10) wrong.push_back(std::move(s));
  };

  // The waiters: each run is checked, then its slot is handed back.
  struct Job {
    uint64_t id = 0;
    int slot = 0;
    Dag dag;
    RunHandle handle;
    uint64_t submitted_ns = 0;
  };
  Channel<Job> jobs;
  Channel<int> free_slots;
  for (int s = 0; s < kSlots; ++s) free_slots.push(s);
  std::vector<std::thread> waiters;
  for (int t = 0; t < kWaiters; ++t) {
    waiters.emplace_back([&] {
      bool timed_out = false;
      while (std::optional<Job> j = jobs.pop(Clock::now() + std::chrono::seconds(seconds + 120), &timed_out)) {
        const Status st = j->handle.wait_for(kWait);
        const uint64_t end = now_ns();
        if (!j->handle.done()) {
          note(fmt::format("run {} did not end in {} s", j->id, kWait.count()));
          continue;  // its slot stays taken: the run may still write it
        }
        if (st.code() == StatusCode::kAborted) {
          aborted.fetch_add(1);
          std::lock_guard<std::mutex> lock(mu);
          if (last_kill_ns != 0) max_kill_to_terminal_ns = std::max(max_kill_to_terminal_ns, end - last_kill_ns);
        } else if (!st.ok()) {
          note(fmt::format("run {} ended {}", j->id, st.to_string()));
        } else {
          ok.fetch_add(1);
          const std::array<float, kSlotFloats> e = expected(j->dag, xs);
          const float* got = slots + j->slot * kSlotFloats;
          for (int i = 0; i < kSlotFloats; ++i) {
            if (!same_bits(got[i], e[i])) {
              std::string tasks;
              for (const Task& t : j->dag) tasks += fmt::format(" [src {} chip {} m {} a {}]", t.src, t.chip, t.m, t.a);
              note(fmt::format("run {}: element {} is {}, the host computed {}; tasks:{}", j->id, i, got[i], e[i],
                               tasks));
              break;
            }
          }
          std::lock_guard<std::mutex> lock(mu);
          ok_latency_us.push_back((end - j->submitted_ns) / 1000);
        }
        free_slots.push(j->slot);
      }
    });
  }

  // The chaos thread: a random chip child dies every 200-500 ms.
  StopLatch stop_chaos;
  std::array<uint64_t, kChips> kills{};
  uint64_t kills_total = 0, kills_skipped = 0;
  std::thread chaos([&] {
    uint64_t rng = seed ^ 0xc4a05;
    while (stop_chaos.sleep(std::chrono::milliseconds(200 + splitmix(rng) % 301))) {
      const uint32_t chip = static_cast<uint32_t>(splitmix(rng) % kChips);
      if (kills[chip] >= kKillsPerChip) {
        ++kills_skipped;
        continue;
      }
      ForkedChild& child = w->next_child(chip);
      const uint64_t incarnation = child.incarnation();
      {
        std::lock_guard<std::mutex> lock(mu);
        last_kill_ns = now_ns();
      }
      if (::kill(child.pid(), SIGKILL) != 0) {
        note(fmt::format("kill of chip {}: {}", chip, std::strerror(errno)));
        return;
      }
      ++kills[chip];
      ++kills_total;
      // Replaced before this chip can be picked again.
      if (Status st = child.await_replacement(incarnation, now_ns() + kTestWaitNs); !st.ok()) {
        note(fmt::format("chip {} was not replaced: {}", chip, st.to_string()));
        return;
      }
    }
  });

  // The sampler: accounting every 10 ms, progress in 1 s windows.
  StopLatch stop_sampler;
  uint64_t samples = 0, stalled_windows = 0, longest_stall_ms = 0;
  std::vector<std::string> broken;
  std::thread sampler([&] {
    uint64_t window_start = now_ns(), window_ok = ok.load(), last_progress = now_ns(), progress_ok = ok.load();
    while (stop_sampler.sleep(std::chrono::milliseconds(10))) {
      const ArenaCounts c = w->run_set_counts();
      ++samples;
      if (auto bad = check_partition("node run sets", c, kDepth); bad && broken.size() < 10) broken.push_back(*bad);
      const uint64_t now = now_ns(), done = ok.load();
      if (done != progress_ok) {
        progress_ok = done;
        last_progress = now;
      }
      longest_stall_ms = std::max(longest_stall_ms, (now - last_progress) / 1'000'000);
      if (now - window_start >= 1'000'000'000ull) {
        stalled_windows += done == window_ok ? 1 : 0;
        window_start = now;
        window_ok = done;
      }
    }
  });

  uint64_t rng = seed;
  uint64_t submitted = 0;
  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::seconds(seconds);
  while (Clock::now() < end) {
    bool timed_out = false;
    std::optional<int> slot = free_slots.pop(Clock::now() + kWait, &timed_out);
    if (!slot) {
      note(fmt::format("no output slot came back within {} s", kWait.count()));
      break;
    }
    Job j;
    j.id = submitted++;
    j.slot = *slot;
    j.dag = random_dag(rng);
    std::fill(slots + j.slot * kSlotFloats, slots + (j.slot + 1) * kSlotFloats,
              std::numeric_limits<float>::quiet_NaN());
    const DeviceBuffer slot_buf{out->addr + static_cast<uint64_t>(j.slot) * kSlotFloats * sizeof(float),
                                kSlotFloats * sizeof(float)};
    ledger.submitted(j.id);
    j.submitted_ns = now_ns();
    const Dag dag = j.dag;
    const uint64_t id = j.id;
    j.handle = w->submit([&, dag, slot_buf](Orchestrator& o) { return build(o, axpb, dag, *x, slot_buf); },
                         [&ledger, id](const Status& st) { ledger.record(id, st); });
    jobs.push(std::move(j));
    std::lock_guard<std::mutex> lock(mu);
    if (!wrong.empty()) break;
  }
  stop_chaos.stop();
  chaos.join();
  jobs.close();
  for (std::thread& t : waiters) t.join();
  stop_sampler.stop();
  sampler.join();
  const double wall_s = std::chrono::duration<double>(Clock::now() - t0).count();

  for (const std::string& s : wrong) ADD_FAILURE() << s;
  for (const std::string& b : broken) ADD_FAILURE() << "accounting sample: " << b;
  EXPECT_GT(samples, 0u);
  EXPECT_EQ(ok.load() + aborted.load(), submitted);
  EXPECT_GT(kills_total, 0u) << "the chaos thread killed nothing";
  EXPECT_GT(ok.load(), 0u);
  EXPECT_LT(longest_stall_ms, 10'000u) << "the node finished no run for 10 s";
  const ArenaCounts c = w->run_set_counts();
  if (auto bad = check_partition("node run sets at the end", c, kDepth)) ADD_FAILURE() << *bad;
  EXPECT_EQ(c.live, 0u);
  EXPECT_EQ(w->heap().live_blocks(), heap_blocks) << "run-owned heap blocks outlived their runs";
  EXPECT_TRUE(w->free(*x).ok());
  EXPECT_TRUE(w->free(*out).ok());
  EXPECT_TRUE(w->close(std::chrono::seconds(30)).ok());
  w.reset();
  // After close: a run's on_terminal is called after its waiters were woken.
  const TerminalLedger::Summary s = ledger.check();
  for (const std::string& p : s.problems) ADD_FAILURE() << "ledger: " << p;
  EXPECT_EQ(s.submitted, submitted);
  EXPECT_EQ(s.terminals, submitted);
  EXPECT_EQ(s.failed, aborted.load()) << "on_terminal and the handles disagree";
  const std::string load = hog.what();
  hog.stop();
  scan.expect_clean();
  // H5: every task a chip child took carried its own payload.
  const uint64_t identity_checked = identity_counts().checked - identity_before.checked;
  const uint64_t identity_mismatch = identity_counts().mismatches - identity_before.mismatches;
  EXPECT_GT(identity_checked, 0u);
  EXPECT_EQ(identity_mismatch, 0u) << "a chip child took another publication's payload";
  std::printf(
      "RELIABILITY T3 seconds=%.0f load=%s runs=%llu ok=%llu aborted=%llu unknown=%llu kills=%llu kills_skipped=%llu "
      "max_kill_to_terminal_ms=%llu ok_p50_us=%llu ok_p99_us=%llu stalled_1s_windows=%llu longest_stall_ms=%llu "
      "samples=%llu identity_checked=%llu identity_mismatch=%llu seed=%llu\n",
      wall_s, load.c_str(), static_cast<unsigned long long>(submitted), static_cast<unsigned long long>(ok.load()),
      static_cast<unsigned long long>(aborted.load()),
      static_cast<unsigned long long>(submitted - ok.load() - aborted.load()),
      static_cast<unsigned long long>(kills_total), static_cast<unsigned long long>(kills_skipped),
      static_cast<unsigned long long>(max_kill_to_terminal_ns / 1'000'000),
      static_cast<unsigned long long>(percentile(ok_latency_us, 0.5)),
      static_cast<unsigned long long>(percentile(ok_latency_us, 0.99)),
      static_cast<unsigned long long>(stalled_windows), static_cast<unsigned long long>(longest_stall_ms),
      static_cast<unsigned long long>(samples), static_cast<unsigned long long>(identity_checked),
      static_cast<unsigned long long>(identity_mismatch), static_cast<unsigned long long>(seed));
}

}  // namespace
}  // namespace simpler::testing
