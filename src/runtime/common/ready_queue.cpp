#include "runtime/common/ready_queue.h"

#include <cstdlib>

namespace simpler {

ReadyQueue::ReadyQueue(size_t capacity) : ring_(capacity == 0 ? 1 : capacity) {}

void ReadyQueue::push(ReadyItem item) { push_many(&item, 1); }

void ReadyQueue::push_many(const ReadyItem* items, size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t size = size_.load(std::memory_order_relaxed);
  // Overflow would mean a task became ready twice: a broken invariant, not load.
  if (size + n > ring_.size()) std::abort();
  for (size_t i = 0; i < n; ++i) ring_[(head_ + size + i) % ring_.size()] = items[i];
  size_.store(size + n, std::memory_order_release);
}

void ReadyQueue::swap_storage(std::vector<ReadyItem>& ring) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (size_.load(std::memory_order_relaxed) != 0) std::abort();  // a regrant with work queued is a broken invariant
  ring_.swap(ring);
  head_ = 0;
}

bool ReadyQueue::pop(ReadyItem& out) {
  if (empty_hint()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  size_t size = size_.load(std::memory_order_relaxed);
  if (size == 0) return false;
  out = ring_[head_];
  head_ = (head_ + 1) % ring_.size();
  size_.store(size - 1, std::memory_order_release);
  return true;
}

}  // namespace simpler
