// The simulated AICore: one host thread per core, fed through its registers.
// The owning AICPU thread writes the task register; the core answers ACK, then
// FIN with the dispatch token, in its status register. One writer per word:
// the AICPU owns `task`/`fn`/`args`, the core owns `status`/`error`.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

#include "base/doorbell.h"
#include "simpler/kernel.h"
#include "simpler/types.h"

namespace simpler {

inline constexpr size_t kKernelErrorBytes = 256;

struct alignas(64) CoreRegisters {
  static constexpr uint64_t kStateShift = 62;
  static constexpr uint64_t kAck = uint64_t{1} << kStateShift;
  static constexpr uint64_t kFin = uint64_t{2} << kStateShift;
  static constexpr uint64_t kFailedBit = uint64_t{1} << 61;
  static constexpr uint64_t kTokenMask = 0xffffffffull;

  // AICPU -> core. fn/args are published by the release store of `task`.
  std::atomic<uint64_t> task{0};
  simpler_kernel_fn fn = nullptr;
  int64_t* args = nullptr;
  Doorbell bell;  // the core parks here
  // core -> AICPU
  alignas(64) std::atomic<uint64_t> status{0};
  char error[kKernelErrorBytes] = {};
  bool failed = false;  // core-thread private while a kernel runs
};

class Core {
 public:
  Core(uint32_t id, CoreType type, uint32_t cluster, Doorbell* owner_bell);
  ~Core();
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  void start(const SpinPolicy& policy);
  // Asks the thread to exit once idle, and joins it.
  void stop();

  uint32_t id() const { return id_; }
  CoreType type() const { return type_; }
  uint32_t cluster() const { return cluster_; }
  CoreRegisters& regs() { return regs_; }
  uint64_t executed() const { return executed_.load(std::memory_order_relaxed); }

 private:
  void loop(SpinPolicy policy);

  const uint32_t id_;
  const CoreType type_;
  const uint32_t cluster_;
  Doorbell* const owner_bell_;
  CoreRegisters regs_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> executed_{0};
  std::thread thread_;
};

}  // namespace simpler
