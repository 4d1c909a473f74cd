// Issue 16, queued dispatch: on the AICPU-dispatch runtimes a core running a
// kernel seen to be short takes more lone tasks behind it (up to
// CoreRegisters::kDepth posted), which it starts without a round trip
// through its AICPU thread. The cases hold one kernel on a gate to show what
// waits behind it: the tasks queued there only until the core has held it
// past the bound (then they are taken back and run elsewhere), nothing behind
// a kernel never seen short, and each queued task's failure as its own.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/errors.h"
#include "device/core_registers.h"
#include "device/sim/sim_device.h"
#include "forced_load.h"
#include "gate.h"
#include "kernels.h"
#include "runtime/common/core_dispatcher.h"
#include "test_util.h"

namespace simpler {
namespace {

using namespace testing;

enum : uint32_t { kQuick = 1, kFresh, kCheck };
constexpr int kTasks = 64;
// CoreDispatcher::kQueueBehindNs (private there): how long a core may have
// ended nothing and still take a task behind what it holds.
constexpr uint64_t kQueueBehindNs = 50'000;

// Which thread started each task (0: not yet), numbered from 1 per thread.
std::array<std::atomic<uint32_t>, kTasks> g_thread{};
std::atomic<int> g_started{0};
std::atomic<uint32_t> g_next_thread{0};
Gate* g_gate = nullptr;
// Every gate made, never freed (gate.h), and kept reachable for LeakSanitizer
// in an array with no destructor.
std::array<Gate*, 64> g_gates{};
std::atomic<size_t> g_gates_made{0};
Gate* new_gate() {
  const size_t n = g_gates_made.fetch_add(1);
  if (n >= g_gates.size()) std::abort();  // a case made more gates than it may
  g_gate = g_gates[n] = new Gate();
  return g_gate;
}

uint32_t this_thread_number() {
  thread_local const uint32_t n = g_next_thread.fetch_add(1) + 1;
  return n;
}

// args: [row (i64, written), index, hold, fail]. Notes its thread, then
// passes g_gate when told to hold and fails when told to.
void quick_kernel(int64_t* args) {
  g_thread[args[1]] = this_thread_number();
  g_started.fetch_add(1);
  if (args[2] != 0) g_gate->pass();
  if (args[3] != 0) {
    simpler_kernel_fail("quick: told to fail");
    return;
  }
  *tensor_data<int64_t>(tensor_arg(args, 0)) = args[1];
}

// Like a held quick kernel, but a kernel of its own, so never seen before.
void fresh_kernel(int64_t* args) {
  g_thread[args[1]] = this_thread_number();
  g_gate->pass();
}

// args: [row (i64, read), flag (i64, written)].
void check_kernel(int64_t* args) { *tensor_data<int64_t>(tensor_arg(args, 1)) = 1; }

KernelLibrary kernels() {
  return make_kernels({{kQuick, CoreType::AIV, "quick", quick_kernel},
                       {kFresh, CoreType::AIV, "fresh", fresh_kernel},
                       {kCheck, CoreType::AIV, "check", check_kernel}});
}

// a: [rows (i64 x kTasks), flags (i64 x kTasks), first (0 quick, 1 quick held,
// 2 fresh held, 3 quick held and alone, writing flags[0]), fail_odd]. Task i
// (a quick one, or task 0 as `first` says) writes row i; with fail_odd, odd tasks fail and
// each row has a check task after it that sets flags[i].
ChipCallable callable() {
  return ChipCallable("queue",
                      [](ChipOrchestrator& o, const TaskArgs& a) -> Status {
                        const TensorView& rows = a[0].tensor;
                        const TensorView& flags = a[1].tensor;
                        const int64_t first = a[2].scalar;
                        const bool fail_odd = a[3].scalar != 0;
                        // A held task alone writes a flag: a later run's tasks need not wait for it.
                        const int64_t tasks = first == 3 ? 1 : kTasks;
                        for (int64_t i = 0; i < tasks; ++i) {
                          SIMPLER_ASSIGN_OR_RETURN(TensorView row, (first == 3 ? flags : rows).tile({i}, {1}));
                          TaskArgs t;
                          t.add_tensor(row, Tag::OutputExisting)
                              .add_scalar(i)
                              .add_scalar(i == 0 && first != 0 ? 1 : 0)
                              .add_scalar(fail_odd && i % 2 == 1 ? 1 : 0);
                          if (auto r = o.submit_aiv(i == 0 && first == 2 ? kFresh : kQuick, t); !r.ok())
                            return r.status();
                        }
                        for (int64_t i = 0; fail_odd && i < kTasks; ++i) {
                          SIMPLER_ASSIGN_OR_RETURN(TensorView row, rows.tile({i}, {1}));
                          SIMPLER_ASSIGN_OR_RETURN(TensorView flag, flags.tile({i}, {1}));
                          TaskArgs t;
                          t.add_tensor(row, Tag::Input).add_tensor(flag, Tag::OutputExisting);
                          if (auto r = o.submit_aiv(kCheck, t); !r.ok()) return r.status();
                        }
                        return Status();
                      },
                      kernels(), {Param::inout(), Param::inout(), Param::scalar(), Param::scalar()});
}

struct Queue {
  explicit Queue(const char* runtime) : hw(callable(), config(runtime)) {
    rows = upload(hw.w, std::vector<int64_t>(kTasks, -1));
    flags = upload(hw.w, std::vector<int64_t>(kTasks, 0));
  }
  static WorkerConfig config(const char* runtime) {
    WorkerConfig c = small_config();
    c.runtime = runtime;
    return c;
  }
  RunHandle submit(int64_t first, bool fail_odd = false) {
    for (auto& t : g_thread) t = 0;
    g_started = 0;
    TaskArgs a;
    a.add_tensor(rows.view({kTasks}, DType::I64), Tag::InOut)
        .add_tensor(flags.view({kTasks}, DType::I64), Tag::InOut)
        .add_scalar(first)
        .add_scalar(fail_odd ? 1 : 0);
    return hw.submit(a);
  }
  // Runs the quick tasks unheld, so the dispatcher has seen the kernel short.
  void warm() {
    for (int r = 0; r < 3; ++r) ASSERT_TRUE(wait_run(submit(0)).ok());
  }
  // Warms, then submits a run whose task 0 (as `first` says) passes g_gate,
  // and waits (bounded) until it is there; true when it got there.
  bool submit_held(int64_t first, RunHandle& run) {
    warm();
    run = submit(first);
    return g_gate->wait_entered(1);
  }

  Harness hw;
  DeviceBuffer rows;
  DeviceBuffer flags;
};

// Opened on every way out, so no Worker's close waits on a held kernel.
struct Opener {
  Gate* gate;
  ~Opener() { gate->release(); }
};

constexpr const char* kRuntimes[] = {"host_build_graph", "tensormap_and_ringbuffer"};

// A quick kernel seen short that blocks (here on a gate) holds its core; the
// tasks the core took behind it are taken back once it has held the core
// past kQueueBehindNs, so every other task starts while it is held, none on
// its core. On host_build_graph, whose launch queues all 64 roots at once,
// the round that posts the held kernel also fills its core with
// kDepth - 1 tasks, which are then taken back; the streaming runtime submits
// them one by one, so whether any reach the held core is a matter of timing
// there, and only the first half is checked.
TEST(QueuedDispatch, TasksQueuedBehindAShortKernelThatBlocksAreTakenBackAndRunElsewhere) {
  ForcedLoadState quiet(0);  // how the cores are fed, not inline runs
  for (const char* runtime : kRuntimes) {
    SCOPED_TRACE(runtime);
    const bool fills_at_launch = std::string(runtime) == "host_build_graph";
    Queue q(runtime);
    // A warm-up preempted on a loaded machine makes the kernel look long for
    // a few runs, so nothing is queued: the attempt is repeated (bounded).
    bool taken_back = false;
    for (int attempt = 0; attempt < (fills_at_launch ? 10 : 1) && !taken_back; ++attempt) {
      Opener opener{new_gate()};
      RunHandle run;
      ASSERT_TRUE(q.submit_held(1, run)) << "the held kernel never reached its gate";
      EXPECT_TRUE(eventually([] { return g_started.load() == kTasks; }))
          << g_started.load() << " of " << kTasks << " tasks started while a quick kernel was held";
      for (int i = 1; i < kTasks; ++i) {
        EXPECT_NE(g_thread[i].load(), g_thread[0].load()) << "task " << i << " ran on the held kernel's core";
      }
      g_gate->release();
      ASSERT_TRUE(wait_run(run).ok());
      taken_back = run.stats().taken_back >= CoreRegisters::kDepth - 1;
    }
    if (fills_at_launch) {
      EXPECT_TRUE(taken_back) << "no core ever held " << CoreRegisters::kDepth - 1
                              << " tasks behind the held kernel to take back";
    }
  }
}

// An AICPU thread with nothing else to do parks, and a kernel that blocks
// rings nothing, so the take-back needs a wake-up: driven here by hand, the
// test thread being AICPU thread 0 of a device whose own AICPU threads poll
// nothing (SimDevice.AParkedAicpuThreadPollsAgainWhenItsProgramAsked shows
// the parked thread's half). While a core holds a task queued behind a
// kernel, the dispatcher asks to be polled again by the time the bound
// passes; a poll after it takes the task back and starts it on the idle
// core, and then nothing is asked for.
std::atomic<bool> g_hand_gate{false};
void hand_kernel(int64_t* args) {
  if (args[0] != 0) {
    EXPECT_TRUE(eventually([] { return g_hand_gate.load(); }));
  }
}

class IdleProgram final : public AicpuProgram {
 public:
  bool poll(uint32_t) override { return false; }
};

TEST(QueuedDispatch, ADispatcherHoldingATaskBehindAKernelAsksToBePolledAgainByTheBound) {
  ForcedLoadState quiet(0);  // how the cores are fed, not inline runs
  Watchdog dog;
  auto dev = SimDevice::create(Geometry::small(), 1 << 20);
  ASSERT_TRUE(dev.ok()) << dev.status().to_string();
  IdleProgram idle;
  (*dev)->start(&idle);
  CoreDispatcher d(**dev);
  CoreDispatcher::Storage storage = std::move(d.make_storage(16, 1)).value();
  d.swap_storage(storage);
  std::array<GraphTask, 4> tasks{};
  for (uint32_t i = 0; i < tasks.size(); ++i) {
    tasks[i].kind = TaskKind::AIV;
    tasks[i].blocks = 1;
    tasks[i].id = i;
    tasks[i].fn[0] = hand_kernel;
    tasks[i].name[0] = "hand";
  }
  std::array<int, 4> done{};
  const auto poll = [&] {
    return d.poll(
        0, [&](ReadyItem it) -> GraphTask& { return tasks[it.task]; },
        [&](const CoreDispatcher::Inflight& f, const char*, std::vector<ReadyItem>&) { ++done[f.task]; });
  };
  const auto push = [&](uint32_t task) { d.push(tasks[task], ReadyItem{0, task}); };
  const auto poll_until = [&](auto&& cond) {
    const uint64_t deadline = now_ns() + static_cast<uint64_t>(std::chrono::nanoseconds(kWait).count());
    while (!cond() && now_ns() < deadline) (void)poll();
    return cond();
  };
  // Seen short: runs of the kernel on each AIV core of cluster 0. A run
  // preempted on a loaded machine reads long, and each later run halves
  // what it left, so several runs make "short" certain under load too.
  constexpr int kSeedRuns = 10;
  for (int run = 1; run <= kSeedRuns; ++run) {
    push(1);
    push(2);
    ASSERT_TRUE(poll_until([&] { return done[1] == run && done[2] == run; }));
  }
  EXPECT_EQ(d.poll_again_by(0), 0u) << "nothing is queued behind a kernel";
  // One round: task 0 on core 1 and task 1 on core 2, then tasks 2 and 3
  // queued behind them (the queue is FIFO, the cores are filled in order).
  g_hand_gate = false;
  tasks[0].args[0] = 1;
  for (uint32_t t : {0u, 1u, 2u, 3u}) push(t);
  ASSERT_TRUE(poll());
  const uint64_t by = d.poll_again_by(0);
  ASSERT_NE(by, 0u) << "tasks wait behind kernels, and the dispatcher asks for no poll";
  EXPECT_TRUE(eventually([&] { return now_ns() >= by; }));
  ASSERT_TRUE(poll_until([&] { return done[1] == kSeedRuns + 1 && done[2] == kSeedRuns + 1 && done[3] == 1; }))
      << "what was queued behind the held kernel did not run while it was held";
  EXPECT_EQ(done[0], 0) << "task 0 ended while held";
  EXPECT_EQ(d.poll_again_by(0), 0u) << "nothing waits behind the held kernel any more";
  g_hand_gate = true;
  EXPECT_TRUE(poll_until([&] { return done[0] == 1; }));
  (*dev)->stop();
}

// A kernel never seen before may run long (or wait on its gang, or on the
// test): nothing is queued behind it, so every other task runs meanwhile.
TEST(QueuedDispatch, NothingWaitsBehindAKernelNeverSeenShort) {
  ForcedLoadState quiet(0);  // how the cores are fed, not inline runs
  for (const char* runtime : kRuntimes) {
    SCOPED_TRACE(runtime);
    Queue q(runtime);
    Opener opener{new_gate()};
    RunHandle run;
    ASSERT_TRUE(q.submit_held(2, run)) << "the held kernel never reached its gate";
    EXPECT_TRUE(eventually([] { return g_started.load() == kTasks - 1; }))
        << g_started.load() << " of " << kTasks - 1 << " tasks started while a fresh kernel was held";
    g_gate->release();
    EXPECT_TRUE(wait_run(run).ok());
  }
}

// A kernel seen short that has held its core past kQueueBehindNs (here on a
// gate, as a kernel on a host flag would) takes no task behind it: a later
// run's tasks all start on the other cores while it is held.
TEST(QueuedDispatch, AShortKernelHeldPastTheBoundTakesNothingBehindIt) {
  ForcedLoadState quiet(0);  // how the cores are fed, not inline runs
  for (const char* runtime : kRuntimes) {
    SCOPED_TRACE(runtime);
    Queue q(runtime);
    Opener opener{new_gate()};
    RunHandle held;
    ASSERT_TRUE(q.submit_held(3, held)) << "the held kernel never reached its gate";
    // The dispatcher saw the core move when it posted the kernel, before it
    // reached the gate: past this the core has ended nothing for longer.
    const uint64_t entered = now_ns();
    ASSERT_TRUE(eventually([&] { return now_ns() - entered > 2 * kQueueBehindNs; }));
    RunHandle later = q.submit(0);
    EXPECT_TRUE(eventually([] { return g_started.load() == kTasks; }))
        << g_started.load() << " of " << kTasks << " tasks of the later run started beside the held kernel";
    g_gate->release();
    EXPECT_TRUE(wait_run(held).ok());
    EXPECT_TRUE(wait_run(later).ok());
  }
}

// Each queued task's failure is read from its own slot: exactly the failing
// (odd) tasks' checks are poisoned, whichever tasks were queued where.
TEST(QueuedDispatch, EachQueuedTaskFailsOrSucceedsAsItsOwnKernelDid) {
  ForcedLoadState quiet(0);  // how the cores are fed, not inline runs
  for (const char* runtime : kRuntimes) {
    SCOPED_TRACE(runtime);
    Queue q(runtime);
    for (int r = 0; r < 5; ++r) {
      q.warm();
      ASSERT_TRUE(q.hw.w.copy_to(q.flags, std::vector<int64_t>(kTasks, 0).data(), kTasks * sizeof(int64_t)).ok());
      const Status s = wait_run(q.submit(0, /*fail_odd=*/true));
      EXPECT_FALSE(s.ok());
      EXPECT_NE(s.message().find("quick: told to fail"), std::string::npos) << s.to_string();
      const std::vector<int64_t> flags = download<int64_t>(q.hw.w, q.flags, kTasks);
      for (int i = 0; i < kTasks; ++i) {
        EXPECT_EQ(flags[i], i % 2 == 0 ? 1 : 0) << "run " << r << ": check of task " << i;
      }
    }
  }
}

}  // namespace
}  // namespace simpler
