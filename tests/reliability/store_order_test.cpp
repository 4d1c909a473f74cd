// T15 of the reliability plan: the store-order recorder, on in every test of
// a test build. Every child loop stores through CheckingStores
// (src/ipc/test_hooks.h) unless a test gives it a store primitive of its
// own; a store into a request frame after its hand-off ended (R5: the ACK or
// the refusal is the last store of a frame hand-off) or into an entry after
// its terminal and before the parent occupied it again (R6) prints
// kStoreOrderViolationMarker, which fails any test (FAIL_REGULAR_EXPRESSION),
// and aborts the child. Here: the checker driven with bad sequences sees each
// violation (so it can fail), and a representative workload, thread mode and
// fork mode, prints `RELIABILITY T15 lifecycles=.. violations=0`.
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "base/shared_memory.h"
#include "health_scan.h"
#include "ipc/sub_worker_handler.h"
#include "ipc/test_hooks.h"
#include "ipc_test_util.h"
#include "node/node_worker.h"
#include "node_test_util.h"
#include "test_util.h"

namespace simpler::testing {
namespace {

// The parent's side of one run, written straight into the mapping.
void occupy(MailboxView v, uint32_t entry, uint64_t generation, uint64_t run) {
  store_release(v.entry(entry).run_id, run);
  store_release(v.entry(entry).state, static_cast<uint32_t>(kMailboxIdle));
  store_release(v.entry(entry).entry_generation, generation);
}
void publish(MailboxView v, size_t frame, uint32_t entry, uint64_t generation, uint64_t publication) {
  RequestHeader& h = v.frame(frame).header;
  store_release(h.entry_index, uint64_t{entry});
  store_release(h.entry_generation, generation);
  store_release(h.publication, publication);
  store_release(h.ready, static_cast<uint32_t>(kMailboxTaskReady));
}

// The child's stores of one hand-off and one run, in the protocol's order.
void take(CheckingStores& s, MailboxView v, size_t frame, uint32_t entry, uint64_t publication) {
  MailboxRunEntry& e = v.entry(entry);
  s.store64(e.run_epoch, 1);
  s.store32(e.state, kMailboxFrameStaged);
  s.store32(v.frame(frame).header.ready, kMailboxIdle);
  s.store64(e.consumed_ack, publication);
}
void finish(CheckingStores& s, MailboxView v, uint32_t entry) {
  MailboxRunEntry& e = v.entry(entry);
  s.store32(e.accepted, 1);
  s.store32(e.state, kMailboxTaskLaunched);
  s.store32(reinterpret_cast<uint32_t&>(e.rc), 0);
  char text[kMailboxErrorTextSize] = {};
  s.store_bytes(e.error_text, text, sizeof text);
  s.store32(e.disposition, kDispositionNone);
  s.store32(e.state, kMailboxTaskDone);
}

// A 2-entry mailbox in anonymous memory and a non-fatal checker over it.
struct CheckedMailbox {
  SharedMapping map = std::move(SharedMapping::create_anonymous(*mailbox_size(2))).value();
  MailboxView view = *MailboxView::attach(map.data(), map.size(), 2);
  CheckingStores stores{view, /*fatal=*/false};
};

// T15: the checker sees each kind of violation, exactly where it happens,
// and none in the legitimate sequences around them.
TEST(StoreOrder, T15CheckerCatchesEachBadSequence) {
  CheckedMailbox mb;
  const MailboxView v = mb.view;
  CheckingStores& s = mb.stores;
  auto expect_violation = [&](uint64_t n, const char* what) {
    EXPECT_EQ(s.violations(), n) << "expected: " << what << "; last: " << s.last_violation();
    EXPECT_TRUE(contains(s.last_violation(), what)) << s.last_violation();
  };

  // A run served as the protocol says, the frame republished and served again.
  occupy(v, 0, 1, 10);
  publish(v, 0, 0, 1, 100);
  take(s, v, 0, 0, 100);
  finish(s, v, 0);
  EXPECT_EQ(s.violations(), 0u) << s.last_violation();
  store_release(v.entry(0).entry_generation, uint64_t{2});  // consumed, released
  occupy(v, 0, 3, 11);
  publish(v, 0, 0, 3, 101);
  take(s, v, 0, 0, 101);
  EXPECT_EQ(s.violations(), 0u) << s.last_violation();

  // R5: a frame store after the ACK, before the parent republished.
  s.store32(v.frame(0).header.ready, kMailboxIdle);
  expect_violation(1, "request frame 0, whose hand-off already ended");
  // R5: the ACK before the frame was handed back.
  occupy(v, 1, 1, 20);
  publish(v, 1, 1, 1, 102);
  s.store64(v.entry(1).consumed_ack, 102);
  expect_violation(2, "ACK of publication 102");
  // R5: a store after a refusal.
  publish(v, 1, 1, 1, 103);
  s.store32(v.frame(1).header.ready, kMailboxFrameRefused);
  EXPECT_EQ(s.violations(), 2u) << s.last_violation();
  s.store32(v.frame(1).header.ready, kMailboxIdle);
  expect_violation(3, "request frame 1, whose hand-off already ended");

  // R6: stores to an entry after its terminal: while the parent still holds
  // it, after the parent released it, but not once it is occupied again.
  finish(s, v, 0);
  EXPECT_EQ(s.violations(), 3u) << s.last_violation();
  s.store32(reinterpret_cast<uint32_t&>(v.entry(0).rc), 6);
  expect_violation(4, "entry_rc store into entry 0 (generation 3) after its terminal");
  store_release(v.entry(0).entry_generation, uint64_t{4});
  s.store32(v.entry(0).disposition, 1);
  expect_violation(5, "entry_disposition store into entry 0 (generation 4) after its terminal");
  occupy(v, 0, 5, 12);
  // The exit sweep ends a run published but never staged: rc, text, terminal.
  s.store32(reinterpret_cast<uint32_t&>(v.entry(0).rc), 10);
  s.store32(v.entry(0).state, kMailboxEndpointFailed);
  EXPECT_EQ(s.violations(), 5u) << s.last_violation();
  // A second terminal for one occupancy.
  s.store32(v.entry(0).state, kMailboxTaskDone);
  expect_violation(6, "terminal store into entry 0 (generation 5) after its terminal");
  // A checker that is not fatal counts only itself, never the suite's figure.
  EXPECT_EQ(store_order_counts().violations, 0u);
}

// T15, R6: the parent may release and occupy an entry again the moment the
// child's terminal lands. The checker must credit the terminal to the
// occupancy it ended, not to the next one (which once failed the chaos run
// with a false "store after its terminal" on the next occupant's staging).
TEST(StoreOrder, T15ATerminalIsCreditedToTheOccupancyItEndedWhenTheParentReusesTheEntryAtOnce) {
  CheckedMailbox mb;
  const MailboxView v = mb.view;
  CheckingStores& s = mb.stores;
  occupy(v, 0, 1, 10);
  publish(v, 0, 0, 1, 100);
  take(s, v, 0, 0, 100);
  bool reused = false;
  s.set_after_write_hook([&] {
    if (reused || !mailbox_state_is_terminal(load_acquire(v.entry(0).state))) return;
    reused = true;  // the parent, between the terminal store and the checker's accounting
    store_release(v.entry(0).entry_generation, uint64_t{2});
    occupy(v, 0, 3, 11);
    publish(v, 0, 0, 3, 101);
  });
  finish(s, v, 0);
  ASSERT_TRUE(reused);
  take(s, v, 0, 0, 101);
  EXPECT_EQ(s.violations(), 0u) << s.last_violation();
  // The next occupancy's own terminal still ends it: a store after it is caught.
  finish(s, v, 0);
  s.store32(reinterpret_cast<uint32_t&>(v.entry(0).rc), 6);
  EXPECT_EQ(s.violations(), 1u);
  EXPECT_TRUE(contains(s.last_violation(),
                       "entry_rc store into entry 0 (generation 3) after its terminal under "
                       "generation 3"))
      << s.last_violation();
}

// The thread-mode part: the real child loop and TestHandler on a thread.
class Workload {
 public:
  Workload() {
    auto m = SharedMapping::create_anonymous(*mailbox_size(4));
    EXPECT_TRUE(m.ok());
    map_ = std::move(m).value();
    auto g = SharedMapping::create_anonymous(sizeof(TestGates));
    EXPECT_TRUE(g.ok());
    gates_map_ = std::move(g).value();
    gates_ = new (gates_map_.data()) TestGates();
    auto ep = MailboxEndpoint::create(map_.data(), map_.size(), 4);
    EXPECT_TRUE(ep.ok()) << ep.status().to_string();
    ep_ = std::move(ep).value();
  }

  // Runs ok and failing, staged ones activated and cancelled, control
  // commands, a stale header refused, and a shutdown with a run held, which
  // the exit sweep ends.
  void run() {
    handler_ = std::make_unique<TestHandler>(gates_);
    ChildOptions options;  // no store primitive given: the checked default
    // The held run below outlives the drain, so the exit sweep ends it.
    options.drain_timeout_ns = 1'000'000;
    child_ = std::make_unique<MailboxChild>(ep_->view(), *handler_, options);
    std::thread loop([this] { (void)child_->serve(); });
    ASSERT_TRUE(ep_->wait_ready(now_ns() + kTestWaitNs).ok());
    std::vector<EndpointEvent> events;
    uint64_t terminals = 0;
    auto drain_until = [&](uint64_t want) {
      poll_until(
          *ep_, events,
          [&] {
            for (const EndpointEvent& e : events) terminals += e.kind == EndpointEvent::Kind::kTerminal;
            events.clear();
            return terminals >= want;
          },
          "terminals");
    };
    constexpr uint64_t kRuns = 400;
    uint64_t published = 0;
    while (published < kRuns) {
      poll_until(
          *ep_, events, [&] { return ep_->available_request_transport() > 0 && ep_->held_runs() < 4; },
          "a free frame and entry");
      for (const EndpointEvent& e : events) terminals += e.kind == EndpointEvent::Kind::kTerminal;
      events.clear();
      PublishSpec s;
      s.run_id = ++published;
      s.dispatch_id = s.run_id;
      const std::vector<uint8_t> cfg = bytes_of(published % 5 == 0 ? "fail=6;text=a failure" : "");
      s.config = cfg;
      s.staged = published % 7 == 0;
      auto p = ep_->publish(s);
      ASSERT_TRUE(p.ok()) << p.status().to_string();
      if (s.staged) {
        poll_until(
            *ep_, events, [&] { return load_acquire(ep_->view().entry(p->entry).consumed_ack) == p->publication; },
            "the staged run's ACK");
        ASSERT_TRUE(ep_->activate(*p, published % 2 == 0).ok());
      }
      if (published % 50 == 0) {
        auto a = ep_->control_malloc(64, now_ns() + kTestWaitNs);
        ASSERT_TRUE(a.ok()) << a.status().to_string();
        ASSERT_TRUE(ep_->control_free(*a, now_ns() + kTestWaitNs).ok());
      }
    }
    drain_until(kRuns);
    // One held behind a gate that stays shut: the exit sweep ends it.
    publish_run(*ep_, kRuns + 1, "pre=5;gate=5;text=held");
    poll_until(
        *ep_, events, [&] { return ep_->available_request_transport() == kMailboxRequestFrames; },
        "the held run's hand-off");
    ep_->request_shutdown();
    loop.join();
    drain_until(kRuns + 1);
  }

 private:
  SharedMapping map_;
  SharedMapping gates_map_;
  TestGates* gates_ = nullptr;
  std::unique_ptr<MailboxEndpoint> ep_;
  std::unique_ptr<TestHandler> handler_;
  std::unique_ptr<MailboxChild> child_;
};

// T15: a representative workload over checked child loops, in a thread and
// in forked children (a node of 2 chips and a sub worker); every lifecycle
// ends on its ACK or terminal. Prints the figure.
TEST(StoreOrder, T15RepresentativeWorkloadHasNoViolation) {
  Watchdog dog;
  const HealthScan health;
  const StoreOrderCounts before = store_order_counts();
  {
    Workload w;
    w.run();
  }
  const StoreOrderCounts threads = store_order_counts();
  EXPECT_GT(threads.frame_lifecycles, before.frame_lifecycles + 400) << "thread mode: every hand-off is checked";
  EXPECT_GT(threads.entry_lifecycles, before.entry_lifecycles + 400) << "thread mode: every occupancy is checked";

  make_node_gates();
  NodeSpec spec;
  spec.config = node_config(2, 1, 4);
  spec.chip_callables = {axpb_callable()};
  spec.functions = {[](const TaskArgsView&) { return Status(); }};
  const CallableHandle axpb{0, spec.chip_callables[0].digest()};
  auto created = NodeWorker::create(std::move(spec));
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  std::unique_ptr<NodeWorker> w = std::move(created).value();
  constexpr int kN = 8;
  constexpr int kRuns = 40;
  auto x = w->malloc_shared(kN * sizeof(float));
  ASSERT_TRUE(x.ok());
  const TensorView xv(*x, {kN}, DType::F32);
  // An output each, so a failing run orders no other behind it.
  std::vector<DeviceBuffer> ys;
  for (int i = 0; i < kRuns; ++i) {
    auto y = w->malloc_shared(kN * sizeof(float));
    ASSERT_TRUE(y.ok());
    ys.push_back(*y);
  }
  std::vector<RunHandle> runs;
  for (int i = 0; i < kRuns; ++i) {
    const TensorView yv(ys[i], {kN}, DType::F32);
    runs.push_back(w->submit([&, i, yv](Orchestrator& o) -> Status {
      SIMPLER_RETURN_IF_ERROR(
          o.submit_next_level(axpb, axpb_args(xv, yv, i % 9 == 0 ? kAxpbFail : 2, 1, -1), i % 2).status());
      return o.submit_sub(FunctionHandle{0, sub_function_digest(0)}, TaskArgs{}).status();
    }));
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    const Status st = runs[i].wait_for(kWait);
    EXPECT_TRUE(runs[i].done()) << "run " << i;
    EXPECT_EQ(st.ok(), i % 9 != 0) << "run " << i << ": " << st.to_string();
  }
  EXPECT_TRUE(w->free(*x).ok());
  for (const DeviceBuffer& y : ys) EXPECT_TRUE(w->free(y).ok());
  EXPECT_TRUE(w->close(std::chrono::seconds(30)).ok());
  w.reset();
  const StoreOrderCounts after = store_order_counts();
  EXPECT_GT(after.entry_lifecycles, threads.entry_lifecycles + kRuns) << "fork mode: the children's checks count here";
  EXPECT_EQ(after.violations, 0u);
  health.expect_clean();
  const uint64_t frames = after.frame_lifecycles - before.frame_lifecycles;
  const uint64_t entries = after.entry_lifecycles - before.entry_lifecycles;
  std::printf("RELIABILITY T15 lifecycles=%llu frame_lifecycles=%llu entry_lifecycles=%llu violations=%llu\n",
              static_cast<unsigned long long>(frames + entries), static_cast<unsigned long long>(frames),
              static_cast<unsigned long long>(entries), static_cast<unsigned long long>(after.violations));
}

}  // namespace
}  // namespace simpler::testing
