// GrantOwner: anything built exactly as wide as the run-resource grant (one
// entry per set: a backend runner's per-slot buffers, a runtime's per-slot
// graph state). A regrant is two-phase: every owner builds its new state off
// to the side, then every owner commits, and no commit can fail. Called only
// by the thread that owns the chip, while no run is live.
#pragma once

#include <cstdint>
#include <memory>

#include "simpler/status.h"

namespace simpler {

class GrantOwner {
 public:
  // The state of one grant, built and not yet committed.
  class Pending {
   public:
    virtual ~Pending() = default;
  };

  virtual ~GrantOwner() = default;
  // The grant hook (R31): an owner that cannot serve `grant` refuses it with
  // an error naming why. May throw std::bad_alloc. Changes nothing of this owner.
  virtual Result<std::unique_ptr<Pending>> build_grant(uint32_t grant) const = 0;
  // Swaps in `pending`, which this owner's build_grant made; hands back what
  // the previous grant held.
  virtual void commit_grant(Pending& pending) noexcept = 0;
  // Sets the committed grant has.
  virtual uint32_t width() const = 0;
};

}  // namespace simpler
