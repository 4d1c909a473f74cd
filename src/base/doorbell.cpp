#include "base/doorbell.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

namespace simpler {

void yield_cpu() { sched_yield(); }

void Doorbell::ring() {
  seq_.fetch_add(1, std::memory_order_seq_cst);
  if (waiters_.load(std::memory_order_seq_cst) != 0) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&seq_), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  }
}

void Doorbell::ring_parked() {
  // Pairs with the Parking's fence: either this load sees the waiter counted,
  // or the waiter's look at its condition sees what this ringer published.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (waiters_.load(std::memory_order_relaxed) != 0) ring();
}

void Doorbell::park(uint32_t armed, uint64_t deadline_ns) {
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  wait(armed, deadline_ns);
  waiters_.fetch_sub(1, std::memory_order_seq_cst);
}

void Doorbell::wait(uint32_t armed, uint64_t deadline_ns) {
  if (seq_.load(std::memory_order_seq_cst) != armed) return;
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
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&seq_), FUTEX_WAIT, armed, tsp, nullptr, 0);
}

Doorbell::Parking::Parking(Doorbell& bell) : bell_(bell) {
  bell_.waiters_.fetch_add(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  armed_ = bell_.seq_.load(std::memory_order_seq_cst);
}

Doorbell::Parking::~Parking() { bell_.waiters_.fetch_sub(1, std::memory_order_seq_cst); }

void Doorbell::Parking::wait(uint64_t deadline_ns) { bell_.wait(armed_, deadline_ns); }

}  // namespace simpler
