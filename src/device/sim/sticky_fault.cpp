#include "device/sim/sticky_fault.h"

#include <utility>

namespace simpler {

void StickyFault::raise(Status cause) {
  std::lock_guard<std::mutex> lock(mu_);
  if (raised_.load(std::memory_order_relaxed)) return;
  cause_ = Status(StatusCode::kDeviceFault, cause.message());
  // Published after the cause, so a reader that sees it raised reads the
  // cause; under the lock, so a second raiser cannot replace the first cause.
  raised_.store(true, std::memory_order_release);
}

Status StickyFault::status() const {
  if (!raised()) return Status();
  std::lock_guard<std::mutex> lock(mu_);
  return cause_;
}

#ifdef SIMPLER_TEST_HOOKS
namespace {
// Zero nth: disarmed. Plain globals, so a forked child inherits them.
std::atomic<uint32_t> g_func_id{0};
std::atomic<uint64_t> g_nth{0};
std::atomic<uint64_t> g_starts{0};
std::atomic<uint64_t> g_fired{0};
std::atomic<std::atomic<uint64_t>*> g_fired_sink{nullptr};
}  // namespace

void arm_device_fault_hook(uint32_t func_id, uint64_t nth, std::atomic<uint64_t>* fired) {
  g_nth.store(0, std::memory_order_seq_cst);
  g_fired_sink.store(fired, std::memory_order_seq_cst);
  g_func_id.store(func_id, std::memory_order_seq_cst);
  g_starts.store(0, std::memory_order_seq_cst);
  g_fired.store(0, std::memory_order_seq_cst);
  g_nth.store(nth, std::memory_order_seq_cst);
}

void disarm_device_fault_hook() { g_nth.store(0, std::memory_order_seq_cst); }

uint64_t device_fault_hook_fired() { return g_fired.load(std::memory_order_acquire); }

bool device_fault_hook_fire(uint32_t func_id, StickyFault& fault, const std::function<Status()>& cause) {
  const uint64_t nth = g_nth.load(std::memory_order_acquire);
  if (nth == 0 || func_id != g_func_id.load(std::memory_order_acquire)) return false;
  if (g_starts.fetch_add(1, std::memory_order_acq_rel) + 1 != nth) return false;
  fault.raise(cause());
  g_fired.fetch_add(1, std::memory_order_acq_rel);
  if (std::atomic<uint64_t>* sink = g_fired_sink.load(std::memory_order_acquire)) {
    sink->fetch_add(1, std::memory_order_acq_rel);
  }
  return true;
}
#endif

}  // namespace simpler
