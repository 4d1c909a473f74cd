#include "node/shared_heap.h"

#include <cstring>
#include <new>

#include "base/errors.h"
#include "base/leak.h"

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
      blocks_(range_.begin, range_.end - range_.begin, kBlock, "shared-heap block"),
      holds_(std::make_shared<Holds>()) {
  holds_->blocks = &blocks_;
  new (mapping_.data()) Doorbell();
}

SharedHeap::~SharedHeap() {
  std::lock_guard<std::mutex> lock(holds_->mu);
  holds_->blocks = nullptr;
  // A transfer may still write here after this heap is gone: the memory
  // stays mapped for the rest of the process.
  if (!holds_->by_block.empty()) abandon(new SharedMapping(std::move(mapping_)));
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

Status SharedHeap::free(uint64_t addr) noexcept {
  if (holds_->blocks_held.load(std::memory_order_acquire) == 0) return blocks_.free(addr);
  std::lock_guard<std::mutex> lock(holds_->mu);
  if (auto it = holds_->by_block.find(addr); it != holds_->by_block.end()) {
    if (it->second.freed) {
      try {
        return invalid_argument("addr = {:#x} is not a live shared-heap block", addr);
      } catch (const std::bad_alloc&) {
        return Status(StatusCode::kInvalidArgument, std::string());
      }
    }
    it->second.freed = true;
    return Status();
  }
  return blocks_.free(addr);
}

bool SharedHeap::within_live_block(uint64_t addr, uint64_t bytes) const {
  if (holds_->blocks_held.load(std::memory_order_acquire) == 0) return blocks_.containing(addr, bytes).ok();
  std::lock_guard<std::mutex> lock(holds_->mu);
  auto block = blocks_.containing(addr, bytes);
  if (!block.ok()) return false;
  auto it = holds_->by_block.find(block->addr);
  return it == holds_->by_block.end() || !it->second.freed;
}

bool SharedHeap::write_held(uint64_t addr) const {
  if (holds_->blocks_held.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard<std::mutex> lock(holds_->mu);
  auto block = blocks_.containing(addr, 1);
  if (!block.ok()) return false;
  auto it = holds_->by_block.find(block->addr);
  return it != holds_->by_block.end() && it->second.writes != 0;
}

uint64_t SharedHeap::held_blocks() const {
  std::lock_guard<std::mutex> lock(holds_->mu);
  return holds_->by_block.size();
}

std::shared_ptr<void> SharedHeap::hold(uint64_t addr, HoldKind kind) {
  std::lock_guard<std::mutex> lock(holds_->mu);
  auto block = blocks_.containing(addr, 1);
  if (!block.ok()) return nullptr;
  Holds::Held& h = holds_->by_block[block->addr];
  holds_->blocks_held.store(holds_->by_block.size(), std::memory_order_release);
  ++(kind == HoldKind::kWrite ? h.writes : h.reads);
  return std::shared_ptr<void>(reinterpret_cast<void*>(block->addr), [holds = holds_, kind](void* p) {
    holds->release(reinterpret_cast<uint64_t>(p), kind);
  });
}

void SharedHeap::Holds::release(uint64_t block, HoldKind kind) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = by_block.find(block);
  if (it == by_block.end()) return;
  --(kind == HoldKind::kWrite ? it->second.writes : it->second.reads);
  if (it->second.reads != 0 || it->second.writes != 0) return;
  if (it->second.freed && blocks != nullptr) (void)blocks->free(block);
  by_block.erase(it);
  blocks_held.store(by_block.size(), std::memory_order_release);
}

}  // namespace simpler
