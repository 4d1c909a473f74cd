// Intermediates: what a run's builder and its fanin walk need of the device
// memory the run holds: the intermediates it owns (made by alloc() or for an
// unbound output, with the scopes they were made in and who still uses them)
// and the caller allocations its tasks borrow. RunAllocations gives each
// intermediate its own device allocation; a streaming runtime carves them
// from heap rings. The building thread creates and holds, AICPU threads
// release intermediates through their reference counts.
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

class Intermediates {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

  // The device memory a task argument lies in: the allocation (for an
  // intermediate, its own block) and the intermediate it is, or kNone.
  struct Held {
    DeviceMemory::Allocation allocation;
    uint32_t intermediate = kNone;
  };

  virtual ~Intermediates() = default;
  // A new intermediate of `bytes`, held by the current scope (or the run).
  virtual Result<uint32_t> create(const HostApi& api, uint64_t bytes) = 0;
  virtual void scope_begin() = 0;
  // Drops the innermost scope's references: an intermediate no task uses is
  // freed at once, the others when their last user finishes.
  virtual Status scope_end() = 0;
  // What holds [addr, addr + bytes): one of the run's intermediates, or a
  // caller allocation, which the run then borrows (pinned until it ends).
  virtual Result<Held> hold(uint64_t addr, uint64_t bytes) = 0;
  // One more task references intermediate `i`.
  virtual void add_user(uint32_t i) = 0;
  // A task that referenced intermediate `i` ended; true when it was the last
  // holder and the memory went back. Any AICPU thread; never allocates.
  virtual bool release_user(uint32_t i) = 0;
  // Frees intermediate `i`, the newest one, which no task uses yet: a
  // refused submit hands back what it allocated, newest first.
  virtual void discard(uint32_t i) = 0;
  virtual uint64_t addr(uint32_t i) const = 0;
};

// The caller allocations one run's tasks borrow: each pinned in DeviceMemory
// on its first use in the run and unpinned when the run ends, so a
// Worker::free of it is refused meanwhile. The building thread borrows; the
// thread that ends the run releases. The storage stays from run to run: a run
// that borrows at most kScanned allocations (most do) allocates no host memory
// for them, and finds one again by a scan; beyond that a hash set indexes them.
class BorrowedAllocations {
 public:
  static constexpr size_t kScanned = 16;

  // Pins the allocation starting at `base` unless this run holds it already.
  Status borrow(DeviceMemory& memory, uint64_t base);
  // Unpins every allocation the run borrowed and forgets them.
  void release(DeviceMemory& memory);
  // Forgets them without unpinning: the previous run released them.
  void clear();
  size_t size() const { return bases_.size(); }

 private:
  bool holds(uint64_t base) const;
  void forget_last();

  std::vector<uint64_t> bases_;
  // Every one of bases_ while there are more than kScanned, else empty.
  std::unordered_set<uint64_t> index_;
};

// Each intermediate is its own device allocation, and every one is pinned in
// DeviceMemory while the run holds it, so a Worker::free of it is refused
// instead of letting the run write into memory handed out again. Sized at
// grant; the thread that ends the run releases what is left.
class RunAllocations final : public Intermediates {
 public:
  // Room for `capacity` intermediates per run.
  RunAllocations(DeviceMemory& memory, uint32_t capacity);

  // Forgets the previous run, whose memory is already released.
  void reset();

  Result<uint32_t> create(const HostApi& api, uint64_t bytes) override;
  void scope_begin() override { scopes_.emplace_back(); }
  Status scope_end() override;
  Result<Held> hold(uint64_t addr, uint64_t bytes) override;
  void add_user(uint32_t i) override { table_[i].refs.fetch_add(1, std::memory_order_relaxed); }
  bool release_user(uint32_t i) override;
  void discard(uint32_t i) override;
  uint64_t addr(uint32_t i) const override { return table_[i].addr; }

  // Frees every intermediate still held and unpins every borrowed allocation
  // (the run ended, was discarded, or its build failed).
  void release_all();

 private:
  void release(Intermediate& im);

  DeviceMemory& memory_;
  const uint32_t capacity_;
  std::unique_ptr<Intermediate[]> table_;
  uint32_t count_ = 0;
  std::unordered_map<uint64_t, uint32_t> index_of_;  // addr -> index
  std::vector<std::vector<uint32_t>> scopes_;
  BorrowedAllocations borrowed_;
};

}  // namespace simpler
