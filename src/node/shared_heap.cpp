#include "node/shared_heap.h"

#include <cstring>
#include <new>

#include "base/errors.h"

namespace simpler {

namespace {
constexpr uint64_t kHeaderBytes = 4096;
constexpr uint64_t kBlock = 64;

HostRange allocatable(const SharedMapping& m) {
  const auto base = reinterpret_cast<uint64_t>(m.data());
  return HostRange{base + kHeaderBytes, base + m.size()};
}
}  // namespace

SharedHeap::SharedHeap(SharedMapping m)
    : mapping_(std::move(m)),
      range_(allocatable(mapping_)),
      blocks_(range_.begin, range_.end - range_.begin, kBlock, "shared-heap block") {
  new (mapping_.data()) Doorbell();
}

Result<std::unique_ptr<SharedHeap>> SharedHeap::create(uint64_t bytes) {
  if (bytes == 0) return invalid_argument("shared_heap_bytes = 0: a node needs a shared heap");
  if (bytes > (1ull << 46)) return invalid_argument("shared_heap_bytes = {} exceeds 64 TiB", bytes);
  SIMPLER_ASSIGN_OR_RETURN(SharedMapping m, SharedMapping::create_anonymous(kHeaderBytes + bytes));
  return std::unique_ptr<SharedHeap>(new SharedHeap(std::move(m)));
}

Result<uint64_t> SharedHeap::alloc(uint64_t bytes) {
  SIMPLER_ASSIGN_OR_RETURN(const uint64_t addr, blocks_.allocate(bytes));
  // The whole block, not just `bytes`: copies are checked against the block.
  std::memset(reinterpret_cast<void*>(addr), 0, blocks_.block_size(addr));
  return addr;
}

Result<uint64_t> SharedHeap::alloc_for_overwrite(uint64_t bytes) {
  SIMPLER_ASSIGN_OR_RETURN(const uint64_t addr, blocks_.allocate(bytes));
  std::memset(reinterpret_cast<void*>(addr + bytes), 0, blocks_.block_size(addr) - bytes);
  return addr;
}

}  // namespace simpler
