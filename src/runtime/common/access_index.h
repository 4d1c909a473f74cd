// AccessIndex: where earlier tasks of the run being built read and wrote, for
// dependency analysis. Accesses are hashed by (allocation, granule of bytes),
// so finding the overlapping ones costs a bucket or two instead of a walk down
// a tree, and clearing for the next run is O(1) (buckets are epoch-tagged).
// Used only by the thread building a run; sized once per run-resource set.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "runtime/common/task_graph.h"
#include "simpler/tensor.h"

namespace simpler {

// The bucket of granule `granule` of the allocation keyed `alloc_key` in a
// table of mask + 1 buckets. Neighbouring granules of one allocation land in
// neighbouring buckets: a graph that walks a buffer row by row touches the
// table in order, so a million-task run's lookups stay in cache as a
// ten-thousand-task run's do (a hash of the granule scattered them over the
// whole table). Shared by every runtime's dependency index.
inline size_t granule_bucket(uint64_t alloc_key, uint64_t granule, uint64_t mask) {
  uint64_t h = alloc_key * 0x9e3779b97f4a7c15ull;
  h ^= h >> 31;
  return static_cast<size_t>((h + granule) & mask);
}

class AccessIndex {
 public:
  // `expected_accesses` sizes the bucket table (the set's descriptor capacity).
  explicit AccessIndex(size_t expected_accesses);

  // Forgets every access, keeping the storage.
  void clear();

  // Records task `task`'s access to bytes [first, end) of allocation `alloc`
  // through `view`. Before that, calls conflict(earlier_task) for each earlier
  // access it must follow (they overlap and one of the two writes), and, for a
  // write, forgets the earlier accesses it covers: every later conflict with
  // those is also a conflict with this write, which is ordered after them.
  template <typename Conflict>
  void add(uint64_t alloc, const TensorView& view, uint64_t first, uint64_t end, uint32_t task, bool write,
           Conflict&& conflict);

  size_t live_records() const;

 private:
  struct Rec {
    // Built in place by emplace_back: a temporary would copy the view twice.
    Rec(uint64_t in_alloc, uint64_t first_byte, uint64_t end_byte, const TensorView& v, uint32_t by_task, uint32_t add,
        bool writes)
        : alloc(in_alloc), first(first_byte), end(end_byte), view(v), task(by_task), seen(add), write(writes) {}
    uint64_t alloc;
    uint64_t first;
    uint64_t end;
    TensorView view;
    uint32_t task;
    uint32_t seen;  // the add() that last visited it, so a record in two buckets is met once
    bool write;
    bool dead = false;
  };
  struct Link {
    uint32_t rec;
    uint32_t next;  // link index + 1; 0 ends the chain
  };
  struct Alloc {
    uint32_t shift;               // granule = 2^shift bytes, from the first access's span
    std::vector<uint32_t> large;  // records spanning too many granules to hash
    std::vector<uint32_t> all;    // every record, for a query that spans too many granules
  };
  static constexpr uint64_t kMaxGranules = 16;

  size_t bucket(uint64_t alloc, uint64_t granule) const;
  uint32_t head(size_t b) const;
  void set_head(size_t b, uint32_t link);
  // Visits one record; true when it is dead afterwards.
  template <typename Conflict>
  bool visit(uint32_t r, uint64_t alloc, const TensorView& view, uint64_t first, uint64_t end, bool write,
             Conflict& conflict);

  std::vector<Rec> recs_;
  std::vector<Link> links_;
  std::vector<uint64_t> heads_;  // epoch << 32 | (link + 1)
  uint64_t mask_;
  uint32_t epoch_ = 1;
  uint32_t adds_ = 0;
  std::unordered_map<uint64_t, Alloc> allocs_;
};

template <typename Conflict>
bool AccessIndex::visit(uint32_t r, uint64_t alloc, const TensorView& view, uint64_t first, uint64_t end, bool write,
                        Conflict& conflict) {
  Rec& a = recs_[r];
  if (a.dead) return true;
  // A bucket chains granules of every allocation whose hash lands there, and
  // offsets are per allocation: another allocation's record never overlaps.
  if (a.alloc != alloc) return false;
  if (a.seen == adds_) return false;
  a.seen = adds_;
  if (a.end <= first || a.first >= end) return false;
  const bool same_buffer = a.view.buffer().addr == view.buffer().addr;
  // The byte ranges intersect; through one buffer the per-dimension test
  // refines that, across sub-buffers of one allocation it is the answer.
  if ((write || a.write) && (!same_buffer || a.view.overlaps(view))) conflict(a.task);
  if (write && same_buffer && write_covers(view, a.view)) a.dead = true;
  return a.dead;
}

template <typename Conflict>
void AccessIndex::add(uint64_t alloc, const TensorView& view, uint64_t first, uint64_t end, uint32_t task, bool write,
                      Conflict&& conflict) {
  ++adds_;
  auto [it, fresh] = allocs_.try_emplace(alloc);
  Alloc& al = it->second;
  if (fresh) {
    uint32_t shift = 6;
    while (shift < 62 && (uint64_t{1} << shift) < end - first) ++shift;
    al.shift = shift;
  }
  const uint64_t g0 = first >> al.shift;
  const uint64_t g1 = (end - 1) >> al.shift;
  const bool hashed = g1 - g0 < kMaxGranules;
  auto sweep = [&](std::vector<uint32_t>& list) {
    size_t keep = 0;
    for (uint32_t r : list) {
      if (!visit(r, alloc, view, first, end, write, conflict)) list[keep++] = r;
    }
    list.resize(keep);
  };
  if (hashed) {
    for (uint64_t g = g0; g <= g1; ++g) {
      const size_t b = bucket(alloc, g);
      uint32_t prev = 0;
      for (uint32_t cur = head(b); cur != 0;) {
        const Link l = links_[cur - 1];
        if (visit(l.rec, alloc, view, first, end, write, conflict)) {
          if (prev == 0)
            set_head(b, l.next);
          else
            links_[prev - 1].next = l.next;
        } else {
          prev = cur;
        }
        cur = l.next;
      }
    }
    sweep(al.large);
  } else {
    sweep(al.all);
  }
  const auto r = static_cast<uint32_t>(recs_.size());
  recs_.emplace_back(alloc, first, end, view, task, adds_, write);
  al.all.push_back(r);
  if (!hashed) {
    al.large.push_back(r);
    return;
  }
  for (uint64_t g = g0; g <= g1; ++g) {
    const size_t b = bucket(alloc, g);
    links_.push_back(Link{r, head(b)});
    set_head(b, static_cast<uint32_t>(links_.size()));
  }
}

}  // namespace simpler
