// GlobalMemory: the simulated chip's global memory (GM), one reserved block of
// host address space committed on touch, handed out by the base first-fit
// allocator. Device addresses are host addresses inside the block, so kernels
// dereference them directly (host_mapped). Guarded, every allocation is
// surrounded by guard bytes that check_guards() reads, so a kernel writing
// out of bounds is caught as a real device would fault. Thread-safe: every
// call may come from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "base/first_fit_allocator.h"
#include "device/device.h"

namespace simpler {

class GlobalMemory final : public DeviceMemory {
 public:
  static constexpr uint64_t kAlignment = 64;
  // Guarded: this many guard bytes before every allocation; after it, from
  // its end to the next 64-byte boundary and this many more.
  static constexpr uint64_t kGuardBytes = 64;
  static constexpr uint8_t kGuardPattern = 0xA5;

  static Result<std::unique_ptr<GlobalMemory>> create(uint64_t bytes, bool guarded = false);
  ~GlobalMemory() override;
  GlobalMemory(const GlobalMemory&) = delete;
  GlobalMemory& operator=(const GlobalMemory&) = delete;

  // First fit, 64-byte aligned.
  Result<uint64_t> allocate(uint64_t bytes) override;
  Status free(uint64_t addr) override;
  Status pin(uint64_t addr) override;
  void unpin(uint64_t addr) override;
  // Guarded, allocations are exactly as large as asked for; otherwise whole
  // 64-byte blocks.
  Result<Allocation> containing_allocation(uint64_t addr, uint64_t bytes) const override;
  uint64_t allocation_size(uint64_t addr) const override;
  // Exactly as configured; only its whole 64-byte blocks can be handed out.
  uint64_t total_bytes() const override { return bytes_; }
  uint64_t free_bytes() const override { return allocator_.free_bytes(); }
  bool host_mapped() const override { return true; }
  bool guarded() const override { return guarded_; }
  GuardDamage check_guards(uint64_t addr, uint64_t bytes) override;
  Status copy_to_device(uint64_t dst, const void* src, uint64_t bytes) override;
  Status copy_from_device(void* dst, uint64_t src, uint64_t bytes) override;
  Status memset_device(uint64_t dst, int value, uint64_t bytes) override;

  uint64_t base() const { return base_; }

 private:
  GlobalMemory(uint64_t base, uint64_t bytes, bool guarded);
  // Whether `addr` starts a live allocation; meta_mu_ held.
  bool live(uint64_t addr) const;

  const uint64_t base_;
  const uint64_t bytes_;
  const bool guarded_;
  FirstFitAllocator allocator_;
  mutable std::mutex meta_mu_;
  // Allocation start -> live runs using it; kept at zero until the allocation is freed.
  std::unordered_map<uint64_t, uint32_t> pins_;
  std::unordered_map<uint64_t, uint64_t> requested_;  // guarded: allocation start -> bytes asked for
};

}  // namespace simpler
