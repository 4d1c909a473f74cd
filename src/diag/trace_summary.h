// `simpler trace summary`: where a traced run's time went, computed from a
// validated Trace (trace_reader.h). Any thread; pure functions of their input.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "diag/trace_reader.h"

namespace simpler::diag {

struct LaneBusy {
  uint32_t lane = 0;    // index into Trace::lanes
  uint64_t tasks = 0;   // task slices on it
  double busy_us = 0;   // the union of its task slices
  double busy_pct = 0;  // busy_us over the trace's span
};

// The time between a task's last predecessor ending and its own (first
// block's) start, over every task that has a predecessor (nearest-rank
// percentiles).
struct OverheadStats {
  uint64_t tasks = 0;
  double mean_us = 0;
  double p50_us = 0;
  double p99_us = 0;
  double max_us = 0;
};

// The chain that bounded one run: from the run's last-ending task, back
// through the predecessor that ended last, to a task with none.
struct CriticalPath {
  int64_t pid = 0;
  int64_t run = 0;
  double length_us = 0;         // end of the last task - start of the first
  std::vector<uint32_t> nodes;  // indices into Trace::nodes, first to last
};

struct TraceSummary {
  double span_begin_us = 0;  // the first task's start
  double span_us = 0;        // to the last task's end
  uint64_t tasks = 0;        // distinct (pid, run, task id)
  uint64_t slices = 0;       // task slices (an SPMD task has one per block)
  uint64_t runs = 0;
  uint64_t missing_preds = 0;   // Trace::missing_preds
  std::vector<LaneBusy> lanes;  // every core lane, in lane order
  OverheadStats overhead;
  std::vector<CriticalPath> critical_paths;  // one per (pid, run), in that order
};

TraceSummary summarize(const Trace& trace);

// Human-readable tables: busy per core lane, overhead, and each run's critical
// path with the tasks of the longest one.
std::string format_summary(const Trace& trace, const TraceSummary& summary);
// The same as one JSON object (docs/diagnostics.md lists its fields).
std::string summary_json(const Trace& trace, const TraceSummary& summary);

}  // namespace simpler::diag
