#include "runtime/common/ready_queue.h"

#include <algorithm>
#include <bit>
#include <cstdlib>

#include "base/doorbell.h"

namespace simpler {

#ifdef SIMPLER_TEST_HOOKS
namespace hooks {
namespace {
std::atomic<ReadyQueueHook> g_hook{nullptr};
}  // namespace
void set_ready_queue_hook(ReadyQueueHook hook) { g_hook.store(hook, std::memory_order_release); }
void ready_queue_point(ReadyQueuePoint point) {
  if (ReadyQueueHook hook = g_hook.load(std::memory_order_acquire); hook != nullptr) hook(point);
}
}  // namespace hooks
#endif

ReadyQueue::Ring::Ring(size_t capacity)
    : mask_(std::bit_ceil(std::max<size_t>(capacity, 2)) - 1), cells_(new Cell[mask_ + 1]) {
  for (uint64_t i = 0; i <= mask_; ++i) cells_[i].seq.store(i, std::memory_order_relaxed);
}

ReadyQueue::ReadyQueue(size_t capacity) : owned_(std::make_unique<Ring>(capacity)) {
  ring_.store(owned_.get(), std::memory_order_release);
}

std::unique_ptr<ReadyQueue::Ring> ReadyQueue::ring_for(size_t capacity) const {
  const size_t now = owned_->capacity();
  if (capacity <= now) return nullptr;
  return std::make_unique<Ring>(std::max<size_t>(capacity, 2 * now));
}

void ReadyQueue::swap_storage(std::unique_ptr<Ring>& ring) noexcept {
  if (ring == nullptr) return;
  const uint64_t head = head_.load(std::memory_order_acquire);
  // A regrant with work queued is a broken invariant.
  if (tail_.load(std::memory_order_acquire) != head) std::abort();
  // Positions go on from where they are, so a pop that read a position before
  // the swap finds it taken in either ring: each cell awaits the first
  // position at or after `head` that maps to it.
  for (uint64_t i = 0; i <= ring->mask_; ++i) {
    ring->cells_[i].seq.store(head + ((i - head) & ring->mask_), std::memory_order_relaxed);
  }
  ring->older_ = std::move(owned_);
  owned_ = std::move(ring);
  ring_.store(owned_.get(), std::memory_order_release);
}

ReadyQueue::Ring::Cell& ReadyQueue::cell_for_push(const Ring& ring, uint64_t pos) {
  Ring::Cell& c = ring.cells_[pos & ring.mask_];
  for (uint32_t spins = 0; c.seq.load(std::memory_order_acquire) != pos; ++spins) {
    // Still queued, not just taken: more items are ready at once than the
    // queue was sized for, so a task became ready twice. A broken invariant, not load.
    if (head_.load(std::memory_order_acquire) + ring.capacity() <= pos) std::abort();
    // Taken, and its pop is between claiming the position and releasing the
    // cell: a few instructions, unless that thread lost its CPU.
    if (spins == 0) hooks::ready_queue_point(hooks::ReadyQueuePoint::kPushWaits);
    if (spins < 64) {
      cpu_relax();
    } else {
      yield_cpu();
    }
  }
  return c;
}

bool ReadyQueue::pop_oldest(ReadyItem& out, bool queueable_only) {
  uint64_t pos = head_.load(std::memory_order_acquire);
  for (;;) {
    if (pos >= tail_.load(std::memory_order_acquire)) return false;
    const Ring& ring = *ring_.load(std::memory_order_acquire);
    Ring::Cell& c = ring.cells_[pos & ring.mask_];
    const uint64_t seq = c.seq.load(std::memory_order_acquire);
    if (seq == pos + 1) {
      // Read before claiming: until the claim below succeeds nobody can take
      // this position, and its cell is not refilled before it is taken.
      const uint64_t word = c.word.load(std::memory_order_relaxed);
      if (queueable_only && (word & 1) == 0) return false;
      hooks::ready_queue_point(hooks::ReadyQueuePoint::kBeforeClaim);
      if (head_.compare_exchange_weak(pos, pos + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
        hooks::ready_queue_point(hooks::ReadyQueuePoint::kAfterClaim);
        c.seq.store(pos + ring.capacity(), std::memory_order_release);
        out = unpack(word);
        return true;
      }
    } else if (seq < pos + 1) {
      // Reserved, not yet written: its push rings the pollers once it is.
      return false;
    } else {
      // Taken by another pop since `pos` was read, or a ring installed since.
      pos = head_.load(std::memory_order_acquire);
    }
  }
}

}  // namespace simpler
