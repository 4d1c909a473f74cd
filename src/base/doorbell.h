// Doorbell: a futex word to park on, and the spin-then-park wait every simpler
// thread uses. Any thread may ring; any thread may wait. The word may live in
// process-shared memory (the futex calls are not FUTEX_PRIVATE). Owns nothing.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <utility>

#include "base/clock.h"
#include "base/load_sense.h"

namespace simpler {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// sched_yield(): lets another runnable thread (a simulated core) have this CPU.
void yield_cpu();

// The system calls this process made to wake a Doorbell's sleepers: what a
// test of the wake-up cost counts and every benchmark reports. Any thread.
uint64_t doorbell_wakes();

class Doorbell {
 public:
  // The value to pass to park(): read it, re-check the condition, then park.
  uint32_t arm() { return seq_.load(std::memory_order_seq_cst) & ~kAsleep; }
  // Wakes every parked waiter; costs one atomic add on the bell's line, and
  // a system call only when a waiter went to sleep in the kernel since the
  // last ring that woke it: a woken waiter that has not run yet (a time
  // slice later, on a loaded machine) costs the rings meanwhile nothing more.
  void ring();
  // Wakes the waiters parked through a Parking, and costs a fence and a load
  // of a line nobody writes while none is: for a bell rung far more often
  // than its waiter parks (once per task), where ring()'s add would pull the
  // line from every other ringer each time. Only for a bell whose every
  // waiter parks through a Parking; the ringer makes its news visible first.
  void ring_parked();
  // A waiter of ring_parked(): counted as parked from construction, so a
  // thread that makes one, then looks at its condition and waits, misses no
  // ring_parked() that followed a change of that condition. Used by one
  // thread, within one scope.
  class Parking {
   public:
    explicit Parking(Doorbell& bell);
    ~Parking();
    Parking(const Parking&) = delete;
    Parking& operator=(const Parking&) = delete;
    // Until a ring after construction, or `deadline_ns` (0 = none). Spurious returns happen.
    void wait(uint64_t deadline_ns = 0);

   private:
    Doorbell& bell_;
    uint32_t armed_;
  };
  // Parks until ring() was called after arm() returned `armed`, or until
  // `deadline_ns` (absolute now_ns() time, 0 = none) passes. Spurious returns happen.
  void park(uint32_t armed, uint64_t deadline_ns = 0);
  // Threads parked (or about to) right now: what a test waits for.
  uint32_t parked() const { return waiters_.load(std::memory_order_seq_cst); }
  // True while a waiter may sleep in the kernel unwoken: the next ring makes
  // a system call. What a test of the wake-up cost looks at.
  bool asleep() const { return (seq_.load(std::memory_order_seq_cst) & kAsleep) != 0; }

 private:
  // The low bit of seq_: set by a waiter before it sleeps in the kernel,
  // cleared by the ring that wakes it. In the same word as the count, so a
  // ring clears only the bit of the waiters armed before it.
  static constexpr uint32_t kAsleep = 1;
  void wait(uint32_t armed, uint64_t deadline_ns);

  std::atomic<uint32_t> seq_{0};  // rings * 2, plus kAsleep
  std::atomic<uint32_t> waiters_{0};
};
static_assert(sizeof(Doorbell) == 8, "Doorbell lives in shared memory");

struct SpinPolicy {
  // Busy iterations (with a pause) before each yield, and the spin window
  // before parking. The window is what keeps a hand-off off the ~16 µs futex path.
  uint32_t pauses_per_yield = 64;
  uint64_t spin_ns = 20'000;
  // While this counts above zero, ready() itself receives what it waits for
  // from outside this process (a rank over MPI): no thread here produces it,
  // so even with one usable CPU the wait spins its window rather than yield
  // once and park. Read after ready()'s first look.
  const std::atomic<uint32_t>* polled_producers = nullptr;
};

// The idle spin of a thread that polls for work and parks on its bell when
// there is none (a simulated AICPU or core thread). After each empty poll,
// keep_polling() says whether to poll again (it has paused or yielded) or to
// park. Quiet, the thread polls for the spin window, yielding every 8th poll so
// that a 2-core machine with many simulated cores makes progress; while
// oversubscribed (load_sense()) a yield gives the CPU away for a time slice, so
// it spins LoadSense::kPressedSpinNs without one, and a poll that lost its CPU
// parks at once. With one usable CPU it yields once and parks. One per
// polling thread, used by that thread only.
class IdleSpin {
 public:
  explicit IdleSpin(uint64_t spin_ns) : spin_ns_(spin_ns) {}
  // The poll found work. The yield just before it may have lost the CPU
  // for a time slice while the work arrived: noted, or a poller whose every
  // lost slice ends in work would never learn that the machine is loaded.
  void busy() {
    if (yielded_) {
      const uint64_t t = now_ns();
      load_.note_batch(t - last_idle_, t);
      yielded_ = false;
    }
    idle_since_ = 0;
    polls_ = 0;
  }
  // The poll found none: true to poll again, false to park now. A quiet
  // machine's window is `spin_ns` for this idle stretch, the constructor's by
  // default; a loaded one's is LoadSense::kPressedSpinNs either way.
  bool keep_polling() { return keep_polling(spin_ns_); }
  bool keep_polling(uint64_t spin_ns);
  // The thread parked and is polling again.
  void woke() {
    idle_since_ = 0;
    polls_ = 0;
    yielded_ = false;
  }

 private:
  LoadSense& load_ = load_sense();
  uint64_t spin_ns_;
  uint64_t idle_since_ = 0;
  uint64_t last_idle_ = 0;
  uint32_t polls_ = 0;
  bool yielded_ = false;  // since last_idle_
};

inline bool IdleSpin::keep_polling(uint64_t spin_ns) {
  if (usable_cpus() == 1) {
    // One CPU: the work this thread polls for is made only while it is off
    // the CPU. One yield lets a runnable producer make it; then park.
    if (polls_++ != 0) return false;
    yield_cpu();
    return true;
  }
  const uint64_t t = now_ns();
  if (idle_since_ == 0) idle_since_ = last_idle_ = t;
  const bool lost = load_.note_batch(t - last_idle_, t);
  last_idle_ = t;
  yielded_ = false;
  const bool pressed = load_.oversubscribed(t);
  if (lost || t - idle_since_ >= (pressed ? LoadSense::kPressedSpinNs : spin_ns)) return false;
  if (!pressed && ++polls_ % 8 == 0) {
    yield_cpu();
    yielded_ = true;
  } else {
    cpu_relax();
  }
  return true;
}

// spin_then_park's spin on a machine where the producer may run beside it.
enum class SpinEnd { kReady, kDeadline, kPark };
template <typename Ready>
SpinEnd spin_before_park(Ready& ready, const SpinPolicy& policy, uint64_t deadline_ns) {
  LoadSense& load = load_sense();
  uint64_t batch_start = now_ns();
  const uint64_t spin_until = batch_start + (load.oversubscribed(batch_start) ? 0 : policy.spin_ns);
  uint32_t n = 0;
  for (;;) {
    if (ready()) {
      // What this waited for may have arrived while the yield just before
      // lost the CPU to another process for a time slice: noted, or a wait
      // that always ends right after such a yield would never learn that
      // the machine is loaded and would go on yielding slices away. (A wait
      // still spinning notes the slice at the end of its batch.)
      if (n != 0 && n % policy.pauses_per_yield == 0) {
        const uint64_t t = now_ns();
        load.note_batch(t - batch_start, t);
      }
      return SpinEnd::kReady;
    }
    if (++n % policy.pauses_per_yield == 0) {
      const uint64_t t = now_ns();
      if (deadline_ns != 0 && t >= deadline_ns) return SpinEnd::kDeadline;
      if (t >= spin_until || load.note_batch(t - batch_start, t)) return SpinEnd::kPark;
      yield_cpu();
      batch_start = t;
    } else {
      cpu_relax();
    }
  }
}

// Waits until ready() is true: spins for policy.spin_ns (yielding so that a
// 2-core machine with many simulated cores makes progress), then parks on
// `bell`, whose producers ring it (ring() or ring_parked()) after making
// ready() true. On an oversubscribed machine (load_sense()) a yield hands the
// CPU to a neighbour for a whole time slice, so the wait then spins one batch
// and parks, and a batch that lost its CPU parks at once. A process with one
// usable CPU (usable_cpus()) yields once and parks: its producer cannot run
// beside a spin, only after it (unless policy.polled_producers counts one,
// whose answer only ready() receives). Returns false when `deadline_ns` (0 = none)
// passed first. `before_park` runs once, when the spin ended without ready()
// and the wait is about to park: what the thread did while it spun (ready() may
// poll work of its own) goes back to another.
template <typename Ready, typename BeforePark>
bool spin_then_park(Doorbell& bell, Ready&& ready, const SpinPolicy& policy, uint64_t deadline_ns,
                    BeforePark&& before_park) {
  if (ready()) return true;
  const auto polled = [&] {
    return policy.polled_producers != nullptr && policy.polled_producers->load(std::memory_order_acquire) != 0;
  };
  bool spin = usable_cpus() != 1 || polled();
  if (!spin) {
    // One CPU: what ready() waits for runs only once this thread gives the
    // CPU up, so a spin only delays it. One yield lets a runnable producer
    // finish (its ring then finds no sleeper: no system call); then park,
    // unless what it did was send out work whose answer ready() polls for.
    yield_cpu();
    if (ready()) return true;
    spin = polled();
  }
  if (spin) {
    if (const SpinEnd end = spin_before_park(ready, policy, deadline_ns); end != SpinEnd::kPark) {
      return end == SpinEnd::kReady;
    }
  }
  before_park();
  for (;;) {
    // Counted before the last look, so the bell may be rung with ring_parked().
    Doorbell::Parking parking(bell);
    if (ready()) return true;
    if (deadline_ns != 0 && now_ns() >= deadline_ns) return false;
    parking.wait(deadline_ns);
  }
}

template <typename Ready>
bool spin_then_park(Doorbell& bell, Ready&& ready, const SpinPolicy& policy, uint64_t deadline_ns = 0) {
  return spin_then_park(bell, std::forward<Ready>(ready), policy, deadline_ns, [] {});
}

}  // namespace simpler
