// T7 for trace directories: parse_trace (src/diag/trace_reader.h) on any
// text, then, when it is accepted, the summary and the timeline page's data,
// which trust the reader's checks. Seeds: fuzz/corpus/fuzz_trace_reader/,
// from fuzz/make_seeds.py.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "diag/timeline_html.h"
#include "diag/trace_reader.h"
#include "diag/trace_summary.h"
#include "fuzz_check.h"

namespace simpler::diag {
namespace {

void check(std::string_view text) {
  auto t = parse_trace(text, "trace.json");
  if (!t.ok()) {
    FUZZ_CHECK(t.status().code() == StatusCode::kInvalidArgument);
    FUZZ_CHECK(t.status().message().rfind("trace.json", 0) == 0);
    return;
  }
  // Every index the model holds points inside it, and every task's
  // predecessors are tasks of its own process and run.
  for (const TraceLane& l : t->lanes) FUZZ_CHECK(l.process < t->processes.size());
  for (const TraceTask& task : t->tasks) {
    FUZZ_CHECK(task.lane < t->lanes.size() && task.kernel < t->kernels.size());
    FUZZ_CHECK(task.ts >= 0 && task.dur >= 0);
    for (uint32_t p : task.preds) {
      FUZZ_CHECK(p < t->tasks.size());
      FUZZ_CHECK(t->tasks[p].run == task.run && t->lanes[t->tasks[p].lane].pid == t->lanes[task.lane].pid);
    }
  }
  for (const TraceSlice& s : t->slices) FUZZ_CHECK(s.lane < t->lanes.size() && s.name < t->kernels.size());
  const TraceSummary s = summarize(*t);
  for (const LaneBusy& b : s.lanes) FUZZ_CHECK(b.busy_us <= s.span_us * (1 + 1e-9) + 1e-9);
  for (const CriticalPath& p : s.critical_paths) {
    FUZZ_CHECK(!p.nodes.empty() && p.nodes.size() <= t->nodes.size());
    FUZZ_CHECK(t->nodes[p.nodes.front()].preds.empty());
  }
  FUZZ_CHECK(!format_summary(*t, s).empty() && !summary_json(*t, s).empty());
  FUZZ_CHECK(timeline_data_json(*t).find('<') == std::string::npos);
}

}  // namespace
}  // namespace simpler::diag

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  simpler::diag::check(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
