// WorkerConfig: how a Worker is built, at every level, and the runtimes and
// backends this build of simpler has to choose from. Plain values; any
// thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "simpler/call_config.h"
#include "simpler/types.h"

namespace simpler {

// How the tensormap_and_ringbuffer runtime sizes one run: its task window,
// the four heap rings its intermediates stream through (the scope depth
// picks the ring, deeper scopes sharing the last) and its dependency pool.
// Other runtimes ignore it. 0 = the default.
struct RuntimeEnv {
  uint32_t task_window = 0;       // tasks submitted and not yet retired; <= max_tasks_per_run, its default
  uint64_t heap_ring_bytes = 0;   // each heap ring, allocated when the run first needs it; default 16 MiB
  uint32_t dep_pool_entries = 0;  // dependency edges whose producer has not retired; default 8 x task_window
  // The orchestration waiting on a full ring or pool this long with no task
  // retiring fails the run, naming what is full. 0 = 10 s.
  std::chrono::milliseconds stall_timeout{0};
};

struct WorkerConfig {
  Geometry geometry = Geometry::small();      // of every chip
  std::string runtime = "host_build_graph";   // chip runtime of every chip: one of available_runtimes()
  std::string backend = "sim";                // device backend of every chip: one of available_backends()
  uint32_t chips = 0;                         // Level::Node: chip child processes
  uint32_t sub_workers = 0;                   // Level::Node/Network: sub worker processes (host functions)
  uint32_t pipeline_depth = 2;                // runs admitted at once; each holds one run-resource set
  uint32_t launch_depth = 0;                  // runs launched on a device at once; 0 = pipeline_depth (Network: 0 only)
  uint64_t device_memory_bytes = 1ull << 30;  // simulated GM size (reserved, committed on touch)
  uint32_t max_tasks_per_run = 16384;         // graph capacity of one run-resource set
  uint64_t shared_heap_bytes = 64ull << 20;   // Level::Node/Network: host memory shared with every child
  // Level::Node/Network: a next-level task with no terminal this long after its publication
  // (a staged successor: after its activation) means its child hangs: the
  // child is killed, each run it held ends DEADLINE_EXCEEDED and the other
  // children keep serving. Level::Chip: a submitted run with no terminal this
  // long after its launch ends DEADLINE_EXCEEDED; a kernel thread cannot be
  // killed, so the chip is then wedged: later submits are refused and close()
  // abandons it at once. 0 = no deadline.
  std::chrono::milliseconds run_timeout{std::chrono::minutes(10)};
  // How long close() (and the destructor) waits for the runs in flight before
  // it gives each a terminal and abandons what it cannot prove stopped.
  std::chrono::milliseconds close_timeout{std::chrono::seconds(60)};
  // Guard bytes around every device allocation, checked when each task
  // finishes: a kernel that writes out of bounds fails its task ("wrote N
  // bytes past tensor argument i") and poisons its dependents. Unset: on in
  // Debug and sanitizer builds of simpler, off otherwise.
  std::optional<bool> guard_device_memory{};
  // Every run's RuntimeEnv (a native run may carry its own).
  RuntimeEnv runtime_env{};
  // Every run's diagnostics, unless its submit brings its own CallConfig.
  // Level::Node/Network: passed to each chip task the run sends a child.
  CallConfig call{};
};

// A chip runtime or device backend this build has, by the name its config
// field takes.
struct ComponentInfo {
  std::string name;
  std::string description;
};
// By name. Every name listed here is accepted by WorkerConfig::runtime.
std::vector<ComponentInfo> available_runtimes();
// By name. Every name listed here is accepted by WorkerConfig::backend.
std::vector<ComponentInfo> available_backends();

}  // namespace simpler
