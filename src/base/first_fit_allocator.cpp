#include "base/first_fit_allocator.h"

#include <iterator>
#include <new>
#include <utility>

#include "base/errors.h"
#include "base/fault_hooks.h"

namespace simpler {

namespace {

uint64_t head_bytes(uint64_t base, uint64_t alignment) { return (alignment - base % alignment) % alignment; }

uint64_t usable_bytes(uint64_t base, uint64_t bytes, uint64_t alignment) {
  const uint64_t head = head_bytes(base, alignment);
  return bytes > head ? (bytes - head) & ~(alignment - 1) : 0;
}

}  // namespace

FirstFitAllocator::FirstFitAllocator(uint64_t base, uint64_t bytes, uint64_t alignment, std::string block)
    : alignment_(alignment),
      capacity_(usable_bytes(base, bytes, alignment)),
      block_(std::move(block)),
      free_total_(capacity_) {
  if (capacity_ != 0) free_.emplace(base + head_bytes(base, alignment), capacity_);
}

Result<uint64_t> FirstFitAllocator::allocate(uint64_t bytes) {
  if (bytes == 0) return invalid_argument("bytes = 0: a {} must have a size", block_);
  if (hooks::alloc_fault_hit(block_.c_str())) {
    return resource_exhausted("a {} of {} bytes failed: allocation fault injected (H2)", block_, bytes);
  }
  uint64_t free_total = 0;
  bool fragmented = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    free_total = free_total_;
    // Rounding a request larger than the capacity could wrap; none of those fits anyway.
    if (bytes <= capacity_) {
      const uint64_t want = (bytes + alignment_ - 1) & ~(alignment_ - 1);
      fragmented = want <= free_total_;
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->second < want) continue;
        const uint64_t addr = it->first;
        const uint64_t rest = it->second - want;
        // The only allocation comes first; after it, the free block is re-keyed
        // in place, so a std::bad_alloc can never lose a block.
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
    }
  }
  return resource_exhausted("bytes = {}: no room for a {} that large ({} of {} bytes free{})", bytes, block_,
                            free_total, capacity_, fragmented ? ", fragmented" : "");
}

Status FirstFitAllocator::free(uint64_t addr) noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(addr);
    if (it != live_.end()) {
      release(live_.extract(it));
      return Status();
    }
  }
  try {
    return invalid_argument("addr = {:#x} is not a live {}", addr, block_);
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kInvalidArgument, std::string());
  }
}

// The live node itself moves to the free list (or is dropped into a free
// neighbour), so freeing never allocates.
void FirstFitAllocator::release(Blocks::node_type node) noexcept {
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
      return;
    }
  }
  node.mapped() = size;
  free_.insert(std::move(node));
}

Result<FirstFitAllocator::Allocation> FirstFitAllocator::containing(uint64_t addr, uint64_t bytes) const {
  Allocation a{0, 0};
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.upper_bound(addr);
    if (it != live_.begin()) {
      --it;
      a = Allocation{it->first, it->second};
    }
  }
  // Offsets, not end addresses, so a range near the top of the address space cannot wrap.
  if (a.bytes == 0 || addr - a.addr > a.bytes) {
    return out_of_range("addr = {:#x} is not inside a live {}", addr, block_);
  }
  if (bytes > a.bytes - (addr - a.addr)) {
    return out_of_range("range [{:#x}, +{}) runs past its {} [{:#x}, +{})", addr, bytes, block_, a.addr, a.bytes);
  }
  return a;
}

uint64_t FirstFitAllocator::block_size(uint64_t addr) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(addr);
  return it == live_.end() ? 0 : it->second;
}

uint64_t FirstFitAllocator::free_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return free_total_;
}

uint64_t FirstFitAllocator::live_blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_.size();
}

}  // namespace simpler
