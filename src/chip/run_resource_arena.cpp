#include "chip/run_resource_arena.h"

#include "base/errors.h"
#include "base/fault_hooks.h"
#include "chip/pipeline_contract.h"

namespace simpler {

Result<RunResourceArena> RunResourceArena::create(uint32_t grant) {
  SIMPLER_RETURN_IF_ERROR(is_valid_pipeline_contract(PipelineContract{grant, 0}));
  return RunResourceArena(grant);
}

RunResourceArena::RunResourceArena(uint32_t grant) : sets_(grant) { counts_.free = grant; }

RunResourceArena::RunResourceArena(RunResourceArena&& other) noexcept {
  std::lock_guard<std::mutex> lock(other.mu_);
  sets_ = std::move(other.sets_);
  counts_ = other.counts_;
  other.counts_ = ArenaCounts{};
}

RunResourceArena& RunResourceArena::operator=(RunResourceArena&& other) noexcept {
  if (this == &other) return *this;
  std::scoped_lock lock(mu_, other.mu_);
  sets_ = std::move(other.sets_);
  counts_ = other.counts_;
  other.counts_ = ArenaCounts{};
  return *this;
}

std::optional<Lease> RunResourceArena::try_acquire() {
  std::lock_guard<std::mutex> lock(mu_);
  if (counts_.free == 0) return std::nullopt;
  // H2: as if every set were taken.
  if (hooks::alloc_fault_hit("run-resource set")) return std::nullopt;
  for (uint32_t i = 0; i < sets_.size(); ++i) {
    Set& s = sets_[i];
    if (s.state != SetState::Free) continue;
    if (s.generation == kLastGeneration) {
      // Its generations are spent: retired like a quarantined set, so it
      // still counts against the grant and is never reissued.
      s.state = SetState::Quarantined;
      --counts_.free;
      ++counts_.quarantined;
      continue;
    }
    s.state = SetState::Live;
    ++s.generation;
    --counts_.free;
    ++counts_.live;
    return Lease{i, s.generation};
  }
  return std::nullopt;
}

bool RunResourceArena::owns(const Lease& lease) const {
  std::lock_guard<std::mutex> lock(mu_);
  return lease.generation != 0 && lease.slot < sets_.size() && sets_[lease.slot].state == SetState::Live &&
         sets_[lease.slot].generation == lease.generation;
}

bool RunResourceArena::release(const Lease& lease) {
  std::lock_guard<std::mutex> lock(mu_);
  if (lease.generation == 0 || lease.slot >= sets_.size()) return false;
  Set& s = sets_[lease.slot];
  if (s.generation != lease.generation) return false;
  if (s.state == SetState::Free) return true;
  if (s.state == SetState::Quarantined) return false;
  s.state = SetState::Free;
  --counts_.live;
  ++counts_.free;
  return true;
}

bool RunResourceArena::quarantine(const Lease& lease) {
  std::lock_guard<std::mutex> lock(mu_);
  if (lease.generation == 0 || lease.slot >= sets_.size()) return false;
  Set& s = sets_[lease.slot];
  if (s.generation != lease.generation || s.state != SetState::Live) return false;
  s.state = SetState::Quarantined;
  --counts_.live;
  ++counts_.quarantined;
  return true;
}

void RunResourceArena::set_generation_for_test(uint32_t slot, uint64_t generation) {
  std::lock_guard<std::mutex> lock(mu_);
  sets_[slot].generation = generation;
}

uint32_t RunResourceArena::grant() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<uint32_t>(sets_.size());
}

ArenaCounts RunResourceArena::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

}  // namespace simpler
