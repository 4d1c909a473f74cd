// Calling a kernel the way a core does: on the calling thread, with
// simpler_kernel_fail and a thrown exception both recorded as the task's
// failure (the first report wins). Core threads of a backend and runtimes
// that execute kernels themselves (the reference runtime) use it; any thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "simpler/kernel.h"

namespace simpler {

inline constexpr size_t kKernelErrorBytes = 256;

// Why the last kernel called with this record failed. Written only by the
// thread that runs the kernel.
struct KernelFailure {
  bool failed = false;
  char message[kKernelErrorBytes] = {};
};

// Runs `fn(args)` here; resets `failure` first. Returns !failure.failed.
bool call_kernel(simpler_kernel_fn fn, int64_t* args, KernelFailure& failure);

}  // namespace simpler
