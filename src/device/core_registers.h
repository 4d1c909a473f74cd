// CoreRegisters: the handshake registers of one compute core, the dispatch
// contract between an AICPU (a runtime's scheduler thread) and a core on
// every backend. The core runs tokens 1, 2, 3, ... in order, token t from
// descriptor[t % kDepth]: the AICPU fills that descriptor and publishes it by
// storing t in its `token` (release), then rings `bell`. Up to kDepth tokens
// may be posted and not yet seen ended, so a core with one queued starts it
// without a round trip through the AICPU. The core answers ACK t in `status`
// when it starts t and FIN t when t ended (either says every token before t
// ended), each after writing t's `ended` record. The AICPU owns the
// descriptors, the core owns status, ended[] and failure[]. A token posted
// behind another is revocable, the one word both sides change: the core
// claims it (CAS to kClaimed) before it starts it, and until then the AICPU
// may take it back (CAS to kRevoked), newest first, when the kernel ahead
// blocks; it posts that token number again later, and the core waits for it.
// A token posted kAfterOk is the successor of the token right before it,
// waiting on nothing else: the core runs it only if that one ran and
// succeeded, and otherwise ends it unrun (Ended::skipped), so a chain runs
// on one core without a round trip through the AICPU between its links.
// Slot t % kDepth is the core's from t's post until the AICPU has seen t end;
// an AICPU that runs a kernel inline for an idle core (CoreDispatcher, while
// oversubscribed) uses the slot of the token it would post next, and posts
// nothing to that core until it has read the record.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "base/doorbell.h"
#include "device/kernel_call.h"

namespace simpler {

struct alignas(64) CoreRegisters {
  static constexpr uint64_t kStateShift = 62;
  static constexpr uint64_t kAck = uint64_t{1} << kStateShift;
  static constexpr uint64_t kFin = uint64_t{2} << kStateShift;
  static constexpr uint64_t kTokenMask = 0xffffffffull;
  // Descriptor token word flags, above the token.
  static constexpr uint64_t kRevocable = uint64_t{1} << 32;
  static constexpr uint64_t kClaimed = uint64_t{1} << 33;
  static constexpr uint64_t kRevoked = uint64_t{1} << 34;
  static constexpr uint64_t kAfterOk = uint64_t{1} << 35;
  // Tokens a core may hold posted and not seen ended: the one it runs and
  // the ones queued behind it.
  static constexpr uint32_t kDepth = 4;

  // One token's kernel, on one line: the core's wait and its reads of the
  // kernel are one transfer, and the AICPU fills the next slot while the
  // core reads this one.
  struct alignas(64) Descriptor {
    std::atomic<uint64_t> token{0};  // published last: the slot holds this token (and its flags)
    simpler_kernel_fn fn = nullptr;
    int64_t* args = nullptr;
    KernelLabel label;  // names the kernel if it crashes the process
    // The run's swimlane level (0: the core records nothing) and epoch.
    uint32_t trace_level = 0;
    uint64_t trace_run = 0;
  };
  // How a token ended: read by the AICPU with the status that says it ended.
  struct Ended {
    uint32_t kernel_ns = 0;  // how long its kernel ran, saturated
    uint32_t failed = 0;     // failure[slot] holds why
    uint32_t skipped = 0;    // a kAfterOk token not run: the one before it failed or was skipped
  };
  static uint32_t slot_of(uint32_t token) { return token % kDepth; }
  // The newest token a status word says ended (0: none yet).
  static uint32_t ended_token(uint64_t status) {
    const auto token = static_cast<uint32_t>(status & kTokenMask);
    const uint64_t state = status >> kStateShift;
    return state == 2 ? token : state == 1 ? token - 1 : 0;
  }

  // AICPU -> core.
  Descriptor descriptor[kDepth];
  alignas(64) Doorbell bell;  // the core parks here, through a Doorbell::Parking: ring_parked() reaches it
  // core -> AICPU: what the AICPU polls, on one line.
  alignas(64) std::atomic<uint64_t> status{0};
  Ended ended[kDepth];
  alignas(64) KernelFailure failure[kDepth];
};
static_assert(sizeof(CoreRegisters::Descriptor) == 64, "one token's descriptor is one line");
static_assert(offsetof(CoreRegisters, ended) + sizeof(CoreRegisters::ended) <= offsetof(CoreRegisters, status) + 64,
              "status and the ended records share a line");

}  // namespace simpler
