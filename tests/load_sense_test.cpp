// Issue 16, load-aware waiting: LoadSense classifies spin batches from the
// times it is given, and a spin-then-park wait that reads the process as
// oversubscribed (forced through the test hooks, never measured here) parks
// after one batch instead of spinning its whole window.
#include <atomic>
#include <thread>

#include <gtest/gtest.h>

#include "base/doorbell.h"
#include "base/load_sense.h"
#include "gate.h"

namespace simpler {
namespace {

using simpler::testing::eventually;

// Restores the measured state whatever a test forced.
struct HooksReset {
  ~HooksReset() {
    hooks::force_load_state(-1);
    hooks::add_spin_batch_gap(0);
  }
};

TEST(LoadSense, ABatchThatLostItsCpuHoldsTheProcessOversubscribedForTheHold) {
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

}  // namespace
}  // namespace simpler
