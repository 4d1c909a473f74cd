// Reads a trace directory's trace.json (the Chrome trace-event format of
// docs/diagnostics.md) into a validated in-memory model for the viewer and the
// summary. Any thread; the returned Trace owns all its data and is immutable by convention.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "simpler/status.h"

namespace simpler::diag {

inline constexpr int kTraceVersion = 1;
// A bigger trace.json is refused before it is read: the parsed model takes
// several times the text's size in memory.
inline constexpr uint64_t kMaxTraceBytes = 1ull << 30;

struct TraceProcess {
  int64_t pid = 0;
  std::string name;  // "chip0", "node", "node1/chip0"; "pid N" when unnamed
};

// One row of the timeline: a (pid, tid) with a thread_name or with slices.
struct TraceLane {
  int64_t pid = 0;
  int64_t tid = 0;
  std::string name;  // "AIV3", "AICPU0", "Scheduler"; "tid N" when unnamed
  int64_t sort_index = 0;
  uint32_t process = 0;  // index into Trace::processes
  bool core = false;     // an AIC<i>/AIV<i> lane, or one that holds task slices
};

// A task's slice ("ph":"X","cat":"task") on a core lane: the whole task, or
// one block of an SPMD task (its blocks share the task id).
struct TraceTask {
  uint32_t lane = 0;            // index into Trace::lanes
  uint32_t kernel = 0;          // index into Trace::kernels
  uint64_t id = 0;              // args.task, unique within (pid, run)
  int64_t run = 0;              // args.run
  double ts = 0;                // µs
  double dur = 0;               // µs
  std::vector<uint32_t> preds;  // indices into Trace::tasks: every slice of each task args.preds names
  uint32_t node = 0;            // index into Trace::nodes
  uint32_t event = 0;           // its index in traceEvents, for messages
};

// A task of a run's graph: one (pid, run, task id), with all its slices.
struct TraceNode {
  int64_t pid = 0;
  int64_t run = 0;
  uint64_t id = 0;
  double start = 0;              // its first slice's start, µs
  double end = 0;                // its last slice's end
  std::vector<uint32_t> slices;  // indices into Trace::tasks, by (lane, ts)
  std::vector<uint32_t> preds;   // indices into Trace::nodes, each once
};

// Any other complete slice (dispatch, sched, submit, host): drawn, not analysed.
struct TraceSlice {
  uint32_t lane = 0;
  uint32_t name = 0;  // index into Trace::kernels (the one name table)
  std::string cat;
  double ts = 0;
  double dur = 0;
};

struct Trace {
  int swimlane_level = 0;
  std::vector<TraceProcess> processes;  // in order of pid
  std::vector<TraceLane> lanes;         // by process, then sort_index, then tid
  std::vector<std::string> kernels;     // names of task and other slices
  std::vector<TraceTask> tasks;         // by (lane, ts)
  std::vector<TraceNode> nodes;         // in order of their first slice in `tasks`
  // Predecessors named by a task that have no slice (a full lane dropped it,
  // as the file's runs[].dropped counts): left out of the graph, counted here.
  uint64_t missing_preds = 0;
  std::string first_missing_pred;  // "event 40: task 9 of pid 1 run 3 names predecessor 12, which has no slice"
  std::vector<TraceSlice> slices;  // by (lane, ts)
};

// Parses and validates trace text. `source` names the input in messages
// ("trace.json: event 17 has no ts"). Refuses (INVALID_ARGUMENT) malformed
// JSON, a file that is not a simpler trace (no traceEvents array, no or
// another otherData.simpler_trace_version), a task slice without its fields
// or with a negative or non-finite time, a task naming itself as its
// predecessor, and a cycle through predecessors. A predecessor without a slice
// is counted (Trace::missing_preds), not refused: a full lane drops events.
// Events of other phases (flows, instants, counters) are skipped.
Result<Trace> parse_trace(std::string_view text, const std::string& source = "trace.json");

// Reads DIR/trace.json (NOT_FOUND when absent, INVALID_ARGUMENT as above).
Result<Trace> read_trace_dir(const std::string& dir);
// The bytes of the trace file `path` (in trace directory `dir`, for the
// message): NOT_FOUND when absent, INVALID_ARGUMENT when it is not a regular
// file or is bigger than kMaxTraceBytes.
Result<std::string> read_trace_text(const std::string& path, const std::string& dir);

// The key a task is named by outside this model: "pid:run:task".
std::string task_key(const Trace& trace, const TraceTask& task);

}  // namespace simpler::diag
