// Fault-injection points of the reliability plan (test builds only:
// SIMPLER_TEST_HOOKS; without it every hook is a constant no-op).
//   H2: alloc_fault_hit() counts one allocation point of the calling thread
//   and says whether it must fail; armed per thread, it fails the n-th point
//   once. Points: a run-resource set (RunResourceArena), a first-fit block
//   (device memory, the shared heap), a shared mapping and, in a test binary
//   whose operator new asks too (tests/alloc_hook.h), every host allocation.
//   fork_fault_hit(): the n-th fork simpler makes from now (the fork
//   server's own, then each child the server forks) fails with EAGAIN; the
//   count is per process and a fork copies it, so the server inherits it.
// The fork server disarms H2 in itself: its allocations are not the test's.
// Nor are a node Scheduler's rounds that a waiting thread steps for it: they
// run under an AllocFaultPause, as they would on its own thread, unarmed.
#pragma once

namespace simpler::hooks {

#ifdef SIMPLER_TEST_HOOKS
// H2. n >= 1: the n-th point of this thread from now fails; 0 disarms.
void arm_alloc_fault(long n);
// Disarms; the points this thread counted since it was armed.
long disarm_alloc_fault();
// The site of the point that failed since arming, or nullptr.
const char* alloc_fault_site();
bool alloc_fault_hit(const char* site) noexcept;
// H2 neither counts nor fails on this thread within the scope.
class AllocFaultPause {
 public:
  AllocFaultPause() noexcept;
  ~AllocFaultPause();
  AllocFaultPause(const AllocFaultPause&) = delete;
  AllocFaultPause& operator=(const AllocFaultPause&) = delete;

 private:
  long fail_at_;
};

// n >= 1: the n-th fork from now fails; 0 disarms.
void arm_fork_fault(long n);
bool fork_fault_hit() noexcept;
#else
inline constexpr bool alloc_fault_hit(const char*) noexcept { return false; }
struct AllocFaultPause {};
inline constexpr bool fork_fault_hit() noexcept { return false; }
#endif

}  // namespace simpler::hooks
