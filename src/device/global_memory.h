// GlobalMemory: the simulated chip's global memory (GM), one reserved block of
// host address space committed on touch, and its allocator. Device addresses
// are host addresses inside the block, so kernels dereference them directly.
// Thread-safe: allocate/free/lookups may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "simpler/status.h"

namespace simpler {

class GlobalMemory {
 public:
  static constexpr uint64_t kAlignment = 64;

  static Result<std::unique_ptr<GlobalMemory>> create(uint64_t bytes);
  ~GlobalMemory();
  GlobalMemory(const GlobalMemory&) = delete;
  GlobalMemory& operator=(const GlobalMemory&) = delete;

  // First fit, 64-byte aligned; RESOURCE_EXHAUSTED names the request and what is free.
  Result<uint64_t> allocate(uint64_t bytes);
  // Refuses an address that is not the start of a live allocation.
  Status free(uint64_t addr);
  // [addr, addr + bytes) lies inside one live allocation.
  Status check_range(uint64_t addr, uint64_t bytes) const;
  struct Allocation {
    uint64_t addr;
    uint64_t bytes;
  };
  // The live allocation that holds all of [addr, addr + bytes).
  Result<Allocation> containing_allocation(uint64_t addr, uint64_t bytes) const;
  // Size of the live allocation starting at addr, or 0.
  uint64_t allocation_size(uint64_t addr) const;

  uint64_t total_bytes() const { return bytes_; }
  uint64_t free_bytes() const;
  uint64_t base() const { return base_; }

 private:
  GlobalMemory(uint64_t base, uint64_t bytes);

  const uint64_t base_;
  const uint64_t bytes_;
  mutable std::mutex mu_;
  std::map<uint64_t, uint64_t> free_;  // addr -> size, coalesced
  std::map<uint64_t, uint64_t> live_;  // addr -> size
  uint64_t free_total_;
};

}  // namespace simpler
