// FirstFitAllocator: the one first-fit allocator, over an address range it
// neither owns nor touches (GM, the node's shared heap); it owns only its
// bookkeeping, free and live blocks as addr -> size. Thread-safe: it locks
// itself, so any thread may call any member; free() never allocates or throws,
// so it may run in a noexcept commit or a device thread's completion path.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "simpler/status.h"

namespace simpler {

class FirstFitAllocator {
 public:
  struct Allocation {
    uint64_t addr;
    uint64_t bytes;
  };

  // Hands out whole `alignment`-sized (a power of two) blocks of
  // [base, base + bytes), so an unaligned head or a short tail is never used.
  // `block` is what the owner calls one allocation in its errors, e.g.
  // "device allocation": "addr = 0x... is not a live device allocation".
  FirstFitAllocator(uint64_t base, uint64_t bytes, uint64_t alignment, std::string block);
  FirstFitAllocator(const FirstFitAllocator&) = delete;
  FirstFitAllocator& operator=(const FirstFitAllocator&) = delete;

  // The lowest free block that fits, rounded up to the alignment; RESOURCE_EXHAUSTED
  // names the request and what is free. A std::bad_alloc leaves every block where it was.
  Result<uint64_t> allocate(uint64_t bytes);
  // INVALID_ARGUMENT when addr is not the start of a live block. Under host
  // memory exhaustion that refusal carries its code but no message.
  Status free(uint64_t addr) noexcept;
  // The live block that holds all of [addr, addr + bytes); OUT_OF_RANGE otherwise.
  Result<Allocation> containing(uint64_t addr, uint64_t bytes) const;
  // The size of the live block starting at addr, or 0.
  uint64_t block_size(uint64_t addr) const;
  uint64_t free_bytes() const;
  uint64_t live_blocks() const;

 private:
  using Blocks = std::map<uint64_t, uint64_t>;  // addr -> bytes

  void release(Blocks::node_type node) noexcept;

  const uint64_t alignment_;
  const uint64_t capacity_;
  const std::string block_;
  mutable std::mutex mu_;
  Blocks free_;  // coalesced: no two free blocks touch
  Blocks live_;
  uint64_t free_total_;
};

}  // namespace simpler
