// SharedHeap: the node's host memory shared with every child. It is mapped
// before any fork, so each child sees it at the same address; its first page
// holds the node bell (rung by every child and by submitters, parked on by
// the scheduler), the rest is handed out first-fit in 64-byte blocks.
// Thread-safe: the user thread allocates, the scheduler thread frees.
#pragma once

#include <cstdint>
#include <memory>

#include "base/doorbell.h"
#include "base/first_fit_allocator.h"
#include "base/host_range.h"
#include "base/shared_memory.h"

namespace simpler {

class SharedHeap {
 public:
  // Maps `bytes` of allocatable memory plus the header page.
  static Result<std::unique_ptr<SharedHeap>> create(uint64_t bytes);

  Doorbell& bell() const { return *static_cast<Doorbell*>(mapping_.data()); }
  // The allocatable range, as children check their arguments against it.
  HostRange range() const { return range_; }

  // A zeroed block of `bytes` (> 0); RESOURCE_EXHAUSTED when none fits.
  Result<uint64_t> alloc(uint64_t bytes);
  // A block whose first `bytes` the caller overwrites before anyone reads
  // them (a tensor received whole): only the block's tail past them is zeroed.
  Result<uint64_t> alloc_for_overwrite(uint64_t bytes);
  // Refuses an address that is not the start of a live block; never allocates.
  Status free(uint64_t addr) noexcept { return blocks_.free(addr); }
  // The size of the live block starting at addr, or 0.
  uint64_t block_size(uint64_t addr) const { return blocks_.block_size(addr); }
  // [addr, addr + bytes) lies inside one live block.
  bool within_live_block(uint64_t addr, uint64_t bytes) const { return blocks_.containing(addr, bytes).ok(); }
  uint64_t live_blocks() const { return blocks_.live_blocks(); }

 private:
  explicit SharedHeap(SharedMapping m);

  SharedMapping mapping_;
  HostRange range_;
  FirstFitAllocator blocks_;
};

}  // namespace simpler
