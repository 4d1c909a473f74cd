// Guard bytes around a device allocation: `guard` bytes of `pattern` before
// it, and from its end to the next multiple of `alignment` plus `guard`
// after it. Whoever carves allocations (a backend's allocator, a runtime's
// heap ring) writes them and measures them here. Any thread; never allocates.
#pragma once

#include <cstdint>
#include <cstring>

#include "device/device.h"

namespace simpler {

// How far writes reached into the guards of [addr, addr + bytes); restores
// them, so each damage is reported once.
inline DeviceMemory::GuardDamage measure_and_restore_guards(uint64_t addr, uint64_t bytes, uint64_t guard,
                                                            uint64_t alignment, uint8_t pattern) {
  DeviceMemory::GuardDamage d;
  auto* lead = reinterpret_cast<uint8_t*>(addr - guard);
  for (uint64_t i = 0; i < guard; ++i) {
    if (lead[i] != pattern) {
      d.before = guard - i;
      break;
    }
  }
  auto* tail = reinterpret_cast<uint8_t*>(addr + bytes);
  const uint64_t end = addr + bytes;
  const uint64_t tail_bytes = (end + alignment - 1) / alignment * alignment + guard - end;
  for (uint64_t i = tail_bytes; i > 0; --i) {
    if (tail[i - 1] != pattern) {
      d.past = i;
      break;
    }
  }
  if (d.before != 0) std::memset(lead, pattern, guard);
  if (d.past != 0) std::memset(tail, pattern, tail_bytes);
  return d;
}

}  // namespace simpler
