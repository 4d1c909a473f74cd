#include "device/sim/global_memory.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <iterator>
#include <memory>

#include "base/errors.h"

namespace simpler {

Result<std::unique_ptr<GlobalMemory>> GlobalMemory::create(uint64_t bytes) {
  if (bytes < kAlignment || bytes > (uint64_t{1} << 44)) {
    return invalid_argument("device_memory_bytes = {} is outside [64, 2^44]", bytes);
  }
  // The total is reported exactly as configured; only whole 64-byte blocks of
  // it can be handed out.
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return resource_exhausted("device_memory_bytes = {}: mmap failed: {}", bytes, std::strerror(errno));
  }
  return std::unique_ptr<GlobalMemory>(new GlobalMemory(reinterpret_cast<uint64_t>(p), bytes));
}

GlobalMemory::GlobalMemory(uint64_t base, uint64_t bytes)
    : base_(base), bytes_(bytes), free_total_(bytes & ~(kAlignment - 1)) {
  free_.emplace(base_, free_total_);
}

GlobalMemory::~GlobalMemory() { munmap(reinterpret_cast<void*>(base_), bytes_); }

Result<uint64_t> GlobalMemory::allocate(uint64_t bytes) {
  if (bytes == 0) return invalid_argument("bytes = 0: an allocation must have a size");
  if (bytes > bytes_) return resource_exhausted("bytes = {} exceeds device memory of {} bytes", bytes, bytes_);
  const uint64_t want = (bytes + kAlignment - 1) & ~(kAlignment - 1);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < want) continue;
    const uint64_t addr = it->first;
    const uint64_t rest = it->second - want;
    // The only allocation comes first; after it, the free block is re-keyed in
    // place, so a std::bad_alloc can never lose a block.
    live_.emplace(addr, want);
    if (rest == 0) {
      free_.erase(it);
    } else {
      auto node = free_.extract(it);
      node.key() = addr + want;
      node.mapped() = rest;
      free_.insert(std::move(node));
    }
    free_total_ -= want;
    return addr;
  }
  return resource_exhausted("bytes = {}: no free device memory block that large ({} of {} bytes free, fragmented)",
                            bytes, free_total_, bytes_);
}

Status GlobalMemory::free(uint64_t addr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(addr);
  if (it == live_.end()) return invalid_argument("addr = {:#x} is not a live device allocation", addr);
  // The live node moves to the free list, so freeing never allocates and may
  // run where a throw is not allowed (a grant commit, a completion path).
  auto node = live_.extract(it);
  const uint64_t start = node.key();
  uint64_t size = node.mapped();
  free_total_ += size;
  auto next = free_.lower_bound(start);
  if (next != free_.end() && start + size == next->first) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      prev->second += size;
      return Status();
    }
  }
  node.mapped() = size;
  free_.insert(std::move(node));
  return Status();
}

Result<DeviceMemory::Allocation> GlobalMemory::containing_allocation(uint64_t addr, uint64_t bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.upper_bound(addr);
  if (it == live_.begin()) return out_of_range("addr = {:#x} is not inside a live device allocation", addr);
  --it;
  if (addr + bytes < addr || addr + bytes > it->first + it->second) {
    return out_of_range("range [{:#x}, +{}) runs past its allocation [{:#x}, +{})", addr, bytes, it->first, it->second);
  }
  return Allocation{it->first, it->second};
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

uint64_t GlobalMemory::allocation_size(uint64_t addr) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(addr);
  return it == live_.end() ? 0 : it->second;
}

uint64_t GlobalMemory::free_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return free_total_;
}

}  // namespace simpler
