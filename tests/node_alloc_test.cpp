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
#include "node/scheduler.h"
#include "node/worker_lane.h"

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

}  // namespace
}  // namespace simpler
