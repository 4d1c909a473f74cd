#include "base/doorbell.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

namespace simpler {

namespace {
std::atomic<uint64_t> futex_wakes{0};
}  // namespace

void yield_cpu() { sched_yield(); }

uint64_t doorbell_wakes() { return futex_wakes.load(std::memory_order_relaxed); }

void Doorbell::ring() {
  // A waiter that set kAsleep after this add sleeps on the new value, which
  // the next ring changes; one that set it before sleeps on the old value
  // and is woken here. Two rings that both saw the bit both wake: harmless.
  // tests/model/doorbell.pml checks this word's protocol; its step tags are cited here.
  if ((seq_.fetch_add(2, std::memory_order_seq_cst) & kAsleep) == 0) return;  // M:ring_add
  seq_.fetch_and(~kAsleep, std::memory_order_seq_cst);                        // M:ring_clear
  futex_wakes.fetch_add(1, std::memory_order_relaxed);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&seq_), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);  // M:ring_wake
}

void Doorbell::ring_parked() {
  // Pairs with the Parking's fence: either this load sees the waiter counted,
  // or the waiter's look at its condition sees what this ringer published.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (waiters_.load(std::memory_order_relaxed) != 0) ring();  // M:ring_parked_look
}

void Doorbell::park(uint32_t armed, uint64_t deadline_ns) {
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  wait(armed, deadline_ns);
  waiters_.fetch_sub(1, std::memory_order_seq_cst);
}

void Doorbell::wait(uint32_t armed, uint64_t deadline_ns) {
  timespec ts{};
  timespec* tsp = nullptr;
  if (deadline_ns != 0) {
    const uint64_t t = now_ns();
    const uint64_t left = deadline_ns > t ? deadline_ns - t : 0;
    if (left == 0) return;
    ts.tv_sec = static_cast<time_t>(left / 1'000'000'000ull);
    ts.tv_nsec = static_cast<long>(left % 1'000'000'000ull);
    tsp = &ts;
  }
  uint32_t cur = seq_.load(std::memory_order_seq_cst);  // M:wait_load
  do {
    if ((cur & ~kAsleep) != armed) return;  // rung since it was armed
  } while ((cur & kAsleep) == 0 && !seq_.compare_exchange_weak(cur, cur | kAsleep, std::memory_order_seq_cst,
                                                               std::memory_order_seq_cst));              // M:wait_mark
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&seq_), FUTEX_WAIT, armed | kAsleep, tsp, nullptr, 0);  // M:wait_sleep
}

Doorbell::Parking::Parking(Doorbell& bell) : bell_(bell) {
  bell_.waiters_.fetch_add(1, std::memory_order_seq_cst);  // M:parking_count
  std::atomic_thread_fence(std::memory_order_seq_cst);
  armed_ = bell_.arm();  // M:parking_arm
}

Doorbell::Parking::~Parking() { bell_.waiters_.fetch_sub(1, std::memory_order_seq_cst); }  // M:parking_end

void Doorbell::Parking::wait(uint64_t deadline_ns) { bell_.wait(armed_, deadline_ns); }

}  // namespace simpler
