#include "runtime/tmr/tensor_map.h"

namespace simpler::tmr {

void TensorMap::reset(uint32_t window) {
  if (task_head_.size() != window) {
    task_head_.assign(window, 0);
  } else {
    // Only tasks the last run never retired still head a list: clearing
    // theirs costs what the run left, not the window.
    for (const Rec& rec : recs_) {
      if (rec.task != kTombstone) task_head_[rec.slot] = 0;
    }
  }
  recs_.clear();
  free_.clear();
  allocs_.clear();
  recs_.reserve(size_t{window} * 4);
}

void TensorMap::unlink(uint32_t r) {
  Rec& rec = recs_[r];
  if (rec.task == kTombstone) return;  // a tombstone belongs to no task's list
  if (rec.prev != 0) {
    recs_[rec.prev - 1].next = rec.next;
  } else {
    task_head_[rec.slot] = rec.next;
  }
  if (rec.next != 0) recs_[rec.next - 1].prev = rec.prev;
}

void TensorMap::erase(uint32_t r) {
  unlink(r);
  remove(r);
}

void TensorMap::remove(uint32_t r) {
  Rec& rec = recs_[r];
  // The allocation's entry stays even when empty: add() may be walking it.
  allocs_.find(rec.alloc)->second.by_first.erase(rec.pos);
  rec.view = TensorView();
  free_.push_back(r);
}

void TensorMap::retire(uint32_t slot, bool failed) {
  uint32_t cur = task_head_[slot];
  task_head_[slot] = 0;
  while (cur != 0) {
    const uint32_t r = cur - 1;
    cur = recs_[r].next;
    if (failed) {
      recs_[r].task = kTombstone;
    } else {
      remove(r);
    }
  }
}

void TensorMap::forget_allocation(uint64_t alloc) {
  auto al = allocs_.find(alloc);
  if (al == allocs_.end()) return;
  while (!al->second.by_first.empty()) erase(al->second.by_first.begin()->second);
  allocs_.erase(al);
}

}  // namespace simpler::tmr
