#include "runtime/common/run_allocations.h"

#include <algorithm>

#include "base/errors.h"

namespace simpler {

bool BorrowedAllocations::holds(uint64_t base) const {
  if (bases_.size() > kScanned) return index_.count(base) != 0;
  return std::find(bases_.begin(), bases_.end(), base) != bases_.end();
}

void BorrowedAllocations::forget_last() {
  const uint64_t base = bases_.back();
  bases_.pop_back();
  // The mirror of borrow(): the index goes with the entry that made it.
  if (bases_.size() == kScanned) {
    index_.clear();
  } else if (bases_.size() > kScanned) {
    index_.erase(base);
  }
}

Status BorrowedAllocations::borrow(DeviceMemory& memory, uint64_t base) {
  if (holds(base)) return Status();
  // Recorded before it is pinned, so a throw here leaves no pin behind.
  bases_.push_back(base);
  try {
    if (bases_.size() == kScanned + 1) {
      index_.insert(bases_.begin(), bases_.end());
    } else if (bases_.size() > kScanned + 1) {
      index_.insert(base);
    }
  } catch (...) {
    forget_last();
    throw;
  }
  if (Status st = memory.pin(base); !st.ok()) {
    forget_last();
    return st;
  }
  return Status();
}

void BorrowedAllocations::release(DeviceMemory& memory) {
  for (uint64_t base : bases_) memory.unpin(base);
  clear();
}

void BorrowedAllocations::clear() {
  bases_.clear();
  // clear() zeroes every bucket, however few entries: a run that once
  // borrowed many would make every later run pay for its table.
  if (!index_.empty()) index_.clear();
}

RunAllocations::RunAllocations(DeviceMemory& memory, uint32_t capacity)
    : memory_(memory), capacity_(capacity), table_(new Intermediate[capacity]) {}

void RunAllocations::reset() {
  count_ = 0;
  index_of_.clear();
  scopes_.clear();
  borrowed_.clear();
}

Result<uint32_t> RunAllocations::create(const HostApi& api, uint64_t bytes) {
  if (count_ >= capacity_) {
    return resource_exhausted("run allocates more than {} intermediate tensors (2 x max_tasks_per_run)", capacity_);
  }
  SIMPLER_ASSIGN_OR_RETURN(const uint64_t addr, api.device_malloc(bytes), "intermediate tensor");
  // Registered before anything that can fail or throw, so every exit of the
  // build (a refusal, std::bad_alloc) finds it and gives it back.
  const uint32_t i = count_++;
  table_[i].addr = addr;
  table_[i].refs.store(1, std::memory_order_relaxed);  // the scope's (or the run's) reference
  if (!scopes_.empty()) scopes_.back().push_back(i);
  SIMPLER_RETURN_IF_ERROR(memory_.pin(addr), "intermediate tensor");
  index_of_[addr] = i;
  return i;
}

void RunAllocations::release(Intermediate& im) {
  memory_.unpin(im.addr);
  (void)memory_.free(im.addr);
  im.addr = 0;
}

Status RunAllocations::scope_end() {
  if (scopes_.empty()) return failed_precondition("scope_end without a matching scope_begin");
  for (uint32_t i : scopes_.back()) {
    Intermediate& im = table_[i];
    // Not launched yet, so no AICPU thread can race this; a zero here means no
    // task ever used the tensor and it can go back at once.
    if (im.refs.fetch_sub(1, std::memory_order_relaxed) == 1) {
      index_of_.erase(im.addr);
      release(im);
    }
  }
  scopes_.pop_back();
  return Status();
}

Result<Intermediates::Held> RunAllocations::hold(uint64_t addr, uint64_t bytes) {
  Held held;
  SIMPLER_ASSIGN_OR_RETURN(held.allocation, memory_.containing_allocation(addr, bytes));
  if (auto it = index_of_.find(held.allocation.addr); it != index_of_.end()) {
    held.intermediate = it->second;
  } else {
    SIMPLER_RETURN_IF_ERROR(borrowed_.borrow(memory_, held.allocation.addr));
  }
  return held;
}

bool RunAllocations::release_user(uint32_t i) {
  Intermediate& im = table_[i];
  if (im.refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return false;
  release(im);
  return true;
}

void RunAllocations::discard(uint32_t i) {
  index_of_.erase(table_[i].addr);
  release(table_[i]);
  if (!scopes_.empty()) scopes_.back().pop_back();
  count_ = i;
}

void RunAllocations::release_all() {
  for (uint32_t i = 0; i < count_; ++i) {
    if (table_[i].addr != 0) release(table_[i]);
  }
  count_ = 0;
  borrowed_.release(memory_);
}

}  // namespace simpler
