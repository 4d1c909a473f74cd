#include "device/sim/global_memory.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "base/errors.h"

namespace simpler {

Result<std::unique_ptr<GlobalMemory>> GlobalMemory::create(uint64_t bytes) {
  if (bytes < kAlignment || bytes > (uint64_t{1} << 44)) {
    return invalid_argument("device_memory_bytes = {} is outside [64, 2^44]", bytes);
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return resource_exhausted("device_memory_bytes = {}: mmap failed: {}", bytes, std::strerror(errno));
  }
  return std::unique_ptr<GlobalMemory>(new GlobalMemory(reinterpret_cast<uint64_t>(p), bytes));
}

GlobalMemory::GlobalMemory(uint64_t base, uint64_t bytes)
    : base_(base), bytes_(bytes), allocator_(base, bytes, kAlignment, "device allocation") {}

GlobalMemory::~GlobalMemory() { munmap(reinterpret_cast<void*>(base_), bytes_); }

Result<DeviceMemory::Allocation> GlobalMemory::containing_allocation(uint64_t addr, uint64_t bytes) const {
  SIMPLER_ASSIGN_OR_RETURN(const FirstFitAllocator::Allocation a, allocator_.containing(addr, bytes));
  return Allocation{a.addr, a.bytes};
}

Status GlobalMemory::copy_to_device(uint64_t dst, const void* src, uint64_t bytes) {
  if (src == nullptr && bytes != 0) return invalid_argument("copy to device: src is null");
  SIMPLER_RETURN_IF_ERROR(check_range(dst, bytes));
  std::memcpy(reinterpret_cast<void*>(dst), src, bytes);
  return Status();
}

Status GlobalMemory::copy_from_device(void* dst, uint64_t src, uint64_t bytes) {
  if (dst == nullptr && bytes != 0) return invalid_argument("copy from device: dst is null");
  SIMPLER_RETURN_IF_ERROR(check_range(src, bytes));
  std::memcpy(dst, reinterpret_cast<const void*>(src), bytes);
  return Status();
}

Status GlobalMemory::memset_device(uint64_t dst, int value, uint64_t bytes) {
  SIMPLER_RETURN_IF_ERROR(check_range(dst, bytes));
  std::memset(reinterpret_cast<void*>(dst), value, bytes);
  return Status();
}

}  // namespace simpler
