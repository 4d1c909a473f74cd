// SimRunner: the sim backend's DeviceRunner, the object every sim HostApi is
// bound to. It owns the per-set device resources: one retained temp buffer per
// slot and one graph-definition arena per bank, each table exactly as wide as
// the grant. Callbacks for different slots/banks may run concurrently; the
// grant changes only through build_grant/commit_grant while no run is live.
#pragma once

#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "device/device.h"
#include "device/sim/global_memory.h"

namespace simpler {

class SimRunner final : public DeviceRunner {
 public:
  // `arena_bytes` is the size of each bank's graph-definition arena.
  SimRunner(GlobalMemory& memory, uint64_t arena_bytes, uint32_t swimlane_level = 0);
  ~SimRunner() override;
  SimRunner(const SimRunner&) = delete;
  SimRunner& operator=(const SimRunner&) = delete;

  // The sim backend's callback table.
  static const HostApiOps& sim_ops();

  const HostApiOps& ops() const override { return sim_ops(); }
  Result<std::unique_ptr<Pending>> build_grant(uint32_t grant) const override;
  void commit_grant(Pending& pending) noexcept override;
  uint32_t width() const override { return static_cast<uint32_t>(retained_addr_.size()); }
  Result<HostApi> bind(uint32_t slot, uint32_t bank) override;
  uint64_t retained_addr(uint32_t slot) const override { return retained_addr_[slot]; }
  uint64_t arena_addr(uint32_t bank) const override { return arena_addr_[bank]; }
  bool callable_uploaded(uint32_t id) const override;

 private:
  friend struct SimOps;
  struct Tables;
  void swap_in(Tables& t) noexcept;

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
