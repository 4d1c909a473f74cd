// The Scheduler and its lanes against endpoints with no child, an in-process
// mock child (R17) and a forked child running the scripted handler: the
// admission and backpressure cases R32-R37, and the coherent snapshot (R74)
// and observer lifetime (R75).
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "base/shared_memory.h"
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

// Throws from publish while armed; otherwise the real endpoint.
class FaultPort final : public EndpointPort {
 public:
  uint32_t available_request_transport() override { return inner_->available_request_transport(); }
  uint64_t max_inflight_tasks() const override { return inner_->max_inflight_tasks(); }
  Result<Publication> publish(const PublishSpec& spec) override {
    if (armed) throw std::runtime_error("injected publication fault");
    return inner_->publish(spec);
  }
  void poll(std::vector<EndpointEvent>& out) override { inner_->poll(out); }
  void poison(const Status& cause) override { inner_->poison(cause); }
  std::optional<Status> poisoned() const override { return inner_->poisoned(); }
  bool armed = true;
  EndpointPort* inner_ = nullptr;  // set by the fixture
};

// One endpoint (G sets), its port and a scheduler over it, with the child of
// the given kind serving it (kNone: nobody ever hands a frame back).
struct SchedFixture {
  explicit SchedFixture(ChildKind kind, uint64_t grant = 8, FaultPort* wrap = nullptr) {
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
                                        &ep->view().control().parent_bell, hooks);
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
  RunHandle submit(const std::string& script) {
    auto run = std::make_unique<NodeRun>();
    run->id = next_run++;
    run->handle = std::make_shared<detail::RunState>(run->id);
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
  // The mock child parks on its own bell, not the gates' one: ring both.
  void open_gate(int n) {
    gates->open_gate(n);
    ep->view().control().child_bell.ring();
  }
  void start() {
    sched->start();
    started = true;
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
  uint64_t next_run = 1;
  uint64_t next_task = 1;
};

class SchedulerCases : public ::testing::TestWithParam<ChildKind> {};

// R32: G = 8 > K = 2 with a slow child (every run waits for gate 0): 64
// submissions never reach a throwing publication, and every one completes.
TEST_P(SchedulerCases, R32SaturationIsAnOrdinaryState) {
  Watchdog dog;
  SchedFixture fx(GetParam(), 8);
  fx.start();
  std::vector<RunHandle> runs;
  for (int i = 0; i < 64; ++i) runs.push_back(fx.submit("gate=0"));
  ASSERT_TRUE(eventually([&] { return fx.gates->handler_calls >= 10; })) << "the child never held M = G + K runs";
  fx.open_gate(0);
  for (auto& r : runs) EXPECT_TRUE(wait_run(r).ok()) << r.result().to_string();
  EXPECT_FALSE(fx.ep->poisoned().has_value());
  EXPECT_EQ(fx.gates->handler_calls, 64u);
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

// R35: a publication with no free frame is an admitter defect: it throws and
// the throw poisons the endpoint.
TEST(SchedulerGates, R35ExhaustionInsidePublicationPoisons) {
  SchedFixture fx(ChildKind::kNone, 8);
  std::vector<uint8_t> blob;
  ASSERT_TRUE(encode_args_blob(TaskArgs{}, blob).ok());
  for (uint64_t i = 1; i <= kMailboxRequestFrames; ++i) {
    PublishSpec s;
    s.run_id = i;
    s.dispatch_id = i;
    s.args_blob = blob;
    ASSERT_TRUE(fx.port->publish(s).ok());
  }
  PublishSpec s;
  s.run_id = 9;
  s.dispatch_id = 9;
  EXPECT_THROW(
      {
        (void)fx.port->publish(s);
      },
      TransportExhausted);
  EXPECT_TRUE(fx.port->poisoned().has_value());
}

// R36: a publication that throws is reported once, as the run's failure; the
// run is not live, no lane is held and the transport is unchanged.
TEST(SchedulerGates, R36PublicationThatThrewIsReportedNotSubmitted) {
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
// induced publication throws the transport is still K, and usable.
TEST(SchedulerGates, R37ThousandThrowsRetireNoTransport) {
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
    std::atomic<int> calls{0};
    std::atomic<bool> armed{false};  // only after start() returned, or start() itself reports it
    o.set_sample_hook([&] {
      calls.fetch_add(1);
      if (armed.load()) throw std::runtime_error("sampler blew up");
    });
    ASSERT_TRUE(o.start({{mapping, view}}, now_ns() + kTestWaitNs).ok());
    const int before = calls.load();
    armed.store(true);
    ASSERT_TRUE(eventually([&] { return calls.load() > before; }));
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

}  // namespace
}  // namespace simpler::testing
