#include "runtime/tmr/tensor_map.h"

#include "runtime/common/access_index.h"

namespace simpler::tmr {

void TensorMap::reset(uint32_t window) {
  // Only the buckets and task lists that the last run's live records
  // (tombstones, tasks it never retired) still link are cleared, not the
  // whole table: the walk costs the run's peak record count, off the submit path.
  for (const Rec& rec : recs_) {
    if (!rec.live) continue;
    for (uint32_t k = 0; k < rec.granules; ++k) heads_[links_[(&rec - recs_.data()) * kMaxGranules + k].bucket] = 0;
    if (rec.task != kTombstone) task_head_[rec.slot] = 0;
  }
  recs_.clear();
  free_recs_.clear();
  links_.clear();
  allocs_.clear();
  free_allocs_.clear();
  alloc_of_.clear();
  if (task_head_.size() != window) task_head_.assign(window, 0);
  const size_t records = size_t{window} * 4;
  size_t buckets = 64;
  while (buckets < records * 2) buckets *= 2;
  if (heads_.size() != buckets) {
    heads_.assign(buckets, 0);
    mask_ = buckets - 1;
  }
  recs_.reserve(records);
  links_.reserve(records * kMaxGranules);
}

uint32_t TensorMap::alloc_index(uint64_t addr, uint64_t span) {
  auto [it, fresh] = alloc_of_.try_emplace(addr, 0);
  if (!fresh) return it->second;
  uint32_t ai;
  if (!free_allocs_.empty()) {
    ai = free_allocs_.back();
    free_allocs_.pop_back();
  } else {
    ai = static_cast<uint32_t>(allocs_.size());
    allocs_.emplace_back();
  }
  Alloc& al = allocs_[ai];
  al = Alloc{};
  al.addr = addr;
  // Granules the size of the first access: most tasks touch regions of
  // one size per allocation, which then land in one or two buckets.
  uint32_t shift = 6;
  while (shift < 62 && (uint64_t{1} << shift) < span) ++shift;
  al.shift = shift;
  it->second = ai;
  return ai;
}

size_t TensorMap::bucket(uint32_t alloc, uint64_t granule) const {
  return granule_bucket(uint64_t{alloc} + 1, granule, mask_);
}

uint32_t TensorMap::new_record() {
  if (!free_recs_.empty()) {
    const uint32_t r = free_recs_.back();
    free_recs_.pop_back();
    return r;
  }
  recs_.emplace_back();
  links_.resize(links_.size() + kMaxGranules);
  return static_cast<uint32_t>(recs_.size() - 1);
}

void TensorMap::insert(uint32_t r, uint64_t g0, uint64_t g1) {
  Rec& rec = recs_[r];
  rec.granules = static_cast<uint8_t>(g1 - g0 + 1);
  for (uint32_t k = 0; k < rec.granules; ++k) {
    const uint32_t l = r * kMaxGranules + k;
    Link& link = links_[l];
    link.bucket = static_cast<uint32_t>(bucket(rec.alloc, g0 + k));
    uint32_t& head = heads_[link.bucket];
    link.chain.prev = 0;
    link.chain.next = head;
    if (head != 0) links_[head - 1].chain.prev = l + 1;
    head = l + 1;
  }
}

void TensorMap::unlink_from_task(uint32_t r) { list_unlink(task_head_[recs_[r].slot], &Rec::in_task, r); }

void TensorMap::erase(uint32_t r) {
  Rec& rec = recs_[r];
  if (rec.task != kTombstone) unlink_from_task(r);
  Alloc& al = allocs_[rec.alloc];
  list_unlink(al.all, &Rec::in_alloc, r);
  if (rec.granules == 0) list_unlink(al.long_recs, &Rec::in_long, r);
  for (uint32_t k = 0; k < rec.granules; ++k) {
    const Link& link = links_[r * kMaxGranules + k];
    if (link.chain.prev != 0) {
      links_[link.chain.prev - 1].chain.next = link.chain.next;
    } else {
      heads_[link.bucket] = link.chain.next;
    }
    if (link.chain.next != 0) links_[link.chain.next - 1].chain.prev = link.chain.prev;
  }
  rec.granules = 0;
  rec.view = TensorView();
  rec.live = false;
  free_recs_.push_back(r);
}

void TensorMap::retire(uint32_t slot, bool failed) {
  uint32_t cur = task_head_[slot];
  task_head_[slot] = 0;
  while (cur != 0) {
    const uint32_t r = cur - 1;
    cur = recs_[r].in_task.next;
    // Off its task's list either way; a failed task's record stays, found
    // by overlap, as a tombstone.
    recs_[r].in_task = Node{};
    recs_[r].task = kTombstone;
    if (!failed) erase(r);
  }
}

void TensorMap::forget_allocation(uint64_t alloc) {
  const auto it = alloc_of_.find(alloc);
  if (it == alloc_of_.end()) return;
  const uint32_t ai = it->second;
  while (allocs_[ai].all != 0) erase(allocs_[ai].all - 1);
  alloc_of_.erase(it);
  free_allocs_.push_back(ai);
}

}  // namespace simpler::tmr
