// A replacement of global operator new for the binaries that count or fail
// host allocations (R25, R44, the allocator's free, T12): include it from
// exactly one source file of such a binary. Everything is per thread, so only
// the thread under test is counted or failed. Each host allocation is also
// one point of the library's H2 count (base/fault_hooks.h), inert unless armed.
#pragma once

#include <cstdlib>
#include <new>

#include "base/fault_hooks.h"

namespace simpler::testing {

struct AllocHook {
  static inline thread_local bool counting = false;
  static inline thread_local long allocations = 0;  // while counting
  // -1: never fail; n >= 0: the allocation after n more successful ones throws.
  static inline thread_local long fail_after = -1;
  // After one failure: disarm (true) or keep failing every allocation (false).
  static inline thread_local bool fail_once = true;
};

}  // namespace simpler::testing

// The replacement pair is malloc/free on purpose; GCC cannot see that they match.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  using H = simpler::testing::AllocHook;
  if (H::counting) ++H::allocations;
  if (H::fail_after == 0) {
    if (H::fail_once) H::fail_after = -1;
    throw std::bad_alloc();
  }
  if (H::fail_after > 0) --H::fail_after;
  if (simpler::hooks::alloc_fault_hit("host")) throw std::bad_alloc();
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop
