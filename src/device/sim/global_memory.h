// GlobalMemory: the simulated chip's global memory (GM), one reserved block of
// host address space committed on touch, handed out by the base first-fit
// allocator. Device addresses are host addresses inside the block, so kernels
// dereference them directly (host_mapped). Thread-safe: every call may come
// from any thread.
#pragma once

#include <cstdint>
#include <memory>

#include "base/first_fit_allocator.h"
#include "device/device.h"

namespace simpler {

class GlobalMemory final : public DeviceMemory {
 public:
  static constexpr uint64_t kAlignment = 64;

  static Result<std::unique_ptr<GlobalMemory>> create(uint64_t bytes);
  ~GlobalMemory() override;
  GlobalMemory(const GlobalMemory&) = delete;
  GlobalMemory& operator=(const GlobalMemory&) = delete;

  // First fit, 64-byte aligned.
  Result<uint64_t> allocate(uint64_t bytes) override { return allocator_.allocate(bytes); }
  Status free(uint64_t addr) noexcept override { return allocator_.free(addr); }
  Result<Allocation> containing_allocation(uint64_t addr, uint64_t bytes) const override;
  uint64_t allocation_size(uint64_t addr) const override { return allocator_.block_size(addr); }
  // Exactly as configured; only its whole 64-byte blocks can be handed out.
  uint64_t total_bytes() const override { return bytes_; }
  uint64_t free_bytes() const override { return allocator_.free_bytes(); }
  bool host_mapped() const override { return true; }
  Status copy_to_device(uint64_t dst, const void* src, uint64_t bytes) override;
  Status copy_from_device(void* dst, uint64_t src, uint64_t bytes) override;
  Status memset_device(uint64_t dst, int value, uint64_t bytes) override;

  uint64_t base() const { return base_; }

 private:
  GlobalMemory(uint64_t base, uint64_t bytes);

  const uint64_t base_;
  const uint64_t bytes_;
  FirstFitAllocator allocator_;
};

}  // namespace simpler
