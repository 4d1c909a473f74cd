// HostRange and HostRanges: host memory every process of a node maps at one
// address (the shared heap, and under a network the heaps above it). Plain
// values: any thread may copy and query them; they own no memory, only bounds.
#pragma once

#include <cstdint>
#include <vector>

namespace simpler {

// A tensor argument whose buffer lies inside one is host memory shared with
// the child, not device memory: a chip child stages it onto the device for
// the run and copies its written span back at the terminal.
struct HostRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  bool contains(uint64_t addr, uint64_t bytes) const { return addr >= begin && addr <= end && bytes <= end - addr; }
  bool overlaps(uint64_t addr, uint64_t bytes) const { return addr < end && addr + bytes > begin; }
};

// Every shared host range a child may be handed tensors in: its node's heap
// and, under a network, the heaps of the levels above (inherited via fork).
struct HostRanges {
  std::vector<HostRange> ranges;
  // Inside one range.
  bool contains(uint64_t addr, uint64_t bytes) const {
    for (const HostRange& r : ranges) {
      if (r.contains(addr, bytes)) return true;
    }
    return false;
  }
  bool overlaps(uint64_t addr, uint64_t bytes) const {
    for (const HostRange& r : ranges) {
      if (r.overlaps(addr, bytes)) return true;
    }
    return false;
  }
};

}  // namespace simpler
