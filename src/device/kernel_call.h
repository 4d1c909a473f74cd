// Calling a kernel the way a core does: on the calling thread, with
// simpler_kernel_fail and a thrown exception both recorded as the task's
// failure (the first report wins), and the kernel named in the one line a
// fatal signal inside it prints. Core threads of a backend and runtimes that
// execute kernels themselves (the reference runtime) use it; any thread.
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

// Which kernel of which task a thread is running.
struct KernelLabel {
  const char* name = nullptr;  // KernelInfo::name; null when unknown
  uint32_t task = 0;
  uint32_t func_id = 0;
  uint32_t block = 0;  // of an SPMD task's `blocks`
  uint32_t blocks = 1;
};

// Runs `fn(args)` here; resets `failure` first. Returns !failure.failed.
bool call_kernel(simpler_kernel_fn fn, int64_t* args, KernelFailure& failure, const KernelLabel& label = {});

// Once per process: for SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT whose
// action is still the default, a handler that writes one line naming the
// kernel and task the crashing thread was running (a chip-level kernel runs
// in the user's process, so its crash is the process's), then re-raises the
// signal with its default action. Handlers the program installed are kept.
void install_kernel_crash_reporter();

}  // namespace simpler
