// `simpler trace view` and `simpler trace summary`: thin over src/diag/.
#include <cstdio>

#include <fmt/core.h>

#include "commands.h"
#include "diag/timeline_html.h"
#include "diag/trace_reader.h"
#include "diag/trace_summary.h"

namespace simpler::cli {

int cmd_trace_view(const TraceFlags& flags) {
  Result<std::string> path = diag::write_timeline(flags.dir);
  if (!path.ok()) {
    fmt::print(stderr, "simpler trace view: {}\n", path.status().message());
    return kExitFailure;
  }
  fmt::print("wrote {}\n", *path);
  return kExitOk;
}

int cmd_trace_summary(const TraceFlags& flags) {
  Result<diag::Trace> trace = diag::read_trace_dir(flags.dir);
  if (!trace.ok()) {
    fmt::print(stderr, "simpler trace summary: {}\n", trace.status().message());
    return kExitFailure;
  }
  const diag::TraceSummary summary = diag::summarize(*trace);
  const std::string text = flags.json ? diag::summary_json(*trace, summary) : diag::format_summary(*trace, summary);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return kExitOk;
}

}  // namespace simpler::cli
