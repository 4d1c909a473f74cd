// Layer src/base: Status / Result values, the fmt error helpers, the Doorbell
// (ring wakes a parked thread; a deadline ends a park) and spin_then_park.
#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <stdexcept>
#include <thread>
#include <variant>

#include "base/clock.h"
#include "base/cycle_clock.h"
#include "base/doorbell.h"
#include "base/errors.h"
#include "base/load_sense.h"
#include "forced_load.h"
#include "simpler/simpler.h"
#include "test_util.h"

namespace simpler {
namespace {

using testing::kWait;
using testing::Watchdog;

TEST(Status, DefaultIsOkAndPrintsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.to_string(), "OK");
  EXPECT_TRUE(Status::ok_status().ok());
}

TEST(Status, CarriesCodeAndMessage) {
  Status s(StatusCode::kKernelFailed, "task 3 failed");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kKernelFailed);
  EXPECT_EQ(s.message(), "task 3 failed");
  EXPECT_EQ(s.to_string(), "KERNEL_FAILED: task 3 failed");
  EXPECT_EQ(s, Status(StatusCode::kKernelFailed, "task 3 failed"));
  EXPECT_FALSE(s == Status(StatusCode::kKernelFailed, "task 4 failed"));
  EXPECT_FALSE(s == Status(StatusCode::kInternal, "task 3 failed"));
}

TEST(Status, EveryCodeHasADistinctName) {
  const StatusCode codes[] = {StatusCode::kOk,           StatusCode::kInvalidArgument,
                              StatusCode::kNotFound,     StatusCode::kFailedPrecondition,
                              StatusCode::kOutOfRange,   StatusCode::kResourceExhausted,
                              StatusCode::kKernelFailed, StatusCode::kDeadlineExceeded,
                              StatusCode::kAborted,      StatusCode::kUnimplemented,
                              StatusCode::kInternal,     StatusCode::kUserCodeFailed,
                              StatusCode::kDeviceFault};
  std::set<std::string> names;
  for (StatusCode c : codes) {
    const std::string n = status_code_name(c);
    EXPECT_NE(n, "UNKNOWN");
    names.insert(n);
  }
  EXPECT_EQ(names.size(), std::size(codes));
  EXPECT_STREQ(status_code_name(StatusCode::kResourceExhausted), "RESOURCE_EXHAUSTED");
  EXPECT_STREQ(status_code_name(StatusCode::kDeviceFault), "DEVICE_FAULT");
  EXPECT_STREQ(status_code_name(static_cast<StatusCode>(200)), "UNKNOWN");
}

TEST(Status, ErrorHelpersFormatTheMessage) {
  Status s = invalid_argument("args[{}]: {} is bad", 3, "shape");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "args[3]: shape is bad");
  EXPECT_EQ(out_of_range("x").code(), StatusCode::kOutOfRange);
  EXPECT_EQ(not_found("x").code(), StatusCode::kNotFound);
  EXPECT_EQ(failed_precondition("x").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(resource_exhausted("x").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(internal_error("x").code(), StatusCode::kInternal);
  EXPECT_EQ(make_error(StatusCode::kAborted, "{}-{}", 1, 2).message(), "1-2");
}

Status returns_early(bool fail, int& reached) {
  SIMPLER_RETURN_IF_ERROR(fail ? not_found("first") : Status());
  reached = 1;
  return Status();
}

TEST(Status, ReturnIfErrorStopsAtTheFirstError) {
  int reached = 0;
  Status s = returns_early(true, reached);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(reached, 0);
  EXPECT_TRUE(returns_early(false, reached).ok());
  EXPECT_EQ(reached, 1);
}

Status returns_with_context(bool fail, int slot) {
  SIMPLER_RETURN_IF_ERROR(fail ? out_of_range("too far") : Status(), "slot {}", slot);
  return Status();
}

TEST(Status, ReturnIfErrorPrefixesTheContextAndKeepsTheCode) {
  const Status s = returns_with_context(true, 7);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(s.message(), "slot 7: too far");
  EXPECT_TRUE(returns_with_context(false, 7).ok());
}

Result<int> half(int v) {
  if (v % 2 != 0) return invalid_argument("v = {} is odd", v);
  return v / 2;
}

// Assigns through a declaration and through an existing variable; the
// context form names what failed.
Result<int> quarter(int v, int& steps) {
  SIMPLER_ASSIGN_OR_RETURN(int h, half(v));
  ++steps;
  SIMPLER_ASSIGN_OR_RETURN(h, half(h), "second halving of {}", v);
  ++steps;
  return h;
}

TEST(Result, AssignOrReturnMovesTheValueOrReturnsTheError) {
  int steps = 0;
  Result<int> q = quarter(12, steps);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(*q, 3);
  EXPECT_EQ(steps, 2);
  steps = 0;
  q = quarter(5, steps);
  EXPECT_EQ(steps, 0);
  EXPECT_EQ(q.status(), invalid_argument("v = 5 is odd"));
  q = quarter(6, steps);
  EXPECT_EQ(steps, 1);
  EXPECT_EQ(q.status(), invalid_argument("second halving of 6: v = 3 is odd"));
}

TEST(Result, HoldsAValue) {
  Result<int> r(42);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 42);
  EXPECT_EQ(r.value(), 42);
  EXPECT_TRUE(r.status().ok());
  Result<std::string> s(std::string("abc"));
  EXPECT_EQ(s->size(), 3u);
  std::string moved = std::move(s).value();
  EXPECT_EQ(moved, "abc");
}

TEST(Result, HoldsAnErrorAndRefusesToGiveAValue) {
  Result<int> r(Status(StatusCode::kOutOfRange, "too far"));
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(r.status().message(), "too far");
  EXPECT_THROW((void)r.value(), std::bad_variant_access);
}

TEST(Clock, IsMonotonic) {
  const uint64_t a = now_ns();
  const uint64_t b = now_ns();
  EXPECT_LE(a, b);
  EXPECT_GT(a, 0u);
}

TEST(Doorbell, ParkReturnsAtOnceWhenRungAfterArm) {
  Watchdog dog;
  Doorbell bell;
  const uint32_t armed = bell.arm();
  bell.ring();
  const uint64_t deadline = now_ns() + 10'000'000'000ull;
  bell.park(armed, deadline);
  EXPECT_LT(now_ns(), deadline) << "the park slept to its deadline: the ring before it was lost";
}

TEST(Doorbell, ParkWithADeadlineReturns) {
  Watchdog dog;
  Doorbell bell;
  const uint32_t armed = bell.arm();
  const uint64_t deadline = now_ns() + 2'000'000;  // 2 ms, nobody rings
  bell.park(armed, deadline);
  // Spurious returns are allowed, so park again until the deadline: this must end.
  while (now_ns() < deadline) bell.park(armed, deadline);
  EXPECT_GE(now_ns(), deadline);
  // A deadline already in the past returns at once.
  bell.park(armed, 1);
}

// Starts a waiter that runs `round(flag, deadline)` (one look at the flag
// and one park; true once it saw the flag) until it sees the flag, waits
// until it sleeps in the kernel (futex), sets the flag and calls `ring`; the
// waiter must wake before its deadline.
template <typename Round, typename Ring>
void expect_ring_wakes_a_sleeping_waiter(Round round, Ring ring, const char* what) {
  std::atomic<bool> flag{false};
  std::atomic<pid_t> tid{0};
  std::atomic<bool> woke_before_deadline{false};
  const uint64_t deadline = now_ns() + std::chrono::nanoseconds(kWait).count();
  std::thread waiter([&] {
    tid.store(gettid());
    while (!round(flag, deadline)) {
      if (now_ns() >= deadline) return;
    }
    woke_before_deadline.store(now_ns() < deadline);
  });
  ASSERT_TRUE(testing::eventually([&] { return tid.load() != 0 && testing::thread_state(tid.load()) == 'S'; }));
  flag.store(true);
  ring();
  waiter.join();
  EXPECT_TRUE(woke_before_deadline.load()) << "the parked thread was not woken by " << what;
}

TEST(Doorbell, RingWakesAParkedThread) {
  Watchdog dog;
  Doorbell bell;
  expect_ring_wakes_a_sleeping_waiter(
      [&](const std::atomic<bool>& flag, uint64_t deadline) {
        const uint32_t armed = bell.arm();
        if (flag.load()) return true;
        bell.park(armed, deadline);
        return false;
      },
      [&] { bell.ring(); }, "ring()");
}

TEST(Doorbell, RingWakesEveryParkedThread) {
  Watchdog dog;
  Doorbell bell;
  std::atomic<bool> flag{false};
  std::atomic<int> woke{0};
  const uint64_t deadline = now_ns() + std::chrono::nanoseconds(kWait).count();
  std::vector<std::thread> waiters;
  for (int i = 0; i < 4; ++i) {
    waiters.emplace_back([&] {
      for (;;) {
        const uint32_t armed = bell.arm();
        if (flag.load()) break;
        if (now_ns() >= deadline) return;
        bell.park(armed, deadline);
      }
      if (now_ns() < deadline) woke.fetch_add(1);
    });
  }
  flag.store(true);
  bell.ring();
  for (auto& t : waiters) t.join();
  EXPECT_EQ(woke.load(), 4);
}

// ring_parked(): a waiter counted by its Parking before it looked at its
// condition is woken; with none counted the bell is left untouched.
TEST(Doorbell, RingParkedWakesAThreadWaitingThroughParking) {
  Watchdog dog;
  Doorbell bell;
  expect_ring_wakes_a_sleeping_waiter(
      [&](const std::atomic<bool>& flag, uint64_t deadline) {
        Doorbell::Parking parking(bell);
        if (flag.load()) return true;
        parking.wait(deadline);
        return false;
      },
      [&] {
        EXPECT_EQ(bell.parked(), 1u) << "the sleeping waiter is not counted";
        bell.ring_parked();
      },
      "ring_parked()");
  EXPECT_EQ(bell.parked(), 0u) << "a Parking left its waiter counted";
}

// The interleaving ring_parked() exists for, forced on one thread: the
// waiter counted itself and found nothing, then the news and the ring came,
// then it waits. The wait must return at once, not sleep to its deadline.
TEST(Doorbell, RingParkedBetweenAWaitersLookAndItsWaitIsNotLost) {
  Watchdog dog;
  Doorbell bell;
  Doorbell::Parking parking(bell);
  bell.ring_parked();
  const uint64_t deadline = now_ns() + 2'000'000'000ull;
  parking.wait(deadline);
  EXPECT_LT(now_ns(), deadline) << "the wait slept to its deadline: the ring after the waiter's look was lost";
}

TEST(Doorbell, RingParkedWithNobodyParkedLeavesTheBellUntouched) {
  Doorbell bell;
  const uint32_t armed = bell.arm();
  bell.ring_parked();
  EXPECT_EQ(bell.arm(), armed) << "ring_parked() wrote the bell with nobody parked";
  bell.ring();
  EXPECT_NE(bell.arm(), armed);
}

// The cost the sleeping bit saves: a waiter woken but not yet running (on a
// loaded machine, for a whole time slice) is still counted as parked, so
// every ring_parked() meanwhile used to make a futex wake of its own. Here
// the test thread stays counted (its Parking never waits), a second thread
// sleeps in the kernel, and three rings follow: one system call, not three.
TEST(Doorbell, OnlyTheRingThatWakesASleeperMakesASystemCall) {
  Watchdog dog;
  Doorbell bell;
  Doorbell::Parking counted(bell);
  std::atomic<pid_t> tid{0};
  std::atomic<bool> woke{false};
  const uint64_t deadline = now_ns() + std::chrono::nanoseconds(kWait).count();
  std::thread sleeper([&] {
    tid.store(gettid());
    Doorbell::Parking parking(bell);
    parking.wait(deadline);
    woke.store(now_ns() < deadline);
  });
  ASSERT_TRUE(testing::eventually([&] { return tid.load() != 0 && testing::thread_state(tid.load()) == 'S'; }));
  ASSERT_TRUE(bell.asleep()) << "a thread sleeps in the kernel but the bell does not say so";
  const uint64_t before = doorbell_wakes();
  for (int i = 0; i < 3; ++i) bell.ring_parked();
  EXPECT_EQ(doorbell_wakes() - before, 1u) << "rings after the one that woke the sleeper made system calls";
  EXPECT_FALSE(bell.asleep());
  sleeper.join();
  EXPECT_TRUE(woke.load()) << "the sleeping thread was not woken by the first ring";
  // The counted waiter armed before the rings: its wait returns at once.
  counted.wait(now_ns() + 2'000'000'000ull);
}

// A waiter whose bit a ring cleared and that sleeps again (a spurious return,
// or a new park) sets it again: the next ring wakes it.
TEST(Doorbell, AWaiterThatSleepsAgainAfterAWakeIsWokenByTheNextRing) {
  Watchdog dog;
  Doorbell bell;
  std::atomic<int> round{0};
  std::atomic<pid_t> tid{0};
  std::atomic<int> woke{0};
  const uint64_t deadline = now_ns() + std::chrono::nanoseconds(kWait).count();
  std::thread waiter([&] {
    tid.store(gettid());
    for (int r = 1; r <= 2; ++r) {
      for (;;) {
        Doorbell::Parking parking(bell);
        if (round.load() >= r) break;
        if (now_ns() >= deadline) return;
        parking.wait(deadline);
      }
      woke.store(r);
    }
  });
  for (int r = 1; r <= 2; ++r) {
    ASSERT_TRUE(testing::eventually([&] {
      return woke.load() == r - 1 && testing::thread_state(tid.load()) == 'S' && bell.asleep();
    })) << "round "
        << r << ": the waiter never went to sleep";
    round.store(r);
    bell.ring_parked();
  }
  waiter.join();
  EXPECT_EQ(woke.load(), 2) << "the second sleep was not woken";
}

// A waiter in spin_then_park() is counted before its last look, so news
// published with ring_parked() right after that look (forced here, from
// inside the look) still ends the wait: the bells of simulated cores are
// rung that way.
TEST(SpinThenPark, ARingParkedAfterTheLastLookEndsTheWait) {
  Watchdog dog;
  Doorbell bell;
  bool news = false;
  bool rang = false;
  const uint64_t deadline = now_ns() + 2'000'000'000ull;
  const bool ready = spin_then_park(
      bell,
      [&] {
        if (news) return true;
        if (!rang && bell.parked() == 1) {
          news = true;
          bell.ring_parked();
          rang = true;
        }
        return false;
      },
      SpinPolicy{64, 0}, deadline);
  EXPECT_TRUE(rang) << "the last look was not made counted as parked";
  EXPECT_TRUE(ready) << "the wait ran to its deadline: the ring after the last look was lost";
}

TEST(SpinThenPark, ReturnsTrueAtOnceWhenReady) {
  Doorbell bell;
  EXPECT_TRUE(spin_then_park(
      bell, [] { return true; }, SpinPolicy{}, now_ns() + 1'000'000));
}

TEST(SpinThenPark, ReturnsFalseAtTheDeadline) {
  Watchdog dog;
  Doorbell bell;
  int calls = 0;
  const uint64_t deadline = now_ns() + 5'000'000;  // 5 ms
  EXPECT_FALSE(spin_then_park(
      bell,
      [&] {
        ++calls;
        return false;
      },
      SpinPolicy{}, deadline));
  EXPECT_GE(now_ns(), deadline);
  EXPECT_GT(calls, 0);
  // In the spin window too (a deadline shorter than the spin).
  SpinPolicy long_spin;
  long_spin.spin_ns = 10'000'000'000ull;
  const uint64_t d2 = now_ns() + 1'000'000;
  EXPECT_FALSE(spin_then_park(
      bell, [] { return false; }, long_spin, d2));
  EXPECT_GE(now_ns(), d2);
}

TEST(SpinThenPark, WakesWhenAnotherThreadMakesItReadyAndRings) {
  Watchdog dog;
  Doorbell bell;
  std::atomic<bool> ready{false};
  SpinPolicy no_spin;
  no_spin.spin_ns = 0;  // park at once
  std::thread producer([&] {
    ready.store(true);
    bell.ring();
  });
  const bool ok = spin_then_park(
      bell, [&] { return ready.load(); }, no_spin, now_ns() + std::chrono::nanoseconds(kWait).count());
  producer.join();
  EXPECT_TRUE(ok);
}

// No other process's thread reads as runnable for a scope, so a spin that
// loses its CPU to a parallel test for a time slice spins on (the spin
// counts here, not the machine's load).
struct NoNeighbours {
  NoNeighbours() { hooks::force_others_runnable(0); }
  ~NoNeighbours() { hooks::force_others_runnable(-1); }
};

// The looks of a spin_then_park whose condition never holds, within 2 ms:
// before it parked, and while parked.
struct Looks {
  int before_park = 0;
  int parked = 0;
};
Looks looks_in_2ms(Doorbell& bell, const SpinPolicy& policy) {
  Looks looks;
  const bool ready = spin_then_park(
      bell,
      [&] {
        ++(bell.parked() == 0 ? looks.before_park : looks.parked);
        return false;
      },
      policy, now_ns() + 2'000'000);
  EXPECT_FALSE(ready);
  return looks;
}

// Issues 15 and 16: a process with one usable CPU (mpirun binds each rank of
// a 2-rank job to one core) yields once and parks, for its producer runs only
// once the waiter gives the CPU up; with more CPUs it spins its window first.
// The window outlasts the deadline, so only the one-CPU rule parks.
TEST(SpinThenPark, WithOneUsableCpuAWaitYieldsOnceThenParks) {
  Watchdog dog;
  Doorbell bell;
  SpinPolicy long_spin;
  long_spin.spin_ns = 10'000'000'000ull;
  const auto wait_2ms = [&] { return looks_in_2ms(bell, long_spin); };
  {
    testing::ForcedLoadState quiet(0);
    hooks::force_usable_cpus(1);
    const Looks one = wait_2ms();
    EXPECT_EQ(one.before_park, 2) << "with one CPU: a look, a yield, a look, then park";
    EXPECT_GE(one.parked, 1) << "with one CPU the wait never parked";
  }
  testing::ForcedLoadState plenty(0);
  NoNeighbours no_neighbours;
  const Looks many = wait_2ms();
  EXPECT_GT(many.before_park, 2) << "with many CPUs the wait did not spin";
  EXPECT_EQ(many.parked, 0) << "with many CPUs the wait parked inside its spin window";
}

// A wait whose ready() itself receives its answer from outside the process
// (policy.polled_producers counts one: a remote rank over MPI) spins its
// window even with one usable CPU, since no thread here produces that answer
// while it parks; once the count is zero it yields once and parks again.
TEST(SpinThenPark, WithOneCpuAWaitForAPolledProducerSpinsItsWindow) {
  Watchdog dog;
  Doorbell bell;
  std::atomic<uint32_t> polled{1};
  SpinPolicy policy;
  policy.spin_ns = 10'000'000'000ull;
  policy.polled_producers = &polled;
  testing::ForcedLoadState quiet(0);
  testing::LoadSenseOff sense_off;  // a yield that loses its slice does not end the spin
  hooks::force_usable_cpus(1);
  const Looks spun = looks_in_2ms(bell, policy);
  EXPECT_GT(spun.before_park, 2) << "a wait for a polled producer yielded once and parked";
  EXPECT_EQ(spun.parked, 0) << "a wait for a polled producer parked inside its spin window";
  polled.store(0);
  const Looks looked = looks_in_2ms(bell, policy);
  EXPECT_EQ(looked.before_park, 2) << "with nothing polled, one CPU: a look, a yield, a look, then park";
  EXPECT_GE(looked.parked, 1);
  // Work sent out during the yield (the look after it publishes a task to a
  // remote node, as a waiter's round does) is polled for: the wait spins.
  int looks = 0, parked_looks = 0;
  EXPECT_FALSE(spin_then_park(
      bell,
      [&] {
        if (++looks == 2) polled.store(1);
        if (bell.parked() != 0) ++parked_looks;
        return false;
      },
      policy, now_ns() + 2'000'000));
  EXPECT_GT(looks, 2);
  EXPECT_EQ(parked_looks, 0) << "a wait that sent out polled work during its yield parked";
}

// A poller (a simulated AICPU or core thread) with one usable CPU yields
// once after an empty poll and then parks, and again after work or a wake;
// with more it polls on through its window.
TEST(IdleSpin, WithOneUsableCpuAPollerYieldsOnceThenParks) {
  testing::ForcedLoadState quiet(0);
  constexpr uint64_t kLongWindow = 10'000'000'000ull;
  {
    hooks::force_usable_cpus(1);
    IdleSpin idle(kLongWindow);
    EXPECT_TRUE(idle.keep_polling()) << "no yield before the park";
    EXPECT_FALSE(idle.keep_polling()) << "a second empty poll did not park";
    idle.busy();
    EXPECT_TRUE(idle.keep_polling()) << "no yield after work";
    EXPECT_FALSE(idle.keep_polling());
    idle.woke();
    EXPECT_TRUE(idle.keep_polling()) << "no yield after a wake";
    EXPECT_FALSE(idle.keep_polling());
  }
  hooks::force_usable_cpus(testing::ForcedLoadState::kPlentyCpus);
  NoNeighbours no_neighbours;
  IdleSpin idle(kLongWindow);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(idle.keep_polling()) << "poll " << i << " parked inside its window";
}

// The inline dispatch times kernels with CycleClock: its nanoseconds agree
// with now_ns() over the same stretch (red when the counter's rate is not
// calibrated: the x86 counter ticks at the CPU's base clock, 2 GHz or so),
// and a reading that went backwards is no estimate at all.
TEST(CycleClock, AgreesWithTheSteadyClockAndRefusesAReadingThatWentBackwards) {
  // The rate's first use waits out the calibration; then one stretch of 2 ms.
  (void)CycleClock::elapsed_ns(0, 1);
  const uint64_t ns0 = now_ns();
  const uint64_t t0 = CycleClock::now();
  uint64_t ns1 = now_ns();
  while (ns1 - ns0 < 2'000'000) ns1 = now_ns();
  const uint64_t t1 = CycleClock::now();
  const double steady = static_cast<double>(ns1 - ns0);
  const double cycles = static_cast<double>(CycleClock::elapsed_ns(t0, t1));
  EXPECT_NEAR(cycles / steady, 1.0, 0.05) << "steady " << steady << " ns, cycle clock " << cycles << " ns";
  EXPECT_EQ(CycleClock::elapsed_ns(t1, t0), UINT64_MAX);
  EXPECT_EQ(CycleClock::elapsed_ns(t0, t0), 0u);
}

TEST(Version, IsNonEmpty) {
  EXPECT_STRNE(version_string(), "");
  EXPECT_NE(std::string(build_options()).size(), 0u);
}

}  // namespace
}  // namespace simpler
