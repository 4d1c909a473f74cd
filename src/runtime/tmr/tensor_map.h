// TensorMap: where the tasks of a streaming run that have not retired yet
// read and wrote, so each new task finds the earlier ones it must follow by
// overlap of regions, not by pointer identity. A retired task's records go,
// except a failed one's, which stay as tombstones that poison later
// conflicting tasks; an intermediate's records go when its memory is reused.
// Only the orchestrator thread of the run's set touches it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <unordered_map>
#include <vector>

#include "runtime/common/task_graph.h"
#include "simpler/tensor.h"

namespace simpler::tmr {

class TensorMap {
 public:
  // The task of a tombstone: a failed or poisoned task that has retired.
  static constexpr uint32_t kTombstone = UINT32_MAX;

  // Forgets every record. Room for the records of `window` tasks; grows
  // only past that.
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

  size_t live_records() const { return recs_.size() - free_.size(); }

 private:
  struct Rec {
    uint64_t alloc;
    uint64_t first;
    uint64_t end;
    TensorView view;
    uint32_t task;
    uint32_t slot;
    uint32_t prev;  // in its task's list (index + 1; 0 ends it)
    uint32_t next;
    bool write;
    std::multimap<uint64_t, uint32_t>::iterator pos;
  };
  struct Alloc {
    std::multimap<uint64_t, uint32_t> by_first;
    uint64_t max_span = 0;  // the longest record ever, bounding how far back an overlap can start
  };

  // Takes record `r` out of its task's list and the map.
  void erase(uint32_t r);
  void unlink(uint32_t r);
  // Takes record `r` out of the map only.
  void remove(uint32_t r);

  std::vector<Rec> recs_;
  std::vector<uint32_t> free_;
  std::vector<uint32_t> task_head_;  // per window slot: its first record + 1
  std::unordered_map<uint64_t, Alloc> allocs_;
};

template <typename Conflict>
void TensorMap::add(uint64_t alloc, const TensorView& view, uint64_t first, uint64_t end, uint32_t task, uint32_t slot,
                    bool write, Conflict&& conflict) {
  Alloc& al = allocs_[alloc];
  const uint64_t from = first >= al.max_span ? first - al.max_span : 0;
  for (auto it = al.by_first.lower_bound(from); it != al.by_first.end() && it->first < end;) {
    const uint32_t r = it->second;
    ++it;  // erase(r) below removes the element just visited
    const Rec& a = recs_[r];
    if (a.end <= first || a.task == task) continue;
    const bool same_buffer = a.view.buffer().addr == view.buffer().addr;
    // The byte ranges intersect; through one buffer the per-dimension test
    // refines that, across sub-buffers of one allocation it is the answer.
    if ((write || a.write) && (!same_buffer || a.view.overlaps(view))) conflict(a.task);
    if (write && same_buffer && write_covers(view, a.view)) erase(r);
  }
  uint32_t r;
  if (!free_.empty()) {
    r = free_.back();
    free_.pop_back();
  } else {
    r = static_cast<uint32_t>(recs_.size());
    recs_.emplace_back();
  }
  Rec& rec = recs_[r];
  rec.alloc = alloc;
  rec.first = first;
  rec.end = end;
  rec.view = view;
  rec.task = task;
  rec.slot = slot;
  rec.write = write;
  rec.prev = 0;
  rec.next = task_head_[slot];
  if (rec.next != 0) recs_[rec.next - 1].prev = r + 1;
  task_head_[slot] = r + 1;
  rec.pos = al.by_first.emplace(first, r);
  al.max_span = std::max(al.max_span, end - first);
}

}  // namespace simpler::tmr
