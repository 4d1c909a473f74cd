// SharedHeap: the node's host memory shared with every child. It is mapped
// before any fork, so each child sees it at the same address; its first page
// holds the node bell (rung by every child and by submitters, parked on by
// the scheduler), the rest is handed out first-fit in 64-byte blocks. A
// block may be held (hold()) while MPI may still touch it; its free then
// waits for the last hold. Thread-safe: the user thread allocates, the
// scheduler thread frees, any thread holds.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "base/doorbell.h"
#include "base/first_fit_allocator.h"
#include "base/host_range.h"
#include "base/shared_memory.h"

namespace simpler {

class SharedHeap {
 public:
  // What may still touch a held block: a transfer writing into it (a receive
  // MPI could not cancel), or only reading it (a send).
  enum class HoldKind : uint8_t { kRead, kWrite };

  // Maps `bytes` of allocatable memory plus the header page.
  static Result<std::unique_ptr<SharedHeap>> create(uint64_t bytes);
  // Leaves the memory mapped while any hold remains.
  ~SharedHeap();
  SharedHeap(const SharedHeap&) = delete;
  SharedHeap& operator=(const SharedHeap&) = delete;

  Doorbell& bell() const { return *static_cast<Doorbell*>(mapping_.data()); }
  // The allocatable range, as children check their arguments against it.
  HostRange range() const { return range_; }

  // A zeroed block of `bytes` (> 0); RESOURCE_EXHAUSTED when none fits.
  Result<uint64_t> alloc(uint64_t bytes);
  // A block whose first `bytes` the caller overwrites before anyone reads
  // them (a tensor received whole): only the block's tail past them is zeroed.
  Result<uint64_t> alloc_for_overwrite(uint64_t bytes);
  // Refuses an address that is not the start of a live block; never
  // allocates. A held block is only marked: it returns to the allocator when
  // its last hold ends, and is no longer live to within_live_block.
  Status free(uint64_t addr) noexcept;
  // The size of the live block starting at addr, or 0.
  uint64_t block_size(uint64_t addr) const { return blocks_.block_size(addr); }
  // [addr, addr + bytes) lies inside one live block.
  bool within_live_block(uint64_t addr, uint64_t bytes) const;
  uint64_t live_blocks() const { return blocks_.live_blocks(); }

  // Keeps the live block holding `addr` from reuse while a transfer this
  // process no longer controls (MPI's, after its peer fell silent) may
  // still touch it, until the returned hold is dropped (any thread, also
  // after the heap is gone). null when `addr` is in no live block. The
  // caller keeps the block from being freed while it takes the hold (a run
  // still borrows it).
  std::shared_ptr<void> hold(uint64_t addr, HoldKind kind);
  // The live block holding `addr` has a write hold: bytes may still land in
  // it, so new work must not use it.
  bool write_held(uint64_t addr) const;
  // Blocks with a hold, freed ones included.
  uint64_t held_blocks() const;

 private:
  // Shared with every hold, which may outlive the heap: blocks is cleared
  // when the heap goes.
  struct Holds {
    struct Held {
      uint32_t reads = 0;
      uint32_t writes = 0;
      bool freed = false;  // free() came while held
    };
    mutable std::mutex mu;
    std::map<uint64_t, Held> by_block;
    std::atomic<size_t> blocks_held{0};  // by_block.size(), so the checks of a heap without holds take no lock
    FirstFitAllocator* blocks = nullptr;
    void release(uint64_t block, HoldKind kind);
  };

  explicit SharedHeap(SharedMapping m);

  SharedMapping mapping_;
  HostRange range_;
  FirstFitAllocator blocks_;
  std::shared_ptr<Holds> holds_;
};

}  // namespace simpler
