#include "node/shared_heap.h"

#include <cstring>
#include <new>

#include "base/errors.h"

namespace simpler {

namespace {
constexpr uint64_t kHeaderBytes = 4096;
constexpr uint64_t kBlock = 64;
}  // namespace

SharedHeap::SharedHeap(SharedMapping m) : mapping_(std::move(m)) {
  const auto base = reinterpret_cast<uint64_t>(mapping_.data());
  range_ = HostRange{base + kHeaderBytes, base + mapping_.size()};
  new (mapping_.data()) Doorbell();
  free_[range_.begin] = range_.end - range_.begin;
}

Result<std::unique_ptr<SharedHeap>> SharedHeap::create(uint64_t bytes) {
  if (bytes == 0) return invalid_argument("shared_heap_bytes = 0: a node needs a shared heap");
  if (bytes > (1ull << 46)) return invalid_argument("shared_heap_bytes = {} exceeds 64 TiB", bytes);
  auto m = SharedMapping::create_anonymous(kHeaderBytes + bytes);
  if (!m.ok()) return m.status();
  return std::unique_ptr<SharedHeap>(new SharedHeap(std::move(m).value()));
}

Result<uint64_t> SharedHeap::alloc(uint64_t bytes) {
  if (bytes == 0) return invalid_argument("bytes = 0: nothing to allocate");
  if (bytes > range_.end - range_.begin) return resource_exhausted("bytes = {} exceeds the shared heap", bytes);
  const uint64_t need = (bytes + kBlock - 1) / kBlock * kBlock;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const uint64_t addr = it->first;
    const uint64_t rest = it->second - need;
    live_.emplace(addr, need);
    free_.erase(it);
    if (rest != 0) free_.emplace(addr + need, rest);
    std::memset(reinterpret_cast<void*>(addr), 0, need);
    return addr;
  }
  return resource_exhausted("bytes = {}: no free shared-heap block that large", bytes);
}

Status SharedHeap::free(uint64_t addr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(addr);
  if (it == live_.end()) return not_found("{:#x} is not a live shared-heap block", addr);
  uint64_t start = it->first, bytes = it->second;
  live_.erase(it);
  auto next = free_.lower_bound(start);
  if (next != free_.end() && start + bytes == next->first) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      bytes += prev->second;
      free_.erase(prev);
    }
  }
  free_.emplace(start, bytes);
  return Status();
}

uint64_t SharedHeap::block_size(uint64_t addr) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(addr);
  return it == live_.end() ? 0 : it->second;
}

bool SharedHeap::within_live_block(uint64_t addr, uint64_t bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.upper_bound(addr);
  if (it == live_.begin()) return false;
  --it;
  return addr >= it->first && bytes <= it->second - (addr - it->first);
}

uint64_t SharedHeap::live_blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_.size();
}

}  // namespace simpler
