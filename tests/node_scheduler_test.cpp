// The Scheduler and its lanes against endpoints with no child, an in-process
// mock child (R17) and a forked child running the scripted handler: the
// admission and backpressure cases R32-R37, and the coherent snapshot (R74)
// and observer lifetime (R75).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "base/doorbell.h"
#include "base/load_sense.h"
#include "base/shared_memory.h"
#include "forced_load.h"
#include "ipc/forked_child.h"
#include "ipc/mailbox_endpoint.h"
#include "ipc_test_util.h"
#include "node/observer.h"
#include "node/scheduler.h"
#include "node/worker_lane.h"
#include "task/args_blob.h"
#include "test_util.h"

namespace simpler::testing {
namespace {

enum class ChildKind { kNone, kMock, kForked };

// A port in front of the fixture's real one (inner_, set by the fixture).
class WrappingPort : public EndpointPort {
 public:
  EndpointPort* inner_ = nullptr;
};

// Fails every publication while armed, writing nothing; otherwise the real endpoint.
class FaultPort final : public WrappingPort {
 public:
  uint32_t available_request_transport() override { return inner_->available_request_transport(); }
  uint64_t max_inflight_tasks() const override { return inner_->max_inflight_tasks(); }
  Result<Publication> publish(const PublishSpec& spec) override {
    if (armed && (!staged_only || spec.staged)) return internal_error("injected publication fault");
    return inner_->publish(spec);
  }
  Status activate(const Publication& p, bool launch) override { return inner_->activate(p, launch); }
  void poll(std::vector<EndpointEvent>& out) override { inner_->poll(out); }
  void poison(const Status& cause) override { inner_->poison(cause); }
  std::optional<Status> poisoned() const override { return inner_->poisoned(); }
  bool armed = true;
  bool staged_only = false;  // fail only staged publications
};

// A port whose news the Scheduler sees only once someone receives it, as a
// remote node's (RemotePort): the mailbox's events wait until a waiter
// standing in has looked kLooks times since they came (a spin, not one look
// and a park, is what receives them), or until the port's own receiver, the
// test thread here, takes them after the waiter handed the receiving back.
class PolledPort final : public WrappingPort {
 public:
  static constexpr int kLooks = 4;
  uint32_t available_request_transport() override {
    std::lock_guard<std::mutex> lock(mu_);
    return inner_->available_request_transport();
  }
  uint64_t max_inflight_tasks() const override { return inner_->max_inflight_tasks(); }
  Result<Publication> publish(const PublishSpec& spec) override {
    std::lock_guard<std::mutex> lock(mu_);
    Result<Publication> p = inner_->publish(spec);
    if (p.ok()) ++published_;
    return p;
  }
  Status activate(const Publication& p, bool launch) override {
    std::lock_guard<std::mutex> lock(mu_);
    return inner_->activate(p, launch);
  }
  void poll(std::vector<EndpointEvent>& out) override {
    std::lock_guard<std::mutex> lock(mu_);
    out.insert(out.end(), received_.begin(), received_.end());
    received_.clear();
  }
  void poison(const Status& cause) override {
    std::lock_guard<std::mutex> lock(mu_);
    inner_->poison(cause);
  }
  std::optional<Status> poisoned() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return inner_->poisoned();
  }
  bool needs_polling() const override { return true; }
  void receive_standing_in() override {
    std::lock_guard<std::mutex> lock(mu_);
    inner_->poll(arrived_);
    if (!arrived_.empty() && ++looks_ >= kLooks) deliver(by_stand_in_);
  }
  void stop_standing_in() override { handed_back_.store(true); }
  // The port's own receiver, once the waiter handed back or parked.
  void receive_as_own_thread() {
    std::lock_guard<std::mutex> lock(mu_);
    inner_->poll(arrived_);
    if (!arrived_.empty()) deliver(by_own_thread_);
  }
  int published() const { return published_.load(); }
  bool handed_back() const { return handed_back_.load(); }
  void forget_hand_back() { handed_back_.store(false); }
  int by_stand_in() const { return by_stand_in_.load(); }
  int by_own_thread() const { return by_own_thread_.load(); }
  Doorbell* bell = nullptr;  // the Scheduler's

 private:
  void deliver(std::atomic<int>& taker) {
    for (const EndpointEvent& ev : arrived_) {
      if (ev.kind == EndpointEvent::Kind::kTerminal) ++taker;
      received_.push_back(ev);
    }
    arrived_.clear();
    looks_ = 0;
    bell->ring();
  }

  mutable std::mutex mu_;
  std::vector<EndpointEvent> arrived_;   // from the mailbox, not yet received
  std::vector<EndpointEvent> received_;  // for the Scheduler's next poll
  int looks_ = 0;
  std::atomic<int> published_{0};
  std::atomic<bool> handed_back_{false};
  std::atomic<int> by_stand_in_{0};
  std::atomic<int> by_own_thread_{0};
};

// One endpoint (G sets), its port and a scheduler over it, with the child of
// the given kind serving it (kNone: nobody ever hands a frame back).
struct SchedFixture {
  explicit SchedFixture(ChildKind kind, uint64_t grant = 8, WrappingPort* wrap = nullptr,
                        uint64_t driver_grace_ns = Scheduler::kDriverGraceNs) {
    auto g = SharedMapping::create_anonymous(sizeof(TestGates));
    EXPECT_TRUE(g.ok());
    gates_mapping = std::move(g).value();
    gates = new (gates_mapping.data()) TestGates();
    if (kind == ChildKind::kForked) {
      SpawnOptions o;
      o.granted_sets = grant;
      TestGates* gp = gates;
      auto c = ForkedChild::spawn([gp] { return std::make_unique<TestHandler>(gp); }, o);
      EXPECT_TRUE(c.ok()) << c.status().to_string();
      child = std::move(c).value();
      ep = &child->endpoint();
    } else {
      auto m = SharedMapping::create_anonymous(*mailbox_size(grant));
      EXPECT_TRUE(m.ok());
      mailbox = std::move(m).value();
      auto e = MailboxEndpoint::create(mailbox.data(), mailbox.size(), grant);
      EXPECT_TRUE(e.ok());
      owned_ep = std::move(e).value();
      ep = owned_ep.get();
      if (kind == ChildKind::kMock) {
        mock = std::make_unique<MockMailboxWorker>(ep->view(), gates);
        mock_thread = std::thread([this] { mock->run(); });
        EXPECT_TRUE(ep->wait_ready(now_ns() + kTestWaitNs).ok());
      }
    }
    port = std::make_unique<MailboxPort>(*ep);
    if (wrap != nullptr) wrap->inner_ = port.get();
    EndpointPort* p = wrap != nullptr ? static_cast<EndpointPort*>(wrap) : port.get();
    Scheduler::Hooks hooks;
    hooks.free_heap = [](uint64_t) {};
    sched = std::make_unique<Scheduler>(std::vector<EndpointPort*>{p}, std::vector<EndpointPort*>{},
                                        &ep->view().control().parent_bell, hooks, Scheduler::kDefaultRunSets,
                                        driver_grace_ns);
  }
  ~SchedFixture() {
    for (int i = 0; i < 64; ++i) gates->open_gate(i);
    if (started) sched->stop(now_ns() + kTestWaitNs);
    sched.reset();
    if (mock_thread.joinable()) {
      ep->request_shutdown();
      mock_thread.join();
    }
    if (child) {
      std::vector<EndpointEvent> rest;
      (void)child->close(now_ns() + kTestWaitNs, rest);
    }
  }

  // A run of one chip task on worker 0 whose child follows `script`.
  RunHandle submit(const std::string& script, std::function<void(const Status&)> on_terminal = {}) {
    auto run = std::make_unique<NodeRun>();
    run->id = next_run++;
    run->handle = new_state(run->id);
    run->handle->on_terminal = std::move(on_terminal);
    auto t = std::make_unique<NodeTask>();
    t->id = next_task++;
    t->run = run.get();
    t->config.assign(script.begin(), script.end());
    EXPECT_TRUE(encode_args_blob(TaskArgs{}, t->blob).ok());
    run->tasks.push_back(std::move(t));
    RunHandle h(run->handle);
    sched->enqueue(std::move(run));
    return h;
  }
  // One run of several chip tasks on worker 0. Each task names the fake
  // device buffers it writes and reads (ids), which is all the TensorMap
  // needs to order them; the child sees only the script.
  struct TaskSpec {
    std::string script;
    std::vector<int> writes;
    std::vector<int> reads;
  };
  RunHandle submit_tasks(const std::vector<TaskSpec>& specs) {
    auto run = std::make_unique<NodeRun>();
    run->id = next_run++;
    run->handle = new_state(run->id);
    for (const TaskSpec& s : specs) {
      auto t = std::make_unique<NodeTask>();
      t->id = next_task++;
      t->index = static_cast<uint32_t>(run->tasks.size());
      t->run = run.get();
      t->config.assign(s.script.begin(), s.script.end());
      EXPECT_TRUE(encode_args_blob(TaskArgs{}, t->blob).ok());
      auto view = [](int b) { return TensorView(DeviceBuffer{0x100000u + 0x1000u * b, 256}, {64}, DType::F32); };
      for (int b : s.writes) t->args.add_tensor(view(b), Tag::OutputExisting);
      for (int b : s.reads) t->args.add_tensor(view(b), Tag::Input);
      run->tasks.push_back(std::move(t));
    }
    RunHandle h(run->handle);
    sched->enqueue(std::move(run));
    return h;
  }
  // The hand-back a child makes after copying the payload out (frame word
  // to IDLE, then the ACK into the entry its header names), for the frame
  // carrying task_slot `slot`; the run itself stays unfinished.
  void hand_back(uint32_t slot) {
    const MailboxView v = ep->view();
    for (size_t f = 0; f < kMailboxRequestFrames; ++f) {
      RequestHeader& h = v.frame(f).header;
      const uint32_t ready = load_acquire(h.ready);
      if ((ready != kMailboxTaskReady && ready != kMailboxPrepareReady) || h.task_slot != slot) continue;
      store_release(v.entry(h.entry_index).state, static_cast<uint32_t>(kMailboxFrameStaged));
      store_release(h.ready, static_cast<uint32_t>(kMailboxIdle));
      store_release(v.entry(h.entry_index).consumed_ack, load_acquire(h.publication));
      return;
    }
    ADD_FAILURE() << "no published frame carries task_slot " << slot;
  }
  // The terminal a child stores for the run in the entry carrying `slot`
  // (of run `run_id`, when not 0), after the hand-back of its frame when the
  // test made none: the parent refuses a terminal before its ACK.
  void complete(uint32_t slot, StatusCode code = StatusCode::kOk, uint64_t run_id = 0) {
    const MailboxView v = ep->view();
    for (uint64_t i = 0; i < v.entry_count(); ++i) {
      MailboxRunEntry& e = v.entry(i);
      if (load_acquire(e.entry_generation) % 2 == 0 || e.task_slot != slot) continue;
      if (run_id != 0 && e.run_id != run_id) continue;
      for (size_t f = 0; f < kMailboxRequestFrames && load_acquire(e.consumed_ack) == 0; ++f) {
        RequestHeader& h = v.frame(f).header;
        const uint32_t ready = load_acquire(h.ready);
        if ((ready != kMailboxTaskReady && ready != kMailboxPrepareReady) || h.entry_index != i) continue;
        store_release(h.ready, static_cast<uint32_t>(kMailboxIdle));
        store_release(e.consumed_ack, load_acquire(h.publication));
      }
      store_release(e.rc, static_cast<int32_t>(code));
      copy_text(e.error_text, sizeof e.error_text, code == StatusCode::kOk ? "" : "scripted failure");
      store_release(e.state, static_cast<uint32_t>(code == StatusCode::kOk ? kMailboxTaskDone : kMailboxTaskFailed));
      return;
    }
    ADD_FAILURE() << "no held entry carries task_slot " << slot;
  }
  // The frame carrying task_slot `slot`, and its readiness word.
  std::optional<std::pair<size_t, uint32_t>> frame_of(uint32_t slot) const {
    const MailboxView v = ep->view();
    for (size_t f = 0; f < kMailboxRequestFrames; ++f) {
      const RequestHeader& h = v.frame(f).header;
      const uint32_t ready = load_acquire(h.ready);
      if ((ready == kMailboxTaskReady || ready == kMailboxPrepareReady) && h.task_slot == slot) {
        return std::make_pair(f, ready);
      }
    }
    return std::nullopt;
  }
  // The state of the held entry carrying `slot` (kMailboxIdle when none).
  uint32_t entry_state(uint32_t slot) const {
    const MailboxView v = ep->view();
    for (uint64_t i = 0; i < v.entry_count(); ++i) {
      const MailboxRunEntry& e = v.entry(i);
      if (load_acquire(e.entry_generation) % 2 == 1 && load_acquire(e.task_slot) == slot) return load_acquire(e.state);
    }
    return kMailboxIdle;
  }
  // The mock child parks on its own bell, not the gates' one: ring both.
  void open_gate(int n) {
    gates->open_gate(n);
    ep->view().control().child_bell.ring();
  }
  void start() {
    sched->start();
    started = true;
  }
  // A run's completion record; its waiters drive the Scheduler when
  // `waiter_drives` (as NodeWorker's runs do).
  std::shared_ptr<detail::RunState> new_state(uint64_t id) {
    auto st = std::make_shared<detail::RunState>(id, run_spin);
    if (waiter_drives) st->driver = sched->waiter_driver();
    return st;
  }

  SharedMapping gates_mapping;
  TestGates* gates = nullptr;
  SharedMapping mailbox;
  std::unique_ptr<MailboxEndpoint> owned_ep;
  std::unique_ptr<ForkedChild> child;
  MailboxEndpoint* ep = nullptr;
  std::unique_ptr<MockMailboxWorker> mock;
  std::thread mock_thread;
  std::unique_ptr<MailboxPort> port;
  std::unique_ptr<Scheduler> sched;
  bool started = false;
  bool waiter_drives = false;
  SpinPolicy run_spin = kNodeSpin;  // how a run's waiter spins before it parks
  uint64_t next_run = 1;
  uint64_t next_task = 1;
};

class SchedulerCases : public ::testing::TestWithParam<ChildKind> {};

// R32: G = 8 > K = 2 with a slow child (every run waits for gate 0): 64
// submissions never reach a failing publication, and every one completes.
TEST_P(SchedulerCases, R32SaturationIsAnOrdinaryState) {
  Watchdog dog;
  SchedFixture fx(GetParam(), 8);
  fx.start();
  std::vector<RunHandle> runs;
  for (int i = 0; i < 64; ++i) runs.push_back(fx.submit("gate=0"));
  // The child's thread counts handler calls with an atomic add; read them atomically too.
  ASSERT_TRUE(eventually([&] { return load_acquire(fx.gates->handler_calls) >= 10; }))
      << "the child never held M = G + K runs";
  fx.open_gate(0);
  for (auto& r : runs) EXPECT_TRUE(wait_run(r).ok()) << r.result().to_string();
  EXPECT_FALSE(fx.ep->poisoned().has_value());
  EXPECT_EQ(load_acquire(fx.gates->handler_calls), 64u);
}

// R17: the same scheduler drives the mock and a forked child alike: results,
// failures and their texts arrive per run.
TEST_P(SchedulerCases, R17RunsAndFailuresThroughEitherChild) {
  Watchdog dog;
  SchedFixture fx(GetParam(), 4);
  fx.start();
  RunHandle ok = fx.submit("text=fine");
  RunHandle bad = fx.submit("fail=6;text=kernel says no");
  EXPECT_TRUE(wait_run(ok).ok());
  Status st = wait_run(bad);
  EXPECT_EQ(st.code(), StatusCode::kKernelFailed);
  EXPECT_TRUE(contains(st.message(), "kernel says no")) << st.to_string();
}

// A driver that never goes quiet: the own thread takes over only when released.
constexpr uint64_t kNeverQuietNs = 3'600'000'000'000ull;

// Drives `fx`'s scheduler until every run in `runs` ended, or the deadline.
bool drive_until_done(SchedFixture& fx, const std::vector<RunHandle>& runs) {
  const uint64_t deadline = now_ns() + kTestWaitNs;
  const auto all_done = [&] {
    return std::all_of(runs.begin(), runs.end(), [](const RunHandle& r) { return r.done(); });
  };
  while (!all_done()) {
    if (now_ns() >= deadline) return false;
    if (!fx.sched->drive()) yield_cpu();
  }
  return true;
}

// Starts `fx`'s scheduler with this thread as its driver; true once the own
// thread stands by.
bool start_driven(SchedFixture& fx) {
  fx.start();
  (void)fx.sched->drive();
  return eventually([&] { return fx.sched->standing_by(); });
}

// A thread that polls anyway stands in for the scheduler thread (a node
// child's serve loop): its rounds alone carry the runs to their terminals,
// and the Scheduler's own thread stands by instead of spinning beside it.
TEST(SchedulerDriver, ADriverCarriesTheRunsWhileTheOwnThreadStandsBy) {
  Watchdog dog;
  SchedFixture fx(ChildKind::kMock, 4, nullptr, kNeverQuietNs);
  ASSERT_TRUE(start_driven(fx)) << "the own thread never stood by";
  const uint64_t own = fx.sched->own_rounds();
  std::vector<RunHandle> runs;
  for (int i = 0; i < 16; ++i) runs.push_back(fx.submit(i % 4 == 3 ? "fail=6;text=no" : "text=fine"));
  ASSERT_TRUE(drive_until_done(fx, runs)) << "the driver's rounds did not finish the runs";
  for (size_t i = 0; i < runs.size(); ++i) {
    EXPECT_EQ(runs[i].result().code(), i % 4 == 3 ? StatusCode::kKernelFailed : StatusCode::kOk)
        << runs[i].result().to_string();
  }
  EXPECT_EQ(fx.sched->own_rounds(), own) << "the own thread kept stepping beside its driver";
}

// A driver that stops calling (inside a long orchestration, say) holds
// nothing up for longer than the grace: the own thread takes over.
TEST(SchedulerDriver, AQuietDriverIsReplacedAfterTheGrace) {
  Watchdog dog;
  SchedFixture fx(ChildKind::kMock, 4, nullptr, /*driver_grace_ns=*/2'000'000);
  fx.start();
  (void)fx.sched->drive();
  const uint64_t own = fx.sched->own_rounds();
  RunHandle r = fx.submit("text=fine");
  EXPECT_TRUE(wait_run(r).ok()) << r.result().to_string();
  EXPECT_GT(fx.sched->own_rounds(), own);
}

// release_driver() hands the rounds back at once, without waiting out the grace.
TEST(SchedulerDriver, ReleaseHandsTheRoundsBackAtOnce) {
  Watchdog dog;
  SchedFixture fx(ChildKind::kMock, 4, nullptr, kNeverQuietNs);
  ASSERT_TRUE(start_driven(fx)) << "the own thread never stood by";
  fx.sched->release_driver();
  RunHandle r = fx.submit("text=fine");
  EXPECT_TRUE(wait_run(r).ok()) << r.result().to_string();
}

// The role changes hands many times while runs are in flight (the driver
// comes, stands in, releases; the own thread takes over between): every run
// still ends once, with its own result.
TEST(SchedulerDriver, RunsSurviveTheRoleChangingHands) {
  Watchdog dog;
  SchedFixture fx(ChildKind::kMock, 4, nullptr, /*driver_grace_ns=*/50'000);
  fx.start();
  std::vector<RunHandle> runs;
  for (int i = 0; i < 200; ++i) {
    runs.push_back(fx.submit(i % 7 == 0 ? "fail=6;text=seven" : "text=fine"));
    for (int k = 0; k < i % 5; ++k) (void)fx.sched->drive();
    if (i % 3 == 0) fx.sched->release_driver();
  }
  fx.sched->release_driver();
  for (size_t i = 0; i < runs.size(); ++i) {
    const Status st = wait_run(runs[i]);
    EXPECT_EQ(st.code(), i % 7 == 0 ? StatusCode::kKernelFailed : StatusCode::kOk)
        << "run " << i << ": " << st.to_string();
  }
}

// A started fixture whose runs' waiters drive its Scheduler.
struct WaiterFixture : SchedFixture {
  WaiterFixture(ChildKind kind, uint64_t grant, uint64_t driver_grace_ns)
      : SchedFixture(kind, grant, nullptr, driver_grace_ns) {
    waiter_drives = true;
    start();
  }
};

// A thread waiting for `run` from construction.
class WaitingThread {
 public:
  explicit WaitingThread(RunHandle run) : run_(std::move(run)), thread_([this] { result_ = run_.wait(); }) {}
  ~WaitingThread() {
    if (thread_.joinable()) thread_.join();
  }
  Status join() {
    thread_.join();
    return result_;
  }

 private:
  RunHandle run_;
  Status result_ = internal_error("the waiter did not return");
  std::thread thread_;
};

// Whether a waiter comes to drive `fx`'s Scheduler, with its own thread standing by.
bool waiter_drives(SchedFixture& fx) {
  return eventually([&] { return fx.sched->driving_waiters() == 1 && fx.sched->standing_by(); });
}

// R34's scheduler thread is a role: a thread waiting for a run steps the
// rounds itself (no hop to the scheduler thread and back), and the own
// thread stands by. Parked, the waiter stays the driver: the child's
// terminal rings the Scheduler's bell, which wakes it, and its own round
// ends the run.
TEST(SchedulerWaiter, AWaiterCarriesItsRunWhileTheOwnThreadStandsBy) {
  Watchdog dog;
  WaiterFixture fx(ChildKind::kMock, 4, kNeverQuietNs);
  WaitingThread waiter(fx.submit("gate=1;text=fine"));
  EXPECT_TRUE(waiter_drives(fx)) << "the waiter did not take the rounds over";
  EXPECT_TRUE(eventually([&] { return fx.ep->view().control().parent_bell.parked() != 0; }))
      << "the waiter never parked on the Scheduler's bell";
  const uint64_t own = fx.sched->own_rounds();
  fx.open_gate(1);
  const Status result = waiter.join();
  EXPECT_TRUE(result.ok()) << result.to_string();
  EXPECT_EQ(fx.sched->own_rounds(), own) << "the own thread stepped the round that ended the waiter's run";
}

// Issue 15: a waiter whose lone run has a task on a port that needs polling
// (a remote node, whose answer no thread of this process produces) receives
// for that port itself while it spins, even with one usable CPU, instead of
// looking once and parking until the port's own thread hands the answer over.
TEST(SchedulerWaiter, WithOneCpuAWaiterReceivesForAPortThatNeedsPolling) {
  Watchdog dog;
  testing::ForcedLoadState quiet(0);
  testing::LoadSenseOff sense_off;  // a yield that loses its slice does not end the spin
  hooks::force_usable_cpus(1);
  PolledPort polled;
  SchedFixture fx(ChildKind::kMock, 4, &polled, kNeverQuietNs);
  polled.bell = &fx.ep->view().control().parent_bell;
  fx.waiter_drives = true;
  // A window no preemption outlasts: only the one-CPU rule could park the waiter.
  fx.run_spin.spin_ns = 10'000'000'000ull;
  fx.start();
  constexpr int kRuns = 3;
  for (int i = 0; i < kRuns; ++i) {
    polled.forget_hand_back();
    RunHandle run = fx.submit("text=fine");
    // Out on the port before the waiter comes, so it stands in from its first look.
    ASSERT_TRUE(eventually([&] { return polled.published() == i + 1; })) << "run " << i << " was never published";
    std::atomic<bool> returned{false};
    Status result = internal_error("the waiter did not return");
    std::thread waiter([&] {
      result = run.wait();
      returned.store(true);
    });
    // This thread is the port's own receiver: it takes over once the waiter
    // handed the receiving back, and, so that a waiter that never stands in
    // fails instead of hanging, after a deadline.
    const uint64_t deadline = now_ns() + kTestWaitNs;
    bool in_time = true;
    while (!returned.load()) {
      in_time = in_time && now_ns() < deadline;
      if (polled.handed_back() || !in_time) polled.receive_as_own_thread();
      // A receiver's poll, not a spin beside the waiter on its one CPU.
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    waiter.join();
    EXPECT_TRUE(in_time) << "the waiter neither received its run's answer nor handed the receiving back";
    EXPECT_TRUE(result.ok()) << result.to_string();
  }
  EXPECT_EQ(polled.by_stand_in(), kRuns) << "a waiter did not receive its run's answer itself";
  EXPECT_EQ(polled.by_own_thread(), 0);
}

// A waiter waits for a run held at `gate` until the own thread stands by
// for it, then for the run's end: the own thread (never quiet for a grace
// of kNeverQuietNs) goes on standing by after the waiter has left.
bool waiter_leaves_the_own_thread_standing_by(SchedFixture& fx, int gate) {
  WaitingThread waiter(fx.submit(fmt::format("gate={};text=fine", gate)));
  const bool stood_by = waiter_drives(fx);
  fx.open_gate(gate);
  const Status result = waiter.join();
  EXPECT_TRUE(result.ok()) << result.to_string();
  return stood_by && result.ok() && fx.sched->standing_by();
}

// A waiter whose run has others in flight beside it does not drive: their
// hand-offs overlap anyway, and the own thread's rounds run beside the
// waiter's own work. The own thread, standing by for an earlier waiter, is
// woken to carry them.
TEST(SchedulerWaiter, AWaiterAmongRunsInFlightLeavesThemToTheOwnThread) {
  Watchdog dog;
  WaiterFixture fx(ChildKind::kMock, 4, kNeverQuietNs);
  ASSERT_TRUE(waiter_leaves_the_own_thread_standing_by(fx, 8));
  RunHandle first = fx.submit("gate=9;text=fine");
  RunHandle second = fx.submit("gate=9;text=fine");
  Status result = internal_error("the waiter did not return");
  std::thread waiter([&] { result = first.wait(); });
  EXPECT_TRUE(eventually([&] { return !fx.sched->standing_by(); })) << "the own thread was left standing by";
  EXPECT_EQ(fx.sched->driving_waiters(), 0u) << "a waiter among runs in flight drives";
  fx.open_gate(9);
  waiter.join();
  EXPECT_TRUE(result.ok()) << result.to_string();
  EXPECT_TRUE(second.wait().ok()) << second.result().to_string();
}

// A waiter parked on the Scheduler's bell whose run another thread ends
// (here a poller's round, after a terminal that rang no bell) is woken by
// that round, not left parked until some later event.
TEST(SchedulerWaiter, AParkedWaiterWakesWhenAnotherThreadEndsItsRun) {
  Watchdog dog;
  WaiterFixture fx(ChildKind::kNone, 8, kNeverQuietNs);
  RunHandle r = fx.submit("");
  std::atomic<bool> returned{false};
  Status result = internal_error("the waiter did not return");
  std::thread waiter([&] {
    result = r.wait();
    returned.store(true);
  });
  Doorbell& bell = fx.ep->view().control().parent_bell;
  ASSERT_TRUE(eventually([&] { return bell.parked() != 0 && fx.sched->standing_by(); }))
      << "the waiter never parked on the Scheduler's bell";
  ASSERT_TRUE(fx.frame_of(0).has_value()) << "the waiter's rounds did not publish its run";
  fx.complete(0);
  EXPECT_TRUE(r.done()) << "the poller's round did not end the run";
  EXPECT_TRUE(eventually([&] { return returned.load(); })) << "the parked waiter was not woken";
  bell.ring();  // lets a waiter that was not woken finish, so the test ends
  waiter.join();
  EXPECT_TRUE(result.ok()) << result.to_string();
}

// A waiter that returns while other runs are live leaves them to the own
// thread, which takes the rounds back once nobody has stepped them for the
// grace: nothing waits on a thread that went away.
TEST(SchedulerWaiter, RunsAWaiterLeftLiveAreTakenOverAfterTheGrace) {
  Watchdog dog;
  WaiterFixture fx(ChildKind::kMock, 4, /*driver_grace_ns=*/2'000'000);
  std::atomic<bool> held_done{false};
  RunHandle held = fx.submit("gate=2;text=fine", [&](const Status&) { held_done.store(true); });
  RunHandle quick = fx.submit("text=fine");
  ASSERT_TRUE(quick.wait().ok()) << quick.result().to_string();
  const uint64_t own = fx.sched->own_rounds();
  fx.open_gate(2);
  // Neither wait() nor done(): either would step the rounds itself.
  EXPECT_TRUE(eventually([&] { return held_done.load(); })) << "the run left live never ended";
  EXPECT_GT(fx.sched->own_rounds(), own) << "the own thread never took the rounds back";
  EXPECT_TRUE(held.result().ok()) << held.result().to_string();
}

// While the own thread stands by for a waiter that has gone, a submission
// is admitted and published by its submitter before enqueue() returns: a
// run submitted and then left alone (the caller goes on with other work)
// starts at once.
TEST(SchedulerWaiter, ARunSubmittedWhileTheOwnThreadStandsByIsPublishedBySubmit) {
  Watchdog dog;
  WaiterFixture fx(ChildKind::kMock, 4, kNeverQuietNs);
  ASSERT_TRUE(waiter_leaves_the_own_thread_standing_by(fx, 3));
  // Only this thread steps rounds now: the own thread stands by for good.
  const uint64_t published = fx.sched->publications();
  RunHandle second = fx.submit("gate=13;text=fine");
  EXPECT_EQ(fx.sched->publications(), published + 1) << "the run waits for a round nobody will step";
  fx.open_gate(13);
  EXPECT_TRUE(second.wait().ok()) << second.result().to_string();
}

// A thread that polls done() instead of waiting carries the run too: each
// poll steps a round, so the run ends without the own thread.
TEST(SchedulerWaiter, PollingDoneCarriesARun) {
  Watchdog dog;
  WaiterFixture fx(ChildKind::kMock, 4, kNeverQuietNs);
  ASSERT_TRUE(waiter_leaves_the_own_thread_standing_by(fx, 6));
  RunHandle polled = fx.submit("text=fine");
  EXPECT_TRUE(eventually([&] { return polled.done(); })) << "polling done() never ended the run";
  EXPECT_TRUE(polled.result().ok()) << polled.result().to_string();
}

// A terminal callback that waits for another run (within a round) does not
// step a round inside that round: it waits on the run's own bell, here
// until its deadline, and the Scheduler goes on.
TEST(SchedulerWaiter, ACallbackWaitingInsideARoundDoesNotStepAnother) {
  Watchdog dog;
  WaiterFixture fx(ChildKind::kMock, 4, Scheduler::kDriverGraceNs);
  RunHandle held = fx.submit("gate=4;text=fine");
  Status inner = internal_error("the callback did not run");
  std::atomic<bool> waiting{false};
  std::atomic<bool> called{false};
  RunHandle outer = fx.submit("text=fine", [&](const Status&) {
    waiting.store(true);
    inner = held.wait_for(std::chrono::milliseconds(300));
    called.store(true);
  });
  ASSERT_TRUE(outer.wait().ok()) << outer.result().to_string();
  // The handle completes before its callback runs, on whichever thread ended it.
  ASSERT_TRUE(eventually([&] { return waiting.load(); }));
  EXPECT_EQ(fx.sched->driving_waiters(), 0u) << "the callback's wait drives from inside a round";
  ASSERT_TRUE(eventually([&] { return called.load(); }));
  EXPECT_EQ(inner.code(), StatusCode::kDeadlineExceeded) << inner.to_string();
  fx.open_gate(4);
  EXPECT_TRUE(held.wait().ok()) << held.result().to_string();
}

// stop() with a waiter inside, driving a run that will never end on its
// own: the run ends with the stop's abort, the waiter returns it, and stop()
// returns once the waiter has left the Scheduler.
TEST(SchedulerWaiter, StopEndsTheRunOfAWaiterInsideAndWaitsForItToLeave) {
  Watchdog dog;
  WaiterFixture fx(ChildKind::kMock, 4, kNeverQuietNs);
  RunHandle stuck = fx.submit("gate=5;text=never");
  WaitingThread waiter(stuck);
  ASSERT_TRUE(waiter_drives(fx));
  fx.sched->stop(now_ns() + 20'000'000);
  fx.started = false;
  EXPECT_EQ(fx.sched->driving_waiters(), 0u);
  const Status result = waiter.join();
  EXPECT_EQ(result.code(), StatusCode::kAborted) << result.to_string();
  fx.sched.reset();
  EXPECT_EQ(stuck.wait().code(), StatusCode::kAborted) << "a handle outliving its Scheduler";
  EXPECT_TRUE(stuck.done());
}

// Waiters on several threads and the own thread (a short grace, so it takes
// the rounds back between waits) share the role: every run ends once, with
// its own result.
TEST(SchedulerWaiter, ManyWaitersAndTheOwnThreadShareTheRounds) {
  Watchdog dog;
  WaiterFixture fx(ChildKind::kMock, 8, /*driver_grace_ns=*/50'000);
  std::mutex submit_mu;  // the fixture's run and task ids
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (int i = 0; i < 100; ++i) {
        const bool fails = (i + w) % 7 == 0;
        RunHandle r;
        {
          std::lock_guard<std::mutex> lock(submit_mu);
          r = fx.submit(fails ? "fail=6;text=seven" : "text=fine");
        }
        const Status st = i % 2 == 0 ? r.wait() : r.wait_for(kWait);
        if (st.code() != (fails ? StatusCode::kKernelFailed : StatusCode::kOk)) wrong.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(MockAndForked, SchedulerCases, ::testing::Values(ChildKind::kMock, ChildKind::kForked),
                         [](const auto& info) { return info.param == ChildKind::kMock ? "Mock" : "Forked"; });

// R33: with no free frame a READY task is not claimed: it stays READY, and no
// RUNNING task sits without a frame. The child never hands a frame back.
TEST(SchedulerGates, R33NoFrameMeansTheTaskStaysReady) {
  SchedFixture fx(ChildKind::kNone, 8);
  for (int i = 0; i < 3; ++i) (void)fx.submit("");
  EXPECT_TRUE(fx.sched->step());
  EXPECT_EQ(fx.sched->publications(), kMailboxRequestFrames);
  EXPECT_EQ(fx.sched->ready_count(), 1u);
  EXPECT_EQ(fx.sched->chip_lane(0).inflight(), kMailboxRequestFrames);
  EXPECT_FALSE(fx.sched->chip_lane(0).can_dispatch());
  (void)fx.sched->step();
  EXPECT_EQ(fx.sched->ready_count(), 1u);
  EXPECT_EQ(fx.sched->publications(), kMailboxRequestFrames);
  EXPECT_FALSE(fx.ep->poisoned().has_value());
}

// R34: two READY tasks and one free frame in one round: exactly one is
// published (the second gate re-reads availability) and the other stays READY.
TEST(SchedulerGates, R34SecondPublicationRereadsAvailability) {
  SchedFixture fx(ChildKind::kNone, 8);
  (void)fx.submit("");
  (void)fx.sched->step();
  ASSERT_EQ(fx.ep->available_request_transport(), 1u);
  (void)fx.submit("");
  (void)fx.submit("");
  (void)fx.sched->step();
  EXPECT_EQ(fx.sched->publications(), 2u);
  EXPECT_EQ(fx.sched->ready_count(), 1u);
  EXPECT_FALSE(fx.ep->poisoned().has_value());
}

// R35: a publication with no free frame is an admitter defect: the endpoint
// is poisoned, then the publication fails saying so; through a lane it is
// never counted as submitted.
TEST(SchedulerGates, R35ExhaustionInsidePublicationPoisons) {
  std::vector<uint8_t> blob;
  ASSERT_TRUE(encode_args_blob(TaskArgs{}, blob).ok());
  auto fill_frames = [&](SchedFixture& fx) {
    for (uint64_t i = 1; i <= kMailboxRequestFrames; ++i) {
      PublishSpec s;
      s.run_id = i;
      s.dispatch_id = i;
      s.args_blob = blob;
      ASSERT_TRUE(fx.port->publish(s).ok());
    }
  };
  PublishSpec s;
  s.run_id = 9;
  s.dispatch_id = 9;
  s.args_blob = blob;
  {
    SchedFixture fx(ChildKind::kNone, 8);
    fill_frames(fx);
    const auto r = fx.port->publish(s);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInternal) << r.status().to_string();
    EXPECT_TRUE(contains(r.status().message(), "admitter defect")) << r.status().to_string();
    ASSERT_TRUE(fx.port->poisoned().has_value());
    EXPECT_EQ(*fx.port->poisoned(), r.status());
  }
  {
    SchedFixture fx(ChildKind::kNone, 8);
    fill_frames(fx);
    WorkerLane& lane = fx.sched->chip_lane(0);
    const Status st = lane.submit_dispatch(s);
    EXPECT_EQ(st.code(), StatusCode::kInternal) << st.to_string();
    EXPECT_TRUE(contains(st.message(), "admitter defect")) << st.to_string();
    EXPECT_EQ(lane.inflight(), 0u) << "a failed publication holds no lane";
    EXPECT_TRUE(lane.single_empty());
    EXPECT_TRUE(fx.port->poisoned().has_value());
  }
}

// R36: a publication that fails is reported once, as the run's failure; the
// run is not live, no lane is held and the transport is unchanged.
TEST(SchedulerGates, R36PublicationThatFailedIsReportedNotSubmitted) {
  FaultPort fault;
  SchedFixture fx(ChildKind::kNone, 8, &fault);
  const uint32_t before = fx.ep->available_request_transport();
  RunHandle r = fx.submit("");
  (void)fx.sched->step();
  ASSERT_TRUE(r.done());
  EXPECT_EQ(r.result().code(), StatusCode::kInternal);
  EXPECT_TRUE(contains(r.result().message(), "injected publication fault")) << r.result().to_string();
  EXPECT_EQ(fx.sched->chip_lane(0).inflight(), 0u);
  EXPECT_EQ(fx.sched->live_runs(), 0u);
  EXPECT_EQ(fx.ep->available_request_transport(), before);
  EXPECT_FALSE(fx.ep->poisoned().has_value());
}

// R37: no reservation lives between gate and publication: after 1,000
// induced publication failures the transport is still K, and usable.
TEST(SchedulerGates, R37ThousandFailedPublicationsRetireNoTransport) {
  FaultPort fault;
  SchedFixture fx(ChildKind::kNone, 8, &fault);
  std::vector<RunHandle> runs;
  for (int i = 0; i < 1000; ++i) runs.push_back(fx.submit(""));
  while (fx.sched->step()) {
  }
  for (auto& r : runs) ASSERT_TRUE(r.done());
  EXPECT_EQ(fx.ep->available_request_transport(), kMailboxRequestFrames);
  fault.armed = false;
  (void)fx.submit("");
  (void)fx.sched->step();
  EXPECT_EQ(fx.sched->publications(), 1u);
}

// ---------------------------------------------------------------------------
// The staged lane (R38-R40): driven step by step against a real endpoint
// whose "child" is the test, which hands frames back and stores terminals.

// R38: a parked staged request resumes on the acknowledged frame. Three tasks
// on one chip: A and B are READY, C reads A's output. The child withholds
// both hand-backs: A and B go out, C stays unclaimed with can_stage() false.
// After the child ACKs A's frame, that frame carries C's own entry (matched
// by task_slot) as PREPARE_READY while A has published no terminal.
TEST(SchedulerStaging, R38ParkedStagedRequestResumesOnTheAcknowledgedFrame) {
  SchedFixture fx(ChildKind::kNone, 8);
  (void)fx.submit_tasks({{"", {0}, {}}, {"", {1}, {}}, {"", {}, {0}}});
  EXPECT_TRUE(fx.sched->step());
  EXPECT_EQ(fx.sched->publications(), 2u);
  EXPECT_EQ(fx.sched->stagings(), 0u);
  EXPECT_FALSE(fx.sched->chip_lane(0).can_stage());
  EXPECT_TRUE(fx.sched->chip_lane(0).single_empty());
  (void)fx.sched->step();
  EXPECT_EQ(fx.sched->publications(), 2u) << "nothing is published without a frame";
  const auto a_frame = fx.frame_of(0);
  ASSERT_TRUE(a_frame.has_value());
  fx.hand_back(0);
  (void)fx.sched->step();
  EXPECT_EQ(fx.sched->stagings(), 1u);
  const auto c_frame = fx.frame_of(2);
  ASSERT_TRUE(c_frame.has_value());
  EXPECT_EQ(c_frame->first, a_frame->first) << "C resumes on the frame A's child acknowledged";
  EXPECT_EQ(c_frame->second, static_cast<uint32_t>(kMailboxPrepareReady));
  const RequestHeader& h = fx.ep->view().frame(c_frame->first).header;
  EXPECT_EQ(fx.ep->view().entry(h.entry_index).task_slot, 2u);
  EXPECT_EQ(load_acquire(fx.ep->view().entry(h.entry_index).entry_generation), h.entry_generation);
  EXPECT_FALSE(mailbox_state_is_terminal(fx.entry_state(0))) << "A published no terminal";
  EXPECT_FALSE(fx.sched->chip_lane(0).single_empty());
  EXPECT_FALSE(fx.ep->poisoned().has_value());
}

// R40 (#2577 regression 1): a successor never publishes before its
// predecessor's publication. Both frames are taken by other runs when A and
// its successor C arrive; the first frame handed back goes to A, and C is
// staged only on the next.
TEST(SchedulerStaging, R40SuccessorNeverPublishesBeforeItsPredecessor) {
  SchedFixture fx(ChildKind::kNone, 8);
  (void)fx.submit_tasks({{"", {5}, {}}});
  (void)fx.submit_tasks({{"", {6}, {}}});
  (void)fx.sched->step();
  ASSERT_EQ(fx.sched->publications(), 2u);
  (void)fx.submit_tasks({{"", {0}, {}}, {"", {}, {0}}});  // A = slot 0, C = slot 1 of run 3
  (void)fx.sched->step();
  EXPECT_EQ(fx.sched->publications(), 2u);
  // Hand back run 1's frame (its only task is slot 0 too, so by frame order).
  const MailboxView v = fx.ep->view();
  RequestHeader& h0 = v.frame(0).header;
  store_release(h0.ready, static_cast<uint32_t>(kMailboxIdle));
  store_release(v.entry(h0.entry_index).consumed_ack, load_acquire(h0.publication));
  (void)fx.sched->step();
  EXPECT_EQ(fx.sched->publications(), 3u);
  EXPECT_EQ(fx.sched->stagings(), 0u) << "C waits for a frame of its own after A's";
  EXPECT_EQ(load_acquire(v.frame(0).header.ready), static_cast<uint32_t>(kMailboxTaskReady));
  EXPECT_EQ(v.frame(0).header.run_id, 3u);
  RequestHeader& h1 = v.frame(1).header;
  store_release(h1.ready, static_cast<uint32_t>(kMailboxIdle));
  store_release(v.entry(h1.entry_index).consumed_ack, load_acquire(h1.publication));
  (void)fx.sched->step();
  EXPECT_EQ(fx.sched->stagings(), 1u);
  EXPECT_EQ(load_acquire(v.frame(1).header.ready), static_cast<uint32_t>(kMailboxPrepareReady));
  EXPECT_EQ(v.frame(1).header.task_slot, 1u);
}

// R40 (#2577 regression 2): active-first dispatch order. A READY task and a
// preparable successor compete for one free frame: the READY task takes it.
TEST(SchedulerStaging, R40ActiveFirstOrder) {
  SchedFixture fx(ChildKind::kNone, 8);
  (void)fx.submit_tasks({{"", {0}, {}}, {"", {}, {0}}, {"", {1}, {}}});  // A, C (after A), B
  (void)fx.sched->step();
  ASSERT_EQ(fx.sched->publications(), 2u);  // A and B
  (void)fx.submit_tasks({{"", {2}, {}}});   // D: READY, arrives while C waits
  fx.hand_back(0);
  (void)fx.sched->step();
  EXPECT_EQ(fx.sched->publications(), 3u);
  EXPECT_EQ(fx.sched->stagings(), 0u) << "the READY task took the frame";
  EXPECT_EQ(fx.sched->ready_count(), 0u);
  fx.hand_back(2);  // B's frame
  (void)fx.sched->step();
  EXPECT_EQ(fx.sched->stagings(), 1u);
  ASSERT_TRUE(fx.frame_of(1).has_value());
  EXPECT_EQ(fx.frame_of(1)->second, static_cast<uint32_t>(kMailboxPrepareReady));
}

// R40 (#2577 regression 3): one staged successor per lane (single_empty).
// Two successors of A: C1 is staged; C2 is not, though a frame and a lane are
// free; when A ends C1 is activated and C2, now READY, goes out as an
// ordinary publication.
TEST(SchedulerStaging, R40SingleStagedSuccessorPerLane) {
  SchedFixture fx(ChildKind::kNone, 8);
  RunHandle r = fx.submit_tasks({{"", {0}, {}}, {"", {}, {0}}, {"", {}, {0}}});
  (void)fx.sched->step();
  EXPECT_EQ(fx.sched->publications(), 2u);
  EXPECT_EQ(fx.sched->stagings(), 1u);
  fx.hand_back(0);
  fx.hand_back(1);
  (void)fx.sched->step();
  EXPECT_TRUE(fx.sched->chip_lane(0).can_stage());
  EXPECT_FALSE(fx.sched->chip_lane(0).single_empty());
  EXPECT_EQ(fx.sched->stagings(), 1u) << "C2 waits: the staged lane is taken";
  fx.complete(0);
  (void)fx.sched->step();
  const MailboxView v = fx.ep->view();
  bool activated = false;
  for (uint64_t i = 0; i < v.entry_count(); ++i) {
    if (load_acquire(v.entry(i).entry_generation) % 2 == 1 && v.entry(i).task_slot == 1) {
      activated = load_acquire(v.entry(i).activation) == kMailboxActivate;
    }
  }
  EXPECT_TRUE(activated) << "C1 is activated when A succeeds";
  EXPECT_TRUE(fx.sched->chip_lane(0).single_empty());
  ASSERT_TRUE(fx.frame_of(2).has_value());
  EXPECT_EQ(fx.frame_of(2)->second, static_cast<uint32_t>(kMailboxTaskReady));
  EXPECT_EQ(fx.sched->stagings(), 1u);
  fx.complete(1);
  fx.complete(2);
  while (fx.sched->step()) {
  }
  ASSERT_TRUE(r.done());
  EXPECT_TRUE(r.result().ok()) << r.result().to_string();
}

// R40: the ownership guard. A successor whose run no longer owns its set is
// not staged; it is published only once READY, as an ordinary task.
TEST(SchedulerStaging, R40SuccessorWhoseLeaseIsNotOwnedIsNotStaged) {
  SchedFixture fx(ChildKind::kNone, 8);
  (void)fx.submit_tasks({{"", {5}, {}}});                 // run 1: takes a frame
  (void)fx.submit_tasks({{"", {0}, {}}, {"", {}, {0}}});  // run 2: A, then C
  (void)fx.sched->step();
  ASSERT_EQ(fx.sched->publications(), 2u);
  ASSERT_EQ(fx.sched->stagings(), 0u);
  auto lease = fx.sched->lease_of(2);
  ASSERT_TRUE(lease.has_value());
  ASSERT_TRUE(fx.sched->run_resources().owns(*lease));
  ASSERT_TRUE(fx.sched->run_resources().release(*lease));
  const MailboxView v = fx.ep->view();
  for (size_t f = 0; f < kMailboxRequestFrames; ++f) {
    RequestHeader& h = v.frame(f).header;
    store_release(h.ready, static_cast<uint32_t>(kMailboxIdle));
    store_release(v.entry(h.entry_index).consumed_ack, load_acquire(h.publication));
  }
  (void)fx.sched->step();
  EXPECT_TRUE(fx.sched->chip_lane(0).can_stage());
  EXPECT_TRUE(fx.sched->chip_lane(0).single_empty());
  EXPECT_EQ(fx.sched->stagings(), 0u) << "the guard refused a run that does not own its set";
  EXPECT_EQ(fx.sched->publications(), 2u);
}

// R36 for the staged lane: a staged publication that fails is reported once
// as the successor's failure, holds no staged slot or frame, and its
// predecessor's later terminal does not finish it again.
TEST(SchedulerStaging, R36StagedPublicationThatFailedIsReportedNotSubmitted) {
  FaultPort fault;
  fault.staged_only = true;
  SchedFixture fx(ChildKind::kNone, 8, &fault);
  RunHandle r = fx.submit_tasks({{"", {0}, {}}, {"", {}, {0}}});
  (void)fx.sched->step();
  EXPECT_EQ(fx.sched->publications(), 1u);
  EXPECT_EQ(fx.sched->stagings(), 0u);
  EXPECT_TRUE(fx.sched->chip_lane(0).single_empty());
  EXPECT_EQ(fx.sched->chip_lane(0).inflight(), 1u);
  EXPECT_EQ(fx.ep->available_request_transport(), kMailboxRequestFrames - 1);
  EXPECT_FALSE(r.done()) << "the predecessor still runs";
  fx.hand_back(0);
  fx.complete(0);
  while (fx.sched->step()) {
  }
  ASSERT_TRUE(r.done());
  EXPECT_EQ(r.result().code(), StatusCode::kInternal);
  EXPECT_TRUE(contains(r.result().message(), "injected publication fault")) << r.result().to_string();
  EXPECT_EQ(fx.sched->live_runs(), 0u);
  EXPECT_EQ(fx.ep->available_request_transport(), kMailboxRequestFrames);
  EXPECT_FALSE(fx.ep->poisoned().has_value());
}

// A successor across runs whose predecessor's run retires while it still
// waits to be staged: the staging check must not read the retired task.
// Run 1: Q (unrelated) and run 2: A take both frames; run 3: P waits for a
// frame, and D reads what A and P write. A ends: run 2 retires, P takes A's
// frame and D, waiting only on P out on its own chip, finds no frame. Q
// ends: D is staged in Q's frame.
TEST(SchedulerStaging, PredecessorOfARetiredRunIsNotReadAgain) {
  SchedFixture fx(ChildKind::kNone, 8);
  RunHandle q = fx.submit_tasks({{"", {5}, {}}});
  RunHandle a = fx.submit_tasks({{"", {0}, {}}});
  RunHandle pd = fx.submit_tasks({{"", {1}, {}}, {"", {}, {0, 1}}});
  (void)fx.sched->step();
  ASSERT_EQ(fx.sched->publications(), 2u);
  fx.complete(0, StatusCode::kOk, /*run_id=*/2);
  (void)fx.sched->step();
  ASSERT_TRUE(a.done());
  EXPECT_EQ(fx.sched->live_runs(), 2u) << "run 2 retired";
  EXPECT_EQ(fx.sched->publications(), 3u) << "P took A's frame";
  EXPECT_EQ(fx.sched->stagings(), 0u) << "no frame for D";
  fx.complete(0, StatusCode::kOk, /*run_id=*/1);
  (void)fx.sched->step();
  EXPECT_EQ(fx.sched->stagings(), 1u) << "D is staged in Q's frame";
  fx.complete(0, StatusCode::kOk, /*run_id=*/3);
  (void)fx.sched->step();
  fx.complete(1, StatusCode::kOk, /*run_id=*/3);
  while (fx.sched->step()) {
  }
  ASSERT_TRUE(q.done() && pd.done());
  EXPECT_TRUE(pd.result().ok()) << pd.result().to_string();
}

// A staged successor whose terminal comes before its predecessor's (its
// child failed it unlaunched), alone in its run: the run ends and retires at
// once, and the predecessor's later terminal must not reach the freed task.
TEST(SchedulerStaging, StagedTaskEndingBeforeItsPredecessorIsNotReachedAgain) {
  SchedFixture fx(ChildKind::kNone, 8);
  RunHandle x = fx.submit_tasks({{"", {0}, {}}});
  RunHandle t = fx.submit_tasks({{"", {}, {0}}});
  (void)fx.sched->step();
  ASSERT_EQ(fx.sched->stagings(), 1u);
  fx.complete(0, StatusCode::kKernelFailed, /*run_id=*/2);
  (void)fx.sched->step();
  ASSERT_TRUE(t.done());
  EXPECT_EQ(t.result().code(), StatusCode::kKernelFailed) << t.result().to_string();
  EXPECT_EQ(fx.sched->live_runs(), 1u) << "run 2 retired";
  fx.complete(0, StatusCode::kOk, /*run_id=*/1);
  while (fx.sched->step()) {
  }
  ASSERT_TRUE(x.done());
  EXPECT_TRUE(x.result().ok()) << x.result().to_string();
}

// The TensorMap keeps one access where a write covers earlier ones (C's
// write stands for A's). When C ends before A (its child failed it
// unlaunched), A's access stands for itself again: D, reading what A
// writes, still waits for A instead of being published beside it.
TEST(SchedulerStaging, TaskEndingBeforeThePredecessorItCoversStillOrdersLaterTasks) {
  SchedFixture fx(ChildKind::kNone, 8);
  RunHandle ac = fx.submit_tasks({{"", {0}, {}}, {"", {0}, {}}});  // A, then C writes the same buffer
  (void)fx.sched->step();
  ASSERT_EQ(fx.sched->publications(), 2u);
  ASSERT_EQ(fx.sched->stagings(), 1u) << "C is staged behind A";
  fx.complete(1, StatusCode::kKernelFailed, /*run_id=*/1);
  (void)fx.sched->step();
  RunHandle d = fx.submit_tasks({{"", {}, {0}}});
  (void)fx.sched->step();
  EXPECT_EQ(fx.sched->publications(), 2u) << "D was published while A still runs";
  fx.complete(0, StatusCode::kOk, /*run_id=*/1);
  (void)fx.sched->step();
  EXPECT_EQ(fx.sched->publications(), 3u) << "D goes out once A ended";
  fx.complete(0, StatusCode::kOk, /*run_id=*/2);
  while (fx.sched->step()) {
  }
  ASSERT_TRUE(ac.done() && d.done());
  EXPECT_EQ(ac.result().code(), StatusCode::kKernelFailed) << ac.result().to_string();
  EXPECT_TRUE(d.result().ok()) << d.result().to_string();
}

// Poison travels down a chain with its cause: a task poisoned by a task
// that itself was not run names the task that failed, not the one between.
// Run 1: A fails. Run 2: B reads A's output (staged behind A, then
// cancelled). Run 3: C reads B's output.
TEST(SchedulerStaging, PoisonNamesTheTaskThatFailed) {
  SchedFixture fx(ChildKind::kNone, 8);
  RunHandle a = fx.submit_tasks({{"", {0}, {}}});
  RunHandle b = fx.submit_tasks({{"", {1}, {0}}});
  RunHandle c = fx.submit_tasks({{"", {}, {1}}});
  (void)fx.sched->step();
  ASSERT_EQ(fx.sched->stagings(), 1u) << "B is staged behind A";
  fx.complete(0, StatusCode::kKernelFailed, /*run_id=*/1);
  (void)fx.sched->step();
  fx.complete(0, StatusCode::kAborted, /*run_id=*/2);  // the child ends the cancelled B
  while (fx.sched->step()) {
  }
  ASSERT_TRUE(a.done() && b.done() && c.done());
  EXPECT_EQ(a.result().message(), "task 0 of run 1: scripted failure");
  const std::string cause = "not run: task 0 of run 1 failed: KERNEL_FAILED: scripted failure";
  EXPECT_EQ(b.result().code(), StatusCode::kAborted);
  EXPECT_EQ(b.result().message(), "task 0 of run 2: " + cause);
  EXPECT_EQ(c.result().code(), StatusCode::kAborted);
  EXPECT_EQ(c.result().message(), "task 0 of run 3: " + cause);
  EXPECT_EQ(c.stats().executed, 0u);
}

// R17 + the staged lane end to end, through the mock and a forked child
// alike: C (reading A's output) is staged and taken by the child while A is
// held on a gate, and runs after A; when A fails, C is cancelled unrun and
// the run reports A's error.
TEST_P(SchedulerCases, StagedSuccessorRunsAfterItsPredecessor) {
  Watchdog dog;
  SchedFixture fx(GetParam(), 4);
  fx.start();
  RunHandle ok = fx.submit_tasks({{"gate=0", {0}, {}}, {"text=c", {}, {0}}});
  ASSERT_TRUE(eventually([&] { return fx.entry_state(1) == kMailboxFrameStaged; })) << "C was never staged";
  EXPECT_FALSE(mailbox_state_is_terminal(fx.entry_state(0)));
  EXPECT_EQ(load_acquire(fx.gates->handler_calls), 1u) << "C runs only at ACTIVATE";
  fx.open_gate(0);
  EXPECT_TRUE(wait_run(ok).ok()) << ok.result().to_string();
  EXPECT_EQ(load_acquire(fx.gates->handler_calls), 2u);

  RunHandle bad = fx.submit_tasks({{"gate=1;fail=6;text=a fails", {1}, {}}, {"text=c", {}, {1}}});
  ASSERT_TRUE(eventually([&] { return fx.entry_state(1) == kMailboxFrameStaged; })) << "C was never staged";
  fx.open_gate(1);
  const Status st = wait_run(bad);
  EXPECT_EQ(st.code(), StatusCode::kKernelFailed) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "a fails")) << st.to_string();
  EXPECT_EQ(load_acquire(fx.gates->handler_calls), 3u) << "the cancelled C never reached the handler";
  EXPECT_FALSE(fx.ep->poisoned().has_value());
}

// R74: a snapshot reports an instant only when both passes agree; over the
// scripted sequence "A launched, A retires, E launched" it never reports A and
// E together.
TEST(Observer, R74SnapshotNeverMixesInstants) {
  const EntryKey a_launched{1, 100, 1, kMailboxTaskLaunched, 0};
  const EntryKey a_retired{2, 100, 1, kMailboxTaskDone, 0};
  const EntryKey e_idle{0, 0, 0, kMailboxIdle, kMailboxNoSet};
  const EntryKey e_launched{1, 200, 2, kMailboxTaskLaunched, 0};
  // Reads: pass 1 sees entry 0 = A launched, entry 1 = empty; then A retires
  // and E launches in entry 1 before pass 2.
  int reads = 0;
  std::vector<EntryKey> scratch;
  auto script = [&](size_t i) {
    const bool second_pass = reads++ >= 2;
    if (i == 0) return second_pass ? a_retired : a_launched;
    return second_pass ? e_launched : e_idle;
  };
  EXPECT_FALSE(coherent_snapshot(2, script, scratch).has_value());
  // A table that holds still is reported, counting carriers of a launched
  // run (never requiring every entry to be launched) and distinct sets.
  auto still = [&](size_t i) { return i == 0 ? a_launched : (i == 1 ? e_launched : e_idle); };
  auto in = coherent_snapshot(3, still, scratch);
  ASSERT_TRUE(in.has_value());
  EXPECT_EQ(in->launched.size(), 2u);
  EXPECT_EQ(in->held_slots.size(), 1u);  // both claim set 0: one set
}

// R75: the sampler's failure reaches the caller; a sampler that will not
// stop is reported as a live reader, and keeps its own mapping.
TEST(Observer, R75SamplerFailuresReachTheCaller) {
  Watchdog dog;
  auto m = SharedMapping::create_anonymous(*mailbox_size(2));
  ASSERT_TRUE(m.ok());
  auto mapping = std::make_shared<SharedMapping>(std::move(m).value());
  auto ep = MailboxEndpoint::create(mapping->data(), mapping->size(), 2);
  ASSERT_TRUE(ep.ok());
  const MailboxView view = (*ep)->view();
  {
    Observer o;
    std::atomic<bool> armed{false};  // only after start() returned, or start() itself reports it
    // Set just before the throw, not counted per call: a sample that began
    // before the arming throws nothing, and stop() after it would see no failure.
    std::atomic<bool> threw{false};
    o.set_sample_hook([&] {
      if (!armed.load()) return;
      threw.store(true);
      throw std::runtime_error("sampler blew up");
    });
    ASSERT_TRUE(o.start({{mapping, view}}, now_ns() + kTestWaitNs).ok());
    armed.store(true);
    ASSERT_TRUE(eventually([&] { return threw.load(); }));
    Status st = o.stop(now_ns() + kTestWaitNs);
    EXPECT_TRUE(contains(st.message(), "sampler blew up")) << st.to_string();
  }
  auto release = std::make_shared<std::atomic<bool>>(false);
  {
    Observer o;
    auto calls = std::make_shared<std::atomic<int>>(0);
    o.set_sample_hook([calls, release] {
      if (calls->fetch_add(1) >= 2) eventually([&] { return release->load(); });
    });
    ASSERT_TRUE(o.start({{mapping, view}}, now_ns() + kTestWaitNs).ok());
    ASSERT_TRUE(eventually([&] { return calls->load() > 2; }));
    Status st = o.stop(now_ns() + 50'000'000);
    EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded);
    EXPECT_TRUE(contains(st.message(), "live reader")) << st.to_string();
    EXPECT_GT(mapping.use_count(), 1) << "the hung sampler no longer holds the mapping";
  }
  ep->reset();
  mapping.reset();  // the sampler's reference keeps the bytes mapped
  release->store(true);
}

// Bug (issue 10), R75: once start() gave up waiting for the first sample, the
// sampler stops instead of sampling on. The first sample is held in the hook
// until start() has returned its refusal (or the sampler sees the stop first).
TEST(Observer, R75SamplerStopsWhenStartGivesUp) {
  Watchdog dog;
  auto m = SharedMapping::create_anonymous(*mailbox_size(2));
  ASSERT_TRUE(m.ok());
  auto mapping = std::make_shared<SharedMapping>(std::move(m).value());
  auto ep = MailboxEndpoint::create(mapping->data(), mapping->size(), 2);
  ASSERT_TRUE(ep.ok());
  Observer o;
  std::atomic<int> calls{0};
  std::atomic<bool> release{false};
  Doorbell bell;
  o.set_sample_hook([&] {
    calls.fetch_add(1);
    bell.ring();
    spin_then_park(
        bell, [&] { return release.load(); }, SpinPolicy{}, now_ns() + kTestWaitNs);
  });
  // A deadline already past: start() gives up while the first sample is held.
  const Status st = o.start({{mapping, (*ep)->view()}}, now_ns());
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.to_string();
  release.store(true);
  bell.ring();
  ASSERT_TRUE(eventually([&] { return o.sampler_finished(); })) << "the sampler kept sampling after start() gave up";
  EXPECT_LE(calls.load(), 1) << "no sample after the one start() gave up on (if it had begun)";
}

}  // namespace
}  // namespace simpler::testing
