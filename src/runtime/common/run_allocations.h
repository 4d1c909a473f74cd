// RunAllocations: the device memory of one run-resource set's run: the
// intermediates it owns (made by alloc() or for an unbound output, with the
// scopes they were made in and who still uses them) and the caller
// allocations its tasks borrow. Every one is pinned in DeviceMemory while the
// run holds it, so a Worker::free of it is refused instead of letting the run
// write into memory handed out again. Sized at grant; the building thread
// fills it, AICPU threads release intermediates through their reference
// counts, and the thread that ends the run releases the rest.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "device/device.h"

namespace simpler {

// A run-owned device allocation.
struct Intermediate {
  uint64_t addr = 0;
  // Held by the enclosing scope (or the run) plus one per task using it; the
  // one who drops it to zero frees the memory.
  std::atomic<int32_t> refs{0};
};

class RunAllocations {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

  // Room for `capacity` intermediates per run.
  RunAllocations(DeviceMemory& memory, uint32_t capacity);

  // Forgets the previous run, whose memory is already released.
  void reset();

  // A new intermediate of `bytes`, held by the current scope (or the run).
  Result<uint32_t> create(const HostApi& api, uint64_t bytes);
  void scope_begin() { scopes_.emplace_back(); }
  // Drops the innermost scope's references: an intermediate no task uses is
  // freed at once, the others when their last user finishes.
  Status scope_end();
  // The intermediate whose allocation starts at `addr`, or kNone.
  uint32_t find(uint64_t addr) const;
  // One more task references intermediate `i` (before launch).
  void add_user(uint32_t i) { table_[i].refs.fetch_add(1, std::memory_order_relaxed); }
  // A task that referenced intermediate `i` ended; true when it was the last
  // holder and the memory went back. Any AICPU thread; never allocates.
  bool release_user(uint32_t i);
  // Frees every intermediate created after the first `count`: a refused
  // submit hands back what it allocated.
  void roll_back(uint32_t count);

  // The run's tasks use the caller allocation starting at `base`: pinned on
  // the first use in this run.
  Status borrow(uint64_t base);

  // Frees every intermediate still held and unpins every borrowed allocation
  // (the run ended, was discarded, or its build failed).
  void release_all();

  uint32_t count() const { return count_; }
  uint64_t addr(uint32_t i) const { return table_[i].addr; }

 private:
  void release(Intermediate& im);

  DeviceMemory& memory_;
  const uint32_t capacity_;
  std::unique_ptr<Intermediate[]> table_;
  uint32_t count_ = 0;
  std::unordered_map<uint64_t, uint32_t> index_of_;  // addr -> index
  std::vector<std::vector<uint32_t>> scopes_;
  std::vector<uint64_t> borrowed_;
  std::unordered_set<uint64_t> borrowed_set_;
};

}  // namespace simpler
