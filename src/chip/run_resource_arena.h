// RunResourceArena: which run-resource sets exist and who holds each. The grant
// G (pipeline_depth) is partitioned at every instant into free + live +
// quarantined sets. Acquire hands out leases {slot, generation}; a lease is
// honoured only while its generation is the slot's current one. Thread-safe:
// submitters acquire, completion threads release, any thread may read counts.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "simpler/status.h"

namespace simpler {

struct Lease {
  uint32_t slot = 0;
  uint64_t generation = 0;  // 0 is never issued
  friend bool operator==(const Lease& a, const Lease& b) { return a.slot == b.slot && a.generation == b.generation; }
};

struct ArenaCounts {
  uint32_t free = 0;
  uint32_t live = 0;
  uint32_t quarantined = 0;
};

class RunResourceArena {
 public:
  // A slot whose generation reached this is never issued again (R22): wrapping
  // would hand out 0, or a generation an old lease still carries.
  static constexpr uint64_t kLastGeneration = UINT64_MAX;

  // Refuses what the pipeline contract refuses (a grant of 0), naming pipeline_depth.
  static Result<RunResourceArena> create(uint32_t grant);

  // The lowest free slot with a fresh generation, or nothing when every set is
  // live or quarantined.
  std::optional<Lease> try_acquire();
  // True only for the current holder of a live set.
  bool owns(const Lease& lease) const;
  // Returns a live set. A stale generation is refused (false); releasing the
  // current generation again is idempotent (true, nothing changes).
  bool release(const Lease& lease);
  // Retires a live set for the arena's life: it is never handed out again and
  // still counts against the grant, so a failure cannot buy concurrency.
  bool quarantine(const Lease& lease);

  uint32_t grant() const;
  ArenaCounts counts() const;

  // Test seam for R22: the next acquire of free set `slot` issues `generation + 1`.
  void set_generation_for_test(uint32_t slot, uint64_t generation);

  RunResourceArena(RunResourceArena&& other) noexcept;
  RunResourceArena& operator=(RunResourceArena&& other) noexcept;

 private:
  enum class SetState : uint8_t { Free, Live, Quarantined };
  struct Set {
    SetState state = SetState::Free;
    uint64_t generation = 0;
  };
  explicit RunResourceArena(uint32_t grant);

  mutable std::mutex mu_;
  std::vector<Set> sets_;
  ArenaCounts counts_;
};

// ChipWorker's replay filter: the newest lease generation admitted per slot.
// It refuses an older generation, and a slot outside its width, so a filter
// left empty refuses everything (R29). Built exactly as wide as the grant.
class GenerationFilter {
 public:
  explicit GenerationFilter(uint32_t grant = 0) : newest_(grant, 0) {}
  bool is_admissible(const Lease& lease) const {
    return lease.generation != 0 && lease.slot < newest_.size() && lease.generation >= newest_[lease.slot];
  }
  // Only after is_admissible(lease).
  void admit(const Lease& lease) { newest_[lease.slot] = lease.generation; }
  uint64_t newest(uint32_t slot) const { return slot < newest_.size() ? newest_[slot] : 0; }
  uint32_t width() const { return static_cast<uint32_t>(newest_.size()); }
  void swap(GenerationFilter& other) noexcept { newest_.swap(other.newest_); }

 private:
  std::vector<uint64_t> newest_;
};

}  // namespace simpler
