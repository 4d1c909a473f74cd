// `simpler trace view`: the self-contained HTML timeline of a Trace
// (trace_reader.h). The page (timeline.html/.css/.js beside this file, compiled
// in) gets the trace as embedded JSON and fetches nothing. Any thread.
#pragma once

#include <string>

#include "diag/trace_reader.h"
#include "simpler/status.h"

namespace simpler::diag {

// The page's trace data: processes, lanes, names, and the tasks and other
// slices as columns with times in µs from the first task's start and each
// task's predecessors as indices (docs/diagnostics.md, "The page's data").
std::string timeline_data_json(const Trace& trace);

// The whole page: the template with its style, script and data inlined.
std::string render_timeline_html(const Trace& trace);

// Reads DIR/trace.json and writes DIR/timeline.html; returns the page's path.
Result<std::string> write_timeline(const std::string& dir);

}  // namespace simpler::diag
