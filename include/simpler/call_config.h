// CallConfig: the diagnostics one run asks for (swimlane timeline, argument
// dumps), given per submit or as a Worker's default (WorkerConfig::call).
// Plain values; any thread. Checked at submit (or init for the default),
// naming the field, before anything of the run exists.
#pragma once

#include <cstdint>
#include <string>

namespace simpler {

inline constexpr uint32_t kMaxSwimlaneLevel = 4;

// Argument dumps of a chip run's tasks, on the runtimes that see task
// boundaries (host_build_graph, tensormap_and_ringbuffer, resident): Partial
// captures the arguments marked with TaskArgs::dump(), Hybrid every tensor
// argument's metadata and the marked ones' bytes, Full everything. Inputs
// are captured before a task runs, outputs after, inouts both; the dump is
// `trace_dir`/args_dump (docs/diagnostics.md). A node or network run's chips
// each dump their part under `trace_dir`/chip<i>/task<t> (node<i>/task<t>/...
// through a network); runs through remote (MPI) nodes refuse it.
enum class DumpArgs : uint8_t { Off = 0, Partial = 1, Hybrid = 2, Full = 3 };

struct CallConfig {
  // 0 off; 1 a slice per task on its core's lane; 2 + AICPU dispatch and
  // finish; 3 + scheduler phases per AICPU thread; 4 + orchestrator submits.
  // Any level > 0 writes `trace_dir`/trace.json when the run ends
  // (docs/diagnostics.md); a node or network run's file holds its host lanes
  // and every chip's lanes, one process each.
  uint32_t swimlane_level = 0;
  // Where a run's diagnostics go: created if missing; required when
  // swimlane_level > 0 or dump_args is not Off.
  std::string trace_dir;
  DumpArgs dump_args = DumpArgs::Off;
};

}  // namespace simpler
