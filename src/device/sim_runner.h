// SimRunner: the simulated backend's runner, the object every sim HostApi is
// bound to. It owns the per-set device resources: one retained temp buffer per
// slot and one graph-definition arena per bank, each table exactly as wide as
// the grant. Callbacks for different slots/banks may run concurrently; the
// grant changes only through build_grant/commit_grant while no run is live.
#pragma once

#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "device/global_memory.h"
#include "device/host_api.h"

namespace simpler {

class SimRunner {
 public:
  // `arena_bytes` is the size of each bank's graph-definition arena.
  SimRunner(GlobalMemory& memory, uint64_t arena_bytes, uint32_t swimlane_level = 0);
  ~SimRunner();
  SimRunner(const SimRunner&) = delete;
  SimRunner& operator=(const SimRunner&) = delete;

  static const HostApiOps& ops();

  // The per-set tables of a grant, built off to the side so that a failure
  // leaves the current grant untouched.
  struct GrantTables {
    std::vector<uint64_t> retained_addr;
    std::vector<uint64_t> retained_bytes;
    std::vector<uint64_t> arena_addr;
  };
  // May throw std::bad_alloc; touches no member.
  static GrantTables build_grant(uint32_t grant);
  // Swaps the tables in, handing back device memory the old tables held.
  void commit_grant(GrantTables& tables) noexcept;
  uint32_t width() const { return static_cast<uint32_t>(retained_addr_.size()); }

  // Refuses a slot or bank outside the grant, naming it.
  Result<HostApi> bind(uint32_t slot, uint32_t bank);

  GlobalMemory& memory() { return memory_; }
  uint64_t arena_bytes() const { return arena_bytes_; }
  uint64_t retained_addr(uint32_t slot) const { return retained_addr_[slot]; }
  uint64_t arena_addr(uint32_t bank) const { return arena_addr_[bank]; }
  bool callable_uploaded(uint32_t id) const;

 private:
  friend struct SimOps;
  GlobalMemory& memory_;
  const uint64_t arena_bytes_;
  const uint32_t swimlane_level_;
  std::vector<uint64_t> retained_addr_;
  std::vector<uint64_t> retained_bytes_;
  std::vector<uint64_t> arena_addr_;
  mutable std::mutex uploaded_mu_;
  std::set<uint32_t> uploaded_;
};

}  // namespace simpler
