// The runtime seam: what ChipWorker needs of a chip runtime, and the
// registry of the runtimes this build has. A runtime lives in its own folder
// under src/runtime/, registers itself there with SIMPLER_REGISTER_RUNTIME,
// and is selected by WorkerConfig::runtime; nothing outside its folder names
// it. Threads: the chip's owning thread creates a runtime and regrants it;
// the thread holding a set calls build/discard/launch for that set; AICPU
// threads call poll(); the done callback runs on whichever thread finishes
// the run (an AICPU thread, or launch() itself for an empty graph).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/grant_owner.h"
#include "device/device.h"
#include "runtime/common/run_outcome.h"
#include "simpler/callable.h"
#include "simpler/task_args.h"
#include "simpler/worker_config.h"

namespace simpler {

class ChipRuntime : public AicpuProgram, public GrantOwner {
 public:
  // Bytes of one bank's graph-definition arena (DeviceRunner::create_runner).
  virtual uint64_t arena_bytes() const = 0;
  // Prepares one run of the callable in set `api.slot`, using bank
  // `api.bank`'s arena, sized by `env` (checked here, naming the field). A
  // runtime that is not `streaming` runs the whole orchestration here, on this
  // thread; a streaming one only checks and records, and runs it on the
  // device after launch. On an error nothing is launched and the set holds
  // nothing (its intermediates are freed). `callable` and `run_args` outlive
  // the run's done callback. `trace` says what the run records (level 0:
  // nothing); its orchestrator lane outlives the run's done callback.
  virtual Status build(const HostApi& api, const ChipCallable& callable, const TaskArgs& run_args,
                       const RuntimeEnv& env, const diag::RunTrace& trace) = 0;
  // Frees what a built, never-launched run holds: the abort of a prepared run.
  virtual void discard(uint32_t slot) = 0;
  // Hands the built run of `slot` to the device. Its outcome comes through
  // the done callback exactly once, after the runtime stopped touching the set.
  virtual void launch(uint32_t slot) = 0;
  // Whether set `slot` holds a HostApi binding: true only inside build() (R88).
  virtual bool binding_held(uint32_t slot) const = 0;
  // Per core, the id of the last task of set `slot`'s run the core finished
  // (UINT32_MAX: none), at most `capacity`; returns how many cores it wrote,
  // 0 when the runtime does not dispatch to cores (the terminal snapshot then
  // says "not reported"). Only inside the done callback of that run.
  virtual uint32_t last_tasks(uint32_t slot, uint32_t* out, uint32_t capacity) const {
    (void)slot, (void)out, (void)capacity;
    return 0;
  }
};

struct RuntimeOptions {
  uint32_t max_tasks_per_run = 0;
  RuntimeEnv env;  // every run's, unless a native run brings its own
};

// What every runtime's create() refuses: options out of range, and a device
// whose memory is not host-mapped when the runtime (named `runtime`, doing
// `why`) writes it from the host.
Status check_runtime_options(const RuntimeOptions& options, Device& device, const char* runtime, const char* why);

struct RuntimeInfo {
  const char* name;
  const char* description;
  // Tasks of one run may execute at the same moment on different cores;
  // tests of concurrency run only on such runtimes.
  bool concurrent;
  // The orchestration runs on the device after launch, its first tasks
  // executing while it still submits: a refused submit or a failing
  // orchestration fails the run after the tasks already submitted finished
  // (or were poisoned), not before any ran; a run may have more tasks than
  // fit at once.
  bool streaming;
  // Validates the options against the device (naming the field) and creates
  // a runtime with no set yet (width() == 0). The device is not started.
  Result<std::unique_ptr<ChipRuntime>> (*create)(Device& device, const RuntimeOptions& options, RunDoneFn on_done);
  // Its AICPU threads see each task start and end (through the shared
  // CoreDispatcher), so a run's arguments can be captured there (ArgCapture).
  bool captures_args = false;
};

// Aborts on a duplicate name or a null field: a build defect.
bool register_runtime(const RuntimeInfo& info);
// Every registered runtime, by name.
std::vector<const RuntimeInfo*> registered_runtimes();
// The runtime named `name`, or INVALID_ARGUMENT naming the field `runtime`
// and listing the runtimes built.
Result<const RuntimeInfo*> runtime_named(const std::string& name);

}  // namespace simpler

#define SIMPLER_REGISTER_RUNTIME(ident, ...) \
  [[maybe_unused]] static const bool simpler_runtime_registered_##ident = ::simpler::register_runtime(__VA_ARGS__)
