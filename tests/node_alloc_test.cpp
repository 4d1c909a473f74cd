// R44: lanes are sized once in start(), and progress allocates nothing. This
// binary replaces global operator new with one that counts the allocations
// of the counting thread.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <new>
#include <vector>

#include "alloc_hook.h"
#include "base/shared_memory.h"
#include "ipc/mailbox_endpoint.h"
#include "node/node_worker.h"
#include "node/scheduler.h"
#include "node/worker_lane.h"
#include "node_test_util.h"
#include "test_util.h"

namespace simpler {
namespace {

using testing::AllocHook;

// R44: 10,000 progress ticks of a lane, and 10,000 idle scheduler rounds,
// allocate nothing; the lanes were sized to the endpoint's entries at start.
TEST(Lanes, R44NoAllocationPerTick) {
  auto m = SharedMapping::create_anonymous(*mailbox_size(8));
  ASSERT_TRUE(m.ok());
  auto ep = MailboxEndpoint::create(m->data(), m->size(), 8);
  ASSERT_TRUE(ep.ok());
  MailboxPort port(**ep);
  WorkerLane lane;
  lane.start(&port);
  EXPECT_EQ(lane.lanes(), 8u + kMailboxRequestFrames);
  std::vector<EndpointEvent> events;
  events.reserve(64);
  Scheduler::Hooks hooks;
  hooks.free_heap = [](uint64_t) {};
  MailboxPort port2(**ep);
  Scheduler sched({&port2}, {}, &(*ep)->view().control().parent_bell, hooks);
  lane.progress(events);
  (void)sched.step();
  AllocHook::counting = true;
  for (int i = 0; i < 10'000; ++i) lane.progress(events);
  for (int i = 0; i < 10'000; ++i) (void)sched.step();
  AllocHook::counting = false;
  EXPECT_EQ(AllocHook::allocations, 0);
}

// Bug (issue 10), R26 at the node level: Orchestrator::alloc makes room for
// its record before it takes the shared-heap block, so a std::bad_alloc at any
// host allocation inside it loses no block. Each round fails the k-th
// allocation of two allocs (one in a scope), until a round fails none.
TEST(NodeAlloc, R26AllocLosesNoHeapBlockAtAnyAllocationFailure) {
  testing::Watchdog dog;
  NodeSpec spec;
  spec.config = testing::node_config(0, 1, 2);
  auto w = NodeWorker::create(std::move(spec));
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  const uint64_t baseline = (*w)->heap().live_blocks();
  bool exhausted = false;
  long failed_rounds = 0;
  for (long k = 0; !exhausted; ++k) {
    ASSERT_LT(k, 1000) << "alloc never stopped allocating";
    bool hit = false;
    RunHandle r = (*w)->submit([&](Orchestrator& o) -> Status {
      auto kept = o.alloc({16}, DType::F32);
      Scope scope(o);
      AllocHook::fail_after = k;
      try {
        (void)o.alloc({16}, DType::F32);
        (void)o.alloc({32}, DType::F32);
      } catch (const std::bad_alloc&) {
        hit = true;
        AllocHook::fail_after = -1;
        throw;
      }
      hit = AllocHook::fail_after == -1;  // the failure was injected, and reported as a value
      AllocHook::fail_after = -1;
      return Status();
    });
    const Status st = testing::wait_run(r);
    exhausted = !hit;
    if (hit) {
      ++failed_rounds;
      EXPECT_FALSE(st.ok()) << "round " << k << ": an injected failure must fail the run";
    } else {
      EXPECT_TRUE(st.ok()) << st.to_string();
    }
    EXPECT_EQ((*w)->heap().live_blocks(), baseline) << "round " << k << " lost a shared-heap block";
  }
  EXPECT_GT(failed_rounds, 0);
  EXPECT_TRUE((*w)->close(std::chrono::seconds(30)).ok());
}

}  // namespace
}  // namespace simpler
