// Issue 16, load-aware waiting: LoadSense classifies spin batches from the
// times it is given, and a spin-then-park wait that reads the process as
// oversubscribed (forced through the test hooks, never measured here) parks
// after one batch instead of spinning its whole window.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "base/doorbell.h"
#include "base/load_sense.h"
#include "gate.h"
#include "scratch_dir.h"

namespace simpler {
namespace {

using simpler::testing::eventually;

// Restores the measured state whatever a test forced.
struct HooksReset {
  ~HooksReset() {
    hooks::force_load_state(-1);
    hooks::add_spin_batch_gap(0);
    hooks::force_others_runnable(-1);
  }
};

TEST(LoadSense, ABatchThatLostItsCpuHoldsTheProcessOversubscribedForTheHold) {
  HooksReset reset;
  hooks::force_others_runnable(1);
  LoadSense sense;
  const uint64_t t = 1'000'000'000;
  EXPECT_FALSE(sense.note_batch(LoadSense::kLostCpuNs - 1, t));
  EXPECT_FALSE(sense.oversubscribed(t));
  EXPECT_EQ(sense.spin_window(20'000, t), 20'000u);
  EXPECT_TRUE(sense.note_batch(LoadSense::kLostCpuNs, t));
  EXPECT_EQ(sense.lost_batches(), 1u);
  EXPECT_TRUE(sense.oversubscribed(t));
  EXPECT_TRUE(sense.oversubscribed(t + LoadSense::kHoldNs - 1));
  EXPECT_EQ(sense.spin_window(20'000, t), LoadSense::kPressedSpinNs);
  EXPECT_EQ(sense.spin_window(1'000, t), 1'000u);
  EXPECT_FALSE(sense.oversubscribed(t + LoadSense::kHoldNs));
}

TEST(LoadSense, AnOlderLostBatchDoesNotShortenTheHold) {
  HooksReset reset;
  hooks::force_others_runnable(1);
  LoadSense sense;
  const uint64_t t = 1'000'000'000;
  ASSERT_TRUE(sense.note_batch(LoadSense::kLostCpuNs, t + 10));
  ASSERT_TRUE(sense.note_batch(LoadSense::kLostCpuNs, t));
  EXPECT_TRUE(sense.oversubscribed(t + 10 + LoadSense::kHoldNs - 1));
}

// A run's host build holds a CPU for up to milliseconds without yielding: a
// spinner that lost its CPU to it parks (the batch reads as lost) but the
// process is not held oversubscribed, during the build or for a batch that
// began before the build ended. A batch lost wholly after it still is.
TEST(LoadSense, ABatchLostToTheProcesssOwnBuildParksButDoesNotPress) {
  HooksReset reset;
  hooks::force_others_runnable(1);
  LoadSense sense;
  const uint64_t t = 1'000'000'000;
  sense.own_work_begin();
  EXPECT_TRUE(sense.note_batch(LoadSense::kLostCpuNs * 5, t));
  EXPECT_FALSE(sense.oversubscribed(t));
  sense.own_work_end(t + 100);
  EXPECT_TRUE(sense.note_batch(LoadSense::kLostCpuNs, t + 100 + LoadSense::kLostCpuNs));
  EXPECT_FALSE(sense.oversubscribed(t + 100 + LoadSense::kLostCpuNs));
  EXPECT_TRUE(sense.note_batch(LoadSense::kLostCpuNs, t + 101 + LoadSense::kLostCpuNs));
  EXPECT_TRUE(sense.oversubscribed(t + 101 + LoadSense::kLostCpuNs));
  EXPECT_EQ(sense.lost_batches(), 3u);
}

// Issue 16: a long batch while no other process's thread is runnable lost
// its CPU to this process's own threads (more simulator threads than CPUs):
// it is not lost (the spinner spins on) and presses nothing; the verdict
// stands for kOwnVerdictNs, after which a long batch asks again.
TEST(LoadSense, ABatchLostToTheProcesssOwnThreadsIsNotLoad) {
  HooksReset reset;
  LoadSense sense;
  const uint64_t t = 1'000'000'000;
  hooks::force_others_runnable(0);
  EXPECT_FALSE(sense.note_batch(LoadSense::kLostCpuNs * 10, t));
  EXPECT_FALSE(sense.oversubscribed(t));
  EXPECT_EQ(sense.own_batches(), 1u);
  EXPECT_EQ(sense.lost_batches(), 0u);
  // Others run now, but the verdict stands: not asked again within it.
  hooks::force_others_runnable(1);
  EXPECT_FALSE(sense.note_batch(LoadSense::kLostCpuNs, t + LoadSense::kOwnVerdictNs - 1));
  EXPECT_FALSE(sense.oversubscribed(t + LoadSense::kOwnVerdictNs - 1));
  EXPECT_EQ(sense.own_batches(), 2u);
  // Once it lapsed, the next long batch asks, and is lost to them.
  EXPECT_TRUE(sense.note_batch(LoadSense::kLostCpuNs, t + LoadSense::kOwnVerdictNs));
  EXPECT_TRUE(sense.oversubscribed(t + LoadSense::kOwnVerdictNs));
  EXPECT_EQ(sense.lost_batches(), 1u);
}

TEST(LoadSense, ProcTextIsParsedAndMalformedTextRefused) {
  const auto running = [](const std::string& s) { return LoadSense::running_of_loadavg(s.data(), s.size()); };
  EXPECT_EQ(running("0.20 0.18 0.12 3/80 11206\n"), 3);
  EXPECT_EQ(running("12.00 9.50 8.01 117/1024 99"), 117);
  EXPECT_EQ(running("0.20 0.18 0.12 /80 11206"), -1);
  EXPECT_EQ(running("0.20 0.18 0.12 3"), -1);
  EXPECT_EQ(running("0.20 0.18"), -1);
  EXPECT_EQ(running(""), -1);
  EXPECT_EQ(running("0.20 0.18 0.12 1234567890123/80 1"), -1);
  const auto state = [](const std::string& s) { return LoadSense::state_of_task_stat(s.data(), s.size()); };
  EXPECT_EQ(state("1234 (aiv1) R 1 2 3"), 'R');
  EXPECT_EQ(state("1234 (a b) (c)) S 1 2 3"), 'S');  // a name with spaces and parentheses
  EXPECT_EQ(state("1234 (aiv1)R 1"), -1);
  EXPECT_EQ(state("1234 (aiv1) "), -1);
  EXPECT_EQ(state("1234 aiv1 R 1"), -1);
  EXPECT_EQ(state("1234 (aiv1) r 1"), -1);
  const auto parent = [](const std::string& s) { return LoadSense::parent_of_stat(s.data(), s.size()); };
  EXPECT_EQ(parent("1234 (simpler-chip0) S 1200 1 2 3"), 1200);
  EXPECT_EQ(parent("1234 (a b) (c)) R 7 1"), 7);
  EXPECT_EQ(parent("1 (init) S 0 1"), 0);
  EXPECT_EQ(parent("1234 (x) S 1200"), -1);  // cut off: the number may go on
  EXPECT_EQ(parent("1234 (x) S  1200 1"), -1);
  EXPECT_EQ(parent("1234 (x) S -1 1"), -1);
  EXPECT_EQ(parent("1234 (x) S"), -1);
  EXPECT_EQ(parent("1234 (x) S 1234567890123 1"), -1);
}

// A tree standing in for /proc: loadavg's running count, and one stat file
// per thread of "this process".
struct FakeProc {
  explicit FakeProc(const std::string& dir) : root(dir) {
    std::filesystem::create_directories(root + "/self/task");
    hooks::set_proc_root(root);
  }
  ~FakeProc() { hooks::set_proc_root("/proc"); }
  void loadavg(int running) const { write(root + "/loadavg", fmt::format("0.50 0.40 0.30 {}/99 4242\n", running)); }
  void thread(long tid, char state) const {
    std::filesystem::create_directories(fmt::format("{}/self/task/{}", root, tid));
    write(fmt::format("{}/self/task/{}/stat", root, tid), fmt::format("{} (aiv{}) {} 1 2 3 4\n", tid, tid, state));
  }
  // A thread of another process `pid` whose parent is `ppid`.
  void process_thread(long pid, long ppid, long tid, char state) const {
    std::filesystem::create_directories(fmt::format("{}/{}/task/{}", root, pid, tid));
    write(fmt::format("{}/{}/stat", root, pid), fmt::format("{} (p{}) S {} 2 3 4\n", pid, pid, ppid));
    write(fmt::format("{}/{}/task/{}/stat", root, pid, tid),
          fmt::format("{} (t{}) {} {} 2 3\n", tid, tid, state, ppid));
  }
  static void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }
  std::string root;
};

// Issue 16: the machine's runnable threads against this process's own: a
// thread of another process is runnable only when the machine counts more
// than this process's threads in state R.
TEST(LoadSense, OthersAreTheMachinesRunnableThreadsBeyondThisProcesss) {
  HooksReset reset;
  FakeProc proc(testing::scratch_dir("load_sense", "proc"));
  proc.thread(101, 'R');
  proc.thread(102, 'R');
  proc.thread(103, 'S');
  proc.thread(104, 'R');
  proc.loadavg(3);
  EXPECT_FALSE(load_sense().others_runnable()) << "3 runnable, all 3 of them this process's";
  proc.loadavg(2);
  EXPECT_FALSE(load_sense().others_runnable());
  proc.loadavg(4);
  EXPECT_TRUE(load_sense().others_runnable()) << "4 runnable, 3 of them this process's";
  proc.thread(103, 'R');
  EXPECT_FALSE(load_sense().others_runnable());
  // What cannot be read or parsed answers as before the check: others.
  proc.write(proc.root + "/loadavg", "garbage");
  EXPECT_TRUE(load_sense().others_runnable());
  proc.loadavg(4);
  proc.write(proc.root + "/self/task/102/stat", "102 aiv R");
  EXPECT_TRUE(load_sense().others_runnable());
}

// Issue 16: a worker's forked processes (its fork server's descendants, at
// any depth) and the job's root are the job's own work: a slice lost to them
// is not load. A process the root forked itself (a busy neighbour) is not.
TEST(LoadSense, TheProcessesAWorkerForkedAreNotOthers) {
  HooksReset reset;
  FakeProc proc(testing::scratch_dir("load_sense", "job"));
  const long self = static_cast<long>(getpid());
  LoadSense sense;
  sense.note_fork_server(500, static_cast<int32_t>(self));
  proc.thread(101, 'R');
  proc.process_thread(500, self, 500, 'S');  // the fork server
  proc.process_thread(600, 500, 601, 'R');   // a chip child
  proc.process_thread(600, 500, 602, 'R');
  proc.process_thread(800, 600, 801, 'R');   // a node child's own child
  proc.process_thread(700, self, 701, 'S');  // a busy neighbour, between slices
  proc.loadavg(4);
  EXPECT_FALSE(sense.others_runnable()) << "4 runnable: this process's 101, the job's 601, 602 and 801";
  proc.process_thread(700, self, 701, 'R');
  proc.loadavg(5);
  EXPECT_TRUE(sense.others_runnable()) << "the neighbour's 701 is not the job's";
  proc.process_thread(700, self, 701, 'S');
  proc.loadavg(4);
  sense.forget_fork_server(500);
  EXPECT_TRUE(sense.others_runnable()) << "a reaped server's pid names no job process";
}

// Listing the job reads every process on the machine, so a long batch's ask
// reuses the list for kJobListNs: a process forked since counts as others
// until then, or until a fork server is noted or forgotten.
TEST(LoadSense, TheJobIsListedAgainOnlyWhenItsServersChangeOrTheListAged) {
  HooksReset reset;
  FakeProc proc(testing::scratch_dir("load_sense", "list"));
  const long self = static_cast<long>(getpid());
  LoadSense sense;
  sense.note_fork_server(500, static_cast<int32_t>(self));
  proc.thread(101, 'R');
  proc.process_thread(500, self, 500, 'S');
  proc.loadavg(1);
  EXPECT_FALSE(sense.others_runnable());
  proc.process_thread(600, 500, 601, 'R');  // a child forked since
  proc.loadavg(2);
  EXPECT_TRUE(sense.others_runnable()) << "the job's list was read again before kJobListNs";
  sense.note_fork_server(510, static_cast<int32_t>(self));
  EXPECT_FALSE(sense.others_runnable()) << "a server noted lists the job again";
}

// A forked child counts its job's root and siblings as its own: the record
// of the server it was forked from came with the fork.
TEST(LoadSense, AChildCountsItsJobsRootAndSiblingsAsItsOwn) {
  HooksReset reset;
  FakeProc proc(testing::scratch_dir("load_sense", "child"));
  LoadSense sense;
  sense.note_fork_server(500, 400);  // as inherited: root 400, server 500
  proc.thread(101, 'R');
  proc.process_thread(400, 1, 401, 'R');  // the root
  proc.process_thread(500, 400, 500, 'S');
  proc.process_thread(600, 500, 601, 'R');  // a sibling
  proc.process_thread(900, 1, 901, 'S');
  proc.loadavg(3);
  EXPECT_FALSE(sense.others_runnable()) << "this process's 101, the root's 401, the sibling's 601";
  proc.process_thread(900, 1, 901, 'R');
  proc.loadavg(4);
  EXPECT_TRUE(sense.others_runnable());
}

// Busy threads of another process are always runnable: others_runnable()
// sees them (it counts this process's runnable threads apart, however many
// of its own are busy).
TEST(LoadSense, BusyProcessesBesideThisOneAreOthersRunnable) {
  HooksReset reset;
  hooks::force_others_runnable(-1);
  pid_t busy[2];
  for (pid_t& p : busy) {
    p = fork();
    ASSERT_GE(p, 0);
    if (p == 0) {
      for (;;) {
      }
    }
  }
  const bool seen = eventually([] { return load_sense().others_runnable(); });
  for (pid_t p : busy) {
    kill(p, SIGKILL);
    waitpid(p, nullptr, 0);
  }
  EXPECT_TRUE(seen) << "two busy processes were never seen runnable beside this one";
}

TEST(LoadSense, OffEveryBatchReadsAsQuiet) {
  LoadSense sense;
  sense.set_enabled(false);
  EXPECT_FALSE(sense.note_batch(LoadSense::kLostCpuNs * 100, 1'000'000'000));
  EXPECT_FALSE(sense.oversubscribed(1'000'000'000));
  EXPECT_EQ(sense.lost_batches(), 0u);
}

// A thread waiting on `bell` for `go`, counting each poll of its condition:
// once the bell shows it parked, the count says how long it spun, in polls
// rather than time.
struct CountingWaiter {
  Doorbell bell;
  std::atomic<bool> go{false};
  std::atomic<uint64_t> polls{0};
  std::atomic<bool> returned{false};
  std::thread thread;

  void start(const SpinPolicy& policy) {
    thread = std::thread([this, policy] {
      spin_then_park(
          bell,
          [&] {
            polls.fetch_add(1, std::memory_order_relaxed);
            return go.load(std::memory_order_acquire);
          },
          policy);
      returned.store(true, std::memory_order_release);
    });
  }
  void finish() {
    go.store(true, std::memory_order_release);
    bell.ring();
    thread.join();
  }
};

TEST(LoadSense, OversubscribedAWaitParksAfterOneBatch) {
  HooksReset reset;
  hooks::force_load_state(1);
  CountingWaiter w;
  const SpinPolicy policy{64, 1'000'000'000};  // quiet: a one-second spin
  w.start(policy);
  ASSERT_TRUE(eventually([&] { return w.bell.parked() == 1; })) << "the wait never parked";
  // One batch of pauses, then the re-check after arming the bell.
  EXPECT_LE(w.polls.load(), uint64_t{policy.pauses_per_yield} + 2);
  EXPECT_FALSE(w.returned.load());
  w.finish();
  EXPECT_TRUE(w.returned.load());
}

TEST(LoadSense, ABatchThatLostItsCpuParksTheWaitAndMarksTheProcess) {
  HooksReset reset;
  hooks::force_load_state(-1);
  hooks::force_others_runnable(1);
  // Every batch reads as a lost slice; a quiet window would spin a second.
  hooks::add_spin_batch_gap(LoadSense::kLostCpuNs);
  const uint64_t lost_before = load_sense().lost_batches();
  CountingWaiter w;
  const SpinPolicy policy{64, 1'000'000'000};
  w.start(policy);
  ASSERT_TRUE(eventually([&] { return w.bell.parked() == 1; })) << "the wait never parked";
  EXPECT_LE(w.polls.load(), uint64_t{policy.pauses_per_yield} + 2);
  EXPECT_GE(load_sense().lost_batches(), lost_before + 1);
  EXPECT_TRUE(load_sense().oversubscribed(now_ns()));
  w.finish();
}

// A wait whose condition came true while its yield lost the CPU for a slice
// (the usual case on a loaded machine: the hand-off it waited for happened
// meanwhile) returns at once; that batch is still noted, or every wait would
// go on yielding slices away without the process ever reading as loaded.
TEST(LoadSense, AWaitThatEndsRightAfterALostYieldStillNotesTheBatch) {
  HooksReset reset;
  hooks::force_load_state(0);  // quiet waits: spin and yield
  hooks::force_others_runnable(1);
  const uint64_t lost_before = load_sense().lost_batches();
  Doorbell bell;
  int polls = 0;
  // One pause per yield: the first batch is noted quiet and yields; the
  // poll after that yield finds the condition true, and that batch reads
  // as a lost slice.
  const bool ok = spin_then_park(
      bell,
      [&] {
        if (++polls < 3) return false;
        hooks::add_spin_batch_gap(LoadSense::kLostCpuNs);
        return true;
      },
      SpinPolicy{1, 1'000'000'000});
  EXPECT_TRUE(ok);
  EXPECT_EQ(polls, 3);
  EXPECT_EQ(bell.parked(), 0u);
  EXPECT_EQ(load_sense().lost_batches(), lost_before + 1);
}

// The same for a polling thread (a simulated AICPU or core): the poll after
// a lost yield found work.
TEST(LoadSense, APollThatFindsWorkRightAfterALostYieldStillNotesTheBatch) {
  HooksReset reset;
  hooks::force_load_state(0);
  hooks::force_others_runnable(1);
  const uint64_t lost_before = load_sense().lost_batches();
  IdleSpin idle(1'000'000'000);
  // Quiet, an idle poller yields after every 8th empty poll. Work found
  // after a poll that did not yield costs no look at the clock.
  ASSERT_TRUE(idle.keep_polling()) << "a quiet empty poll polls again";
  hooks::add_spin_batch_gap(LoadSense::kLostCpuNs);
  idle.busy();
  EXPECT_EQ(load_sense().lost_batches(), lost_before);
  hooks::add_spin_batch_gap(0);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(idle.keep_polling());
  EXPECT_EQ(load_sense().lost_batches(), lost_before);
  hooks::add_spin_batch_gap(LoadSense::kLostCpuNs);
  idle.busy();
  EXPECT_EQ(load_sense().lost_batches(), lost_before + 1);
  // Busy again with no idle poll between: nothing more to note.
  idle.busy();
  EXPECT_EQ(load_sense().lost_batches(), lost_before + 1);
}

}  // namespace
}  // namespace simpler
