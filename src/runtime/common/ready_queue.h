// ReadyQueue: a bounded FIFO of ready tasks of one kind, shared by the AICPU
// threads (push and pop from any of them) and by the launching host thread.
// Sized to the most tasks that can ever be ready at once (grant x tasks per
// run); never allocates in push or pop.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

namespace simpler {

// (slot, task) of one ready task.
struct ReadyItem {
  uint32_t slot;
  uint32_t task;
};

class ReadyQueue {
 public:
  explicit ReadyQueue(size_t capacity);
  // Never fails: capacity covers every task of every slot.
  void push(ReadyItem item);
  void push_many(const ReadyItem* items, size_t n);
  bool pop(ReadyItem& out);
  // Pops the oldest item only when take(item) says so (under the queue's lock).
  template <typename Take>
  bool pop_if(ReadyItem& out, Take&& take) {
    if (empty_hint()) return false;
    std::lock_guard<std::mutex> lock(mu_);
    const size_t size = size_.load(std::memory_order_relaxed);
    if (size == 0 || !take(ring_[head_])) return false;
    out = ring_[head_];
    head_ = (head_ + 1) % ring_.size();
    size_.store(size - 1, std::memory_order_release);
    return true;
  }
  // Replaces the ring (for a regrant, while the queue is empty); hands the old
  // one back in `ring`.
  void swap_storage(std::vector<ReadyItem>& ring) noexcept;
  size_t capacity() const { return ring_.size(); }
  // A hint, read without the lock, so idle pollers skip it cheaply.
  bool empty_hint() const { return size_.load(std::memory_order_acquire) == 0; }

 private:
  std::mutex mu_;
  std::vector<ReadyItem> ring_;
  size_t head_ = 0;
  std::atomic<size_t> size_{0};
};

}  // namespace simpler
