// SimDevice: one simulated chip: global memory, one thread per AICore and one
// per AICPU, all created at start() and joined at stop(); a run creates none.
// AICPU threads run the chip runtime's AicpuProgram. start/stop are for the
// owning thread; ring_aicpu and the accessors are for any thread.
#pragma once

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "base/doorbell.h"
#include "device/core.h"
#include "device/global_memory.h"
#include "simpler/types.h"

namespace simpler {

// What a chip runtime runs on each AICPU thread. poll() does one bounded round
// of scheduling work for the cores that thread owns and reports whether it made
// progress; the device spins and parks around it.
class AicpuProgram {
 public:
  virtual ~AicpuProgram() = default;
  virtual bool poll(uint32_t aicpu) = 0;
};

class SimDevice {
 public:
  static Result<std::unique_ptr<SimDevice>> create(const Geometry& geometry, uint64_t memory_bytes);
  ~SimDevice();

  // Starts every core and AICPU thread; `program` must outlive stop().
  void start(AicpuProgram* program);
  void stop();

  const Geometry& geometry() const { return geometry_; }
  GlobalMemory& memory() { return *memory_; }
  uint32_t core_count() const { return static_cast<uint32_t>(cores_.size()); }
  Core& core(uint32_t i) { return *cores_[i]; }
  // Cluster c holds cores 3c (AIC), 3c+1 and 3c+2 (AIV); AICPU a owns clusters c with c % n == a.
  uint32_t owner_of_cluster(uint32_t cluster) const { return cluster % geometry_.aicpu_threads; }
  void ring_aicpu(uint32_t aicpu) { bells_[aicpu].bell.ring(); }
  void ring_all_aicpu();
  uint64_t aicpu_parks() const { return parks_.load(std::memory_order_relaxed); }

 private:
  SimDevice(Geometry geometry, std::unique_ptr<GlobalMemory> memory);
  void aicpu_loop(uint32_t index);

  struct alignas(64) PaddedBell {
    Doorbell bell;
  };

  const Geometry geometry_;
  std::unique_ptr<GlobalMemory> memory_;
  std::unique_ptr<PaddedBell[]> bells_;
  std::vector<std::unique_ptr<Core>> cores_;
  std::vector<std::thread> aicpu_;
  AicpuProgram* program_ = nullptr;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> parks_{0};
  SpinPolicy policy_;
};

}  // namespace simpler
