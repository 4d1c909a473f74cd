// TensorMap: where the tasks of a streaming run that have not retired yet
// read and wrote, so each new task finds the earlier ones it must follow by
// overlap of regions, not by pointer identity. A retired task's records go,
// except a failed one's, which stay as tombstones that poison later
// conflicting tasks; an intermediate's records go when its memory is reused.
// Only the orchestrator thread of the run's set touches it.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "runtime/common/task_graph.h"
#include "simpler/tensor.h"

namespace simpler::tmr {

// Records are hashed by (allocation, granule of bytes) into doubly linked
// bucket chains, so a lookup costs a bucket or two and a record leaves in
// O(1) when its task retires: nothing is allocated per task once the storage
// has grown to the run's working set.
class TensorMap {
 public:
  // The task of a tombstone: a failed or poisoned task that has retired.
  static constexpr uint32_t kTombstone = UINT32_MAX;

  // Forgets every record, walking the records the last run used at its
  // peak. Room for the records of `window` tasks; grows only past that.
  void reset(uint32_t window);

  // Records the access of task `task` (window slot `slot`) to bytes [first,
  // end) of allocation `alloc` through `view`. Before that, calls
  // conflict(earlier) for every earlier access it must follow (they overlap
  // and one writes; `earlier` is a task id or kTombstone), and, for a
  // write, forgets the earlier accesses it covers.
  template <typename Conflict>
  void add(uint64_t alloc, const TensorView& view, uint64_t first, uint64_t end, uint32_t task, uint32_t slot,
           bool write, Conflict&& conflict);

  // Task in window slot `slot` retired: its records go, or stay as
  // tombstones when it failed or was poisoned.
  void retire(uint32_t slot, bool failed);
  // Every record in allocation `alloc` goes: its memory is handed out again.
  void forget_allocation(uint64_t alloc);

  size_t live_records() const { return recs_.size() - free_recs_.size(); }

 private:
  // A record is linked into at most this many granule buckets; one spanning
  // more lives on its allocation's list of long records instead.
  static constexpr uint32_t kMaxGranules = 4;

  // Neighbours in a doubly linked list, as index + 1 (0 ends the list).
  struct Node {
    uint32_t prev = 0;
    uint32_t next = 0;
  };
  struct Rec {
    uint64_t first;
    uint64_t end;
    TensorView view;
    uint32_t alloc;  // index into allocs_
    uint32_t task;
    uint32_t slot;
    uint32_t seen;     // the add() that last collected it, so a record in two buckets counts once
    Node in_task;      // its task's records (not a tombstone's)
    Node in_alloc;     // every record of its allocation
    Node in_long;      // its allocation's long records, when granules == 0
    uint8_t granules;  // bucket links held: links_[rec * kMaxGranules + k], k < granules
    bool write;
    bool live;
  };
  struct Link {
    uint32_t bucket;
    Node chain;
  };
  struct Alloc {
    uint64_t addr = 0;
    uint32_t shift = 0;      // granule = 2^shift bytes, from the first access's span
    uint32_t all = 0;        // list head: every record
    uint32_t long_recs = 0;  // list head: records spanning more than kMaxGranules granules
  };

  uint32_t alloc_index(uint64_t addr, uint64_t span);
  size_t bucket(uint32_t alloc, uint64_t granule) const;
  uint32_t new_record();
  void insert(uint32_t r, uint64_t g0, uint64_t g1);
  // Takes record `r` out of every list it is on and frees it.
  void erase(uint32_t r);
  void unlink_from_task(uint32_t r);

  // Lists of records threaded through member `node` of each.
  void list_unlink(uint32_t& head, Node Rec::*node, uint32_t r);
  void list_push(uint32_t& head, Node Rec::*node, uint32_t r);
  template <typename Visit>
  void for_each_in(uint32_t head, Node Rec::*node, Visit&& visit) const;

  std::vector<Rec> recs_;
  std::vector<uint32_t> free_recs_;
  std::vector<Link> links_;      // kMaxGranules per record
  std::vector<uint32_t> heads_;  // bucket -> first link + 1
  uint64_t mask_ = 0;
  std::vector<uint32_t> task_head_;  // per window slot: its first record + 1
  std::vector<Alloc> allocs_;
  std::vector<uint32_t> free_allocs_;
  std::unordered_map<uint64_t, uint32_t> alloc_of_;  // allocation address -> index into allocs_
  uint32_t adds_ = 0;
  std::vector<uint32_t> found_;  // add()'s candidates
};

inline void TensorMap::list_unlink(uint32_t& head, Node Rec::*node, uint32_t r) {
  Node& n = recs_[r].*node;
  if (n.prev != 0) {
    (recs_[n.prev - 1].*node).next = n.next;
  } else {
    head = n.next;
  }
  if (n.next != 0) (recs_[n.next - 1].*node).prev = n.prev;
  n = Node{};
}

inline void TensorMap::list_push(uint32_t& head, Node Rec::*node, uint32_t r) {
  Node& n = recs_[r].*node;
  n.prev = 0;
  n.next = head;
  if (head != 0) (recs_[head - 1].*node).prev = r + 1;
  head = r + 1;
}

template <typename Visit>
void TensorMap::for_each_in(uint32_t head, Node Rec::*node, Visit&& visit) const {
  for (uint32_t cur = head; cur != 0; cur = (recs_[cur - 1].*node).next) visit(cur - 1);
}

template <typename Conflict>
void TensorMap::add(uint64_t alloc, const TensorView& view, uint64_t first, uint64_t end, uint32_t task, uint32_t slot,
                    bool write, Conflict&& conflict) {
  const uint32_t ai = alloc_index(alloc, end - first);
  const uint32_t shift = allocs_[ai].shift;
  const uint64_t g0 = first >> shift;
  const uint64_t g1 = (end - 1) >> shift;
  const bool hashed = g1 - g0 < kMaxGranules;
  if (++adds_ == 0) {  // after 2^32 adds the marks could repeat: start them over
    for (Rec& rec : recs_) rec.seen = 0;
    adds_ = 1;
  }
  // Candidates are collected first: visiting one may erase it, which edits
  // the lists being walked.
  found_.clear();
  const auto collect = [&](uint32_t r) {
    Rec& a = recs_[r];
    if (a.alloc != ai || a.seen == adds_) return;
    a.seen = adds_;
    if (a.end > first && a.first < end && a.task != task) found_.push_back(r);
  };
  if (hashed) {
    for (uint64_t g = g0; g <= g1; ++g) {
      for (uint32_t l = heads_[bucket(ai, g)]; l != 0; l = links_[l - 1].chain.next) collect((l - 1) / kMaxGranules);
    }
    for_each_in(allocs_[ai].long_recs, &Rec::in_long, collect);
  } else {
    for_each_in(allocs_[ai].all, &Rec::in_alloc, collect);
  }
  for (const uint32_t r : found_) {
    const Rec& a = recs_[r];
    const bool same_buffer = a.view.buffer().addr == view.buffer().addr;
    // The byte ranges intersect; through one buffer the per-dimension test
    // refines that, across sub-buffers of one allocation it is the answer.
    if ((write || a.write) && (!same_buffer || a.view.overlaps(view))) conflict(a.task);
    if (write && same_buffer && write_covers(view, a.view)) erase(r);
  }
  const uint32_t r = new_record();
  Rec& rec = recs_[r];
  rec.first = first;
  rec.end = end;
  rec.view = view;
  rec.alloc = ai;
  rec.task = task;
  rec.slot = slot;
  rec.seen = adds_;
  rec.write = write;
  rec.live = true;
  list_push(task_head_[slot], &Rec::in_task, r);
  list_push(allocs_[ai].all, &Rec::in_alloc, r);
  if (hashed) {
    insert(r, g0, g1);
  } else {
    rec.granules = 0;
    list_push(allocs_[ai].long_recs, &Rec::in_long, r);
  }
}

}  // namespace simpler::tmr
