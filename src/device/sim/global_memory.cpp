#include "device/sim/global_memory.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <new>

#include "base/errors.h"
#include "device/guard_bytes.h"

namespace simpler {

namespace {
constexpr uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }
}  // namespace

Result<std::unique_ptr<GlobalMemory>> GlobalMemory::create(uint64_t bytes, bool guarded) {
  if (bytes < kAlignment || bytes > (uint64_t{1} << 44)) {
    return invalid_argument("device_memory_bytes = {} is outside [64, 2^44]", bytes);
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return resource_exhausted("device_memory_bytes = {}: mmap failed: {}", bytes, std::strerror(errno));
  }
  return std::unique_ptr<GlobalMemory>(new GlobalMemory(reinterpret_cast<uint64_t>(p), bytes, guarded));
}

GlobalMemory::GlobalMemory(uint64_t base, uint64_t bytes, bool guarded)
    : base_(base), bytes_(bytes), guarded_(guarded), allocator_(base, bytes, kAlignment, "device allocation") {}

GlobalMemory::~GlobalMemory() { munmap(reinterpret_cast<void*>(base_), bytes_); }

Result<uint64_t> GlobalMemory::allocate(uint64_t bytes) {
  if (!guarded_) return allocator_.allocate(bytes);
  if (bytes == 0 || bytes > bytes_) return allocator_.allocate(bytes);  // the allocator's own refusal
  const uint64_t span = round_up(bytes, kAlignment) + 2 * kGuardBytes;
  auto block = allocator_.allocate(span);
  if (!block.ok()) {
    return Status(block.status().code(),
                  fmt::format("bytes = {} (+{} guard bytes): {}", bytes, span - bytes, block.status().message()));
  }
  const uint64_t addr = *block + kGuardBytes;
  try {
    std::lock_guard<std::mutex> lock(meta_mu_);
    requested_.emplace(addr, bytes);
  } catch (const std::bad_alloc&) {
    (void)allocator_.free(*block);
    return resource_exhausted("bytes = {}: host memory exhausted recording the allocation", bytes);
  }
  std::memset(reinterpret_cast<void*>(*block), kGuardPattern, kGuardBytes);
  std::memset(reinterpret_cast<void*>(addr + bytes), kGuardPattern, *block + span - (addr + bytes));
  return addr;
}

bool GlobalMemory::live(uint64_t addr) const {
  return guarded_ ? requested_.count(addr) != 0 : allocator_.block_size(addr) != 0;
}

Status GlobalMemory::free(uint64_t addr) {
  std::lock_guard<std::mutex> lock(meta_mu_);
  const auto pin = pins_.find(addr);
  if (pin != pins_.end() && pin->second != 0) {
    return failed_precondition("addr = {:#x} is in use by a live run; free it once the runs using it ended", addr);
  }
  if (guarded_) {
    auto it = requested_.find(addr);
    if (it == requested_.end()) return invalid_argument("addr = {:#x} is not a live device allocation", addr);
    requested_.erase(it);
    SIMPLER_RETURN_IF_ERROR(allocator_.free(addr - kGuardBytes));
  } else {
    SIMPLER_RETURN_IF_ERROR(allocator_.free(addr));
  }
  if (pin != pins_.end()) pins_.erase(pin);
  return Status();
}

Status GlobalMemory::pin(uint64_t addr) {
  std::lock_guard<std::mutex> lock(meta_mu_);
  if (!live(addr)) return invalid_argument("addr = {:#x} is not a live device allocation", addr);
  try {
    ++pins_[addr];
  } catch (const std::bad_alloc&) {
    return resource_exhausted("addr = {:#x}: host memory exhausted pinning it for a run", addr);
  }
  return Status();
}

void GlobalMemory::unpin(uint64_t addr) {
  std::lock_guard<std::mutex> lock(meta_mu_);
  auto it = pins_.find(addr);
  // The entry stays at zero until free(): the next run's pin of the same
  // allocation then allocates no host memory on its path.
  if (it != pins_.end() && it->second != 0) --it->second;
}

uint64_t GlobalMemory::allocation_size(uint64_t addr) const {
  if (!guarded_) return allocator_.block_size(addr);
  std::lock_guard<std::mutex> lock(meta_mu_);
  auto it = requested_.find(addr);
  return it == requested_.end() ? 0 : it->second;
}

Result<DeviceMemory::Allocation> GlobalMemory::containing_allocation(uint64_t addr, uint64_t bytes) const {
  SIMPLER_ASSIGN_OR_RETURN(const FirstFitAllocator::Allocation a, allocator_.containing(addr, bytes));
  if (!guarded_) return Allocation{a.addr, a.bytes};
  const uint64_t start = a.addr + kGuardBytes;
  const uint64_t size = allocation_size(start);
  if (addr < start || bytes > size || addr - start > size - bytes) {
    return out_of_range("range [{:#x}, +{}) is not inside the allocation [{:#x}, +{})", addr, bytes, start, size);
  }
  return Allocation{start, size};
}

DeviceMemory::GuardDamage GlobalMemory::check_guards(uint64_t addr, uint64_t bytes) {
  if (!guarded_) return GuardDamage{};
  return measure_and_restore_guards(addr, bytes, kGuardBytes, kAlignment, kGuardPattern);
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
