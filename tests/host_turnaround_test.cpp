// Issue 11, first_task: tensormap_and_ringbuffer's orchestrator waits for the
// host's next launch as long as the host's last turnaround took (a run's end
// to the next launch, none in flight between), twice over and at most
// HostTurnaround::kMaxSpinNs; the device's own window otherwise. These cases
// feed it clock readings, so nothing here depends on this machine's timing.
#include <gtest/gtest.h>

#include "runtime/common/host_turnaround.h"

namespace simpler {
namespace {

constexpr uint64_t kBase = 20'000;  // the device's window (SpinPolicy's default)
constexpr uint64_t kT0 = 1'000'000'000;

TEST(HostTurnaround, BeforeAnyRunEndedTheWaiterKeepsTheDevicesWindow) {
  HostTurnaround t;
  EXPECT_EQ(t.spin_ns(kBase), kBase);
  t.launched(kT0);
  EXPECT_EQ(t.spin_ns(kBase), kBase) << "a run in flight";
  t.ended(kT0 + 500'000);
  EXPECT_EQ(t.spin_ns(kBase), kBase) << "no turnaround measured yet: the first launch followed no end";
}

TEST(HostTurnaround, AQuickHostIsAwaitedTwiceItsLastTurnaroundOnlyWhileNoRunIsInFlight) {
  HostTurnaround t;
  t.launched(kT0);
  t.ended(kT0 + 100'000);
  t.launched(kT0 + 100'000 + 30'000);  // the host came back after 30 us
  EXPECT_EQ(t.spin_ns(kBase), kBase) << "while a run is in flight its CPU is the run's";
  t.ended(kT0 + 300'000);
  EXPECT_EQ(t.spin_ns(kBase), 60'000u);
  EXPECT_EQ(t.spin_ns(100'000), 100'000u) << "never shorter than the device's own window";
}

TEST(HostTurnaround, TheWindowIsCappedAndAHostSlowerThanTheCapIsNotAwaited) {
  HostTurnaround t;
  t.launched(kT0);
  t.ended(kT0 + 1'000);
  constexpr uint64_t kCap = HostTurnaround::kMaxSpinNs;
  t.launched(kT0 + 1'000 + kCap * 3 / 4);
  t.ended(kT0 + 2 * kCap);
  EXPECT_EQ(t.spin_ns(kBase), kCap) << "2 x 3/4 of the cap, capped";
  t.launched(kT0 + 2 * kCap + kCap + 1);
  t.ended(kT0 + 5 * kCap);
  EXPECT_EQ(t.spin_ns(kBase), kBase) << "a host that came back after the cap is busy elsewhere";
  // Learned afresh from the next turnaround, whatever the one before was.
  t.launched(kT0 + 5 * kCap + 10'000);
  t.ended(kT0 + 6 * kCap);
  EXPECT_EQ(t.spin_ns(kBase), kBase) << "2 x 10 us is no longer than the device's window";
  EXPECT_EQ(t.spin_ns(1'000), 20'000u);
}

// Pipelined runs: a launch while another run is in flight measures nothing,
// and the window waits until the last one in flight has ended.
TEST(HostTurnaround, ALaunchBesideARunInFlightMeasuresNothing) {
  HostTurnaround t;
  t.launched(kT0);
  t.ended(kT0 + 1'000);
  t.launched(kT0 + 1'000 + 40'000);        // measured: 40 us
  t.launched(kT0 + 1'000 + 40'000 + 900);  // beside it: not a turnaround
  t.ended(kT0 + 100'000);
  EXPECT_EQ(t.spin_ns(kBase), kBase) << "one run is still in flight";
  t.ended(kT0 + 150'000);
  EXPECT_EQ(t.spin_ns(kBase), 80'000u);
}

}  // namespace
}  // namespace simpler
