// Export of swimlane recordings to Chrome trace-event JSON (the contract is
// docs/diagnostics.md): a chip run's lanes become one process's events. Runs
// on the thread retiring the run, after every lane it reads was last written
// for that run (its tasks' FINs were reaped).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "diag/lane.h"
#include "simpler/status.h"

namespace simpler::diag {

inline constexpr int kTraceFormatVersion = 1;

// One chip run as its process in the file.
struct ChipRunTrace {
  int pid = 0;
  std::string label;  // chip0, node1/chip0 ...
  uint64_t run = 0;   // epoch
  uint32_t level = 0;
  uint64_t launch_ns = 0;  // the run's window (scheduler phases inside it are its)
  uint64_t end_ns = 0;
  int64_t clock_offset_ns = 0;  // added to every timestamp: the top-level process's clock minus this one's
  const Recorder* recorder = nullptr;
  LaneWindow window;                   // where the run's events are in the recorder's lanes
  const Lane* orchestrator = nullptr;  // the run's edges and submits
};

// Appends the run's events (metadata, slices, flows) to `events` as JSON
// objects separated by ",\n". `next_flow_id` numbers the flow pairs, unique
// in the file. Returns the events the run's lanes dropped.
uint64_t render_chip_run(const ChipRunTrace& run, uint64_t& next_flow_id, std::string& events);

struct TraceRunEntry {
  uint64_t run = 0;
  int pid = 0;
  std::string label;
  uint64_t dropped = 0;
};

// The whole document around `events`.
std::string trace_document(uint32_t level, const std::vector<TraceRunEntry>& runs, const std::string& events);

// Writes `dir`/trace.json through a temporary file renamed into place, so a
// reader never sees half a file; `run` names the temporary file, so runs
// ending at once on different threads never share one (the last rename
// wins). FAILED_PRECONDITION naming the path on failure.
Status write_trace_file(const std::string& dir, uint64_t run, const std::string& document);

// The one-call form for a chip Worker's run.
Status export_chip_run(const std::string& dir, const ChipRunTrace& run);

// JSON string contents for `s` (no quotes).
std::string json_escape(const char* s);

}  // namespace simpler::diag
