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

void Doorbell::park(uint32_t armed, uint64_t deadline_ns) {
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  if (seq_.load(std::memory_order_seq_cst) == armed) {
    timespec ts{};
    timespec* tsp = nullptr;
    if (deadline_ns != 0) {
      const uint64_t t = now_ns();
      const uint64_t left = deadline_ns > t ? deadline_ns - t : 0;
      ts.tv_sec = static_cast<time_t>(left / 1'000'000'000ull);
      ts.tv_nsec = static_cast<long>(left % 1'000'000'000ull);
      tsp = &ts;
    }
    if (tsp == nullptr || tsp->tv_sec != 0 || tsp->tv_nsec != 0) {
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(&seq_), FUTEX_WAIT, armed, tsp, nullptr, 0);
    }
  }
  waiters_.fetch_sub(1, std::memory_order_seq_cst);
}

}  // namespace simpler
