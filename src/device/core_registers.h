// CoreRegisters: the handshake registers of one compute core, the dispatch
// contract between an AICPU (a runtime's scheduler thread) and a core on
// every backend. The AICPU writes `task` (with `fn`/`args` published by that
// release store) and rings `bell`; the core answers ACK, then FIN with the
// dispatch token, in `status`. One writer per word: the AICPU owns
// task/fn/args, the core owns status, the failure record and kernel_ns.
// Between a FIN the AICPU has seen and its next `task` store the core touches
// nothing: an AICPU that runs a kernel inline for the core (CoreDispatcher,
// while oversubscribed) writes the failure record itself then.
#pragma once

#include <atomic>
#include <cstdint>

#include "base/doorbell.h"
#include "device/kernel_call.h"

namespace simpler {

struct alignas(64) CoreRegisters {
  static constexpr uint64_t kStateShift = 62;
  static constexpr uint64_t kAck = uint64_t{1} << kStateShift;
  static constexpr uint64_t kFin = uint64_t{2} << kStateShift;
  static constexpr uint64_t kFailedBit = uint64_t{1} << 61;
  static constexpr uint64_t kTokenMask = 0xffffffffull;

  // AICPU -> core.
  std::atomic<uint64_t> task{0};
  simpler_kernel_fn fn = nullptr;
  int64_t* args = nullptr;
  KernelLabel label;  // names the kernel if it crashes the process
  // The run's swimlane level (0: the core records nothing) and epoch.
  uint32_t trace_level = 0;
  uint64_t trace_run = 0;
  Doorbell bell;  // the core parks here
  // core -> AICPU: `failure` is complete before the FIN store that reports it.
  // Each on a line of its own: the AICPU polls `status` while the core
  // resets `failure` for the next kernel.
  alignas(64) std::atomic<uint64_t> status{0};
  alignas(64) KernelFailure failure;
  uint64_t kernel_ns = 0;  // how long the kernel ran, written before FIN
};

}  // namespace simpler
