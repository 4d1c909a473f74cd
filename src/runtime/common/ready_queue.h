// ReadyQueue: a bounded FIFO of ready tasks of one kind, shared by the AICPU
// threads (push and pop from any of them), the orchestrator thread and the
// launching host thread. Lock-free: a thread preempted inside a pop or push
// holds up no other (on a small host the simulator's threads outnumber the
// CPUs, and a preempted lock holder stalled every other thread for a time
// slice). Sized to the most tasks that can ever be ready at once (grant x
// tasks per run); never allocates in push or pop.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace simpler {

namespace hooks {
// Where a ReadyQueue lets a test hold the calling thread (test builds only:
// SIMPLER_TEST_HOOKS): a pop that read the oldest item and has not claimed
// it, a pop that claimed it and has not released its cell, and a push whose
// cell still awaits that release.
enum class ReadyQueuePoint { kBeforeClaim, kAfterClaim, kPushWaits };
#ifdef SIMPLER_TEST_HOOKS
using ReadyQueueHook = void (*)(ReadyQueuePoint);
// Null uninstalls. Called on every thread that passes a point.
void set_ready_queue_hook(ReadyQueueHook hook);
void ready_queue_point(ReadyQueuePoint point);
#else
inline void ready_queue_point(ReadyQueuePoint) {}
#endif
}  // namespace hooks

// (slot, task) of one ready task.
struct ReadyItem {
  uint32_t slot;
  uint32_t task;
};

class ReadyQueue {
 public:
  // Every slot index is below this: the queue packs an item and its
  // queueable flag into one word.
  static constexpr uint32_t kMaxSlots = 1u << 31;

  // The cells of a queue of at least `capacity` items (a power of two), built
  // ahead of a regrant so that installing them (swap_storage) cannot fail.
  class Ring {
   public:
    explicit Ring(size_t capacity);
    size_t capacity() const { return mask_ + 1; }

   private:
    friend class ReadyQueue;
    struct Cell {
      // pos + 1 once the item of position `pos` is in it; pos + capacity
      // once that item was taken and the cell awaits position pos + capacity.
      std::atomic<uint64_t> seq{0};
      std::atomic<uint64_t> word{0};
    };
    const uint64_t mask_;
    const std::unique_ptr<Cell[]> cells_;
    // The ring this one replaced. A pop that read the old ring's address
    // before the swap may still read its cells, so it lives as long as the
    // queue; rings only grow, each to at least twice the last, so the chain
    // costs less than the ring in use.
    std::unique_ptr<Ring> older_;
  };

  explicit ReadyQueue(size_t capacity);
  ReadyQueue(const ReadyQueue&) = delete;
  ReadyQueue& operator=(const ReadyQueue&) = delete;

  // Never fails: capacity covers every task of every slot. `queueable`: the
  // item may wait on a core behind another task (pop_queueable() takes it).
  void push(ReadyItem item, bool queueable) {
    push_many(&item, 1, [queueable](ReadyItem) { return queueable; });
  }
  template <typename Queueable>
  void push_many(const ReadyItem* items, size_t n, Queueable&& queueable);
  bool pop(ReadyItem& out) { return pop_oldest(out, false); }
  // Pops the oldest item only when it was pushed queueable.
  bool pop_queueable(ReadyItem& out) { return pop_oldest(out, true); }
  // A ring for a grant whose queue holds `capacity` items at most, or null
  // when the ring in use is large enough. The regranting thread only, as
  // swap_storage().
  std::unique_ptr<Ring> ring_for(size_t capacity) const;
  // Installs `ring` (for a regrant, while the queue is empty); null changes
  // nothing. Takes `ring`.
  void swap_storage(std::unique_ptr<Ring>& ring) noexcept;
  size_t capacity() const { return ring_.load(std::memory_order_acquire)->capacity(); }
  // A hint, read without claiming anything, so idle pollers skip it cheaply.
  bool empty_hint() const { return head_.load(std::memory_order_acquire) >= tail_.load(std::memory_order_acquire); }

 private:
  static uint64_t pack(ReadyItem item, bool queueable) {
    return (uint64_t{item.slot} << 32 | item.task) << 1 | (queueable ? 1 : 0);
  }
  static ReadyItem unpack(uint64_t word) {
    return ReadyItem{static_cast<uint32_t>(word >> 33), static_cast<uint32_t>(word >> 1)};
  }
  // Waits for the cell of a reserved position to be released by the pop of
  // the position one ring earlier (a pop between its claim and its release).
  Ring::Cell& cell_for_push(const Ring& ring, uint64_t pos);
  bool pop_oldest(ReadyItem& out, bool queueable_only);

  std::unique_ptr<Ring> owned_;  // the ring in use (its chain holds the ones before)
  std::atomic<Ring*> ring_{nullptr};
  alignas(64) std::atomic<uint64_t> head_{0};  // the next position to pop
  alignas(64) std::atomic<uint64_t> tail_{0};  // the next position to reserve for a push
};

template <typename Queueable>
void ReadyQueue::push_many(const ReadyItem* items, size_t n, Queueable&& queueable) {
  if (n == 0) return;
  const Ring& ring = *ring_.load(std::memory_order_acquire);
  const uint64_t first = tail_.fetch_add(n, std::memory_order_acq_rel);
  for (size_t i = 0; i < n; ++i) {
    Ring::Cell& c = cell_for_push(ring, first + i);
    c.word.store(pack(items[i], queueable(items[i])), std::memory_order_relaxed);
    c.seq.store(first + i + 1, std::memory_order_release);
  }
}

}  // namespace simpler
