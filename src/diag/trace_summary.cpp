#include "diag/trace_summary.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace simpler::diag {
namespace {

double end_of(const TraceTask& t) { return t.ts + t.dur; }

// The length of the union of [ts, ts + dur) over slices sorted by ts.
double union_length(const std::vector<const TraceTask*>& sorted) {
  double total = 0;
  double open_begin = 0;
  double open_end = -1;
  for (const TraceTask* t : sorted) {
    if (t->ts > open_end) {
      if (open_end > open_begin) total += open_end - open_begin;
      open_begin = t->ts;
      open_end = end_of(*t);
    } else {
      open_end = std::max(open_end, end_of(*t));
    }
  }
  if (open_end > open_begin) total += open_end - open_begin;
  return total;
}

// Nearest rank: the smallest value with at least p of the values at or below it.
double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

std::vector<CriticalPath> critical_paths(const Trace& trace) {
  // The last-ending task of each (pid, run); ties go to the lower index so the
  // answer does not depend on the order of equal times.
  std::map<std::pair<int64_t, int64_t>, uint32_t> last;
  for (uint32_t i = 0; i < trace.nodes.size(); ++i) {
    const TraceNode& n = trace.nodes[i];
    auto [it, fresh] = last.emplace(std::make_pair(n.pid, n.run), i);
    if (!fresh && n.end > trace.nodes[it->second].end) it->second = i;
  }
  std::vector<CriticalPath> out;
  for (const auto& [key, tail] : last) {
    CriticalPath path;
    path.pid = key.first;
    path.run = key.second;
    // The reader refuses cycles, so the walk ends at a task without predecessors.
    uint32_t at = tail;
    for (;;) {
      path.nodes.push_back(at);
      const TraceNode& n = trace.nodes[at];
      if (n.preds.empty()) break;
      uint32_t next = n.preds.front();
      for (uint32_t p : n.preds) {
        if (trace.nodes[p].end > trace.nodes[next].end) next = p;
      }
      at = next;
    }
    std::reverse(path.nodes.begin(), path.nodes.end());
    path.length_us = trace.nodes[path.nodes.back()].end - trace.nodes[path.nodes.front()].start;
    out.push_back(std::move(path));
  }
  return out;
}

// The kernel and lane of a task: its first slice's.
const TraceTask& first_slice(const Trace& trace, const TraceNode& n) { return trace.tasks[n.slices.front()]; }

}  // namespace

TraceSummary summarize(const Trace& trace) {
  TraceSummary s;
  s.tasks = trace.nodes.size();
  s.slices = trace.tasks.size();
  s.missing_preds = trace.missing_preds;
  if (!trace.tasks.empty()) {
    double begin = std::numeric_limits<double>::infinity();
    double end = -std::numeric_limits<double>::infinity();
    for (const TraceTask& t : trace.tasks) {
      begin = std::min(begin, t.ts);
      end = std::max(end, end_of(t));
    }
    s.span_begin_us = begin;
    s.span_us = end - begin;
  }

  std::vector<std::vector<const TraceTask*>> per_lane(trace.lanes.size());
  for (const TraceTask& t : trace.tasks) per_lane[t.lane].push_back(&t);  // tasks are sorted by (lane, ts)
  for (uint32_t l = 0; l < trace.lanes.size(); ++l) {
    if (!trace.lanes[l].core) continue;
    LaneBusy b;
    b.lane = l;
    b.tasks = per_lane[l].size();
    b.busy_us = union_length(per_lane[l]);
    b.busy_pct = s.span_us > 0 ? 100.0 * b.busy_us / s.span_us : 0;
    s.lanes.push_back(b);
  }

  std::vector<double> overheads;
  for (const TraceNode& n : trace.nodes) {
    if (n.preds.empty()) continue;
    double ready = -std::numeric_limits<double>::infinity();
    for (uint32_t p : n.preds) ready = std::max(ready, trace.nodes[p].end);
    overheads.push_back(n.start - ready);
  }
  std::sort(overheads.begin(), overheads.end());
  s.overhead.tasks = overheads.size();
  if (!overheads.empty()) {
    double sum = 0;
    for (double o : overheads) sum += o;
    s.overhead.mean_us = sum / static_cast<double>(overheads.size());
    s.overhead.p50_us = percentile(overheads, 0.50);
    s.overhead.p99_us = percentile(overheads, 0.99);
    s.overhead.max_us = overheads.back();
  }

  s.critical_paths = critical_paths(trace);
  s.runs = s.critical_paths.size();
  return s;
}

std::string format_summary(const Trace& trace, const TraceSummary& s) {
  std::string out = fmt::format("{} tasks in {} runs over {:.3f} us (first task start to last task end)\n", s.tasks,
                                s.runs, s.span_us);
  if (s.slices != s.tasks) out += fmt::format("{} task slices (the blocks of SPMD tasks)\n", s.slices);
  if (s.missing_preds != 0) {
    out += fmt::format(
        "{} predecessor references name a task with no slice (dropped events), left out of the paths and "
        "overheads; the first: {}\n",
        s.missing_preds, trace.first_missing_pred);
  }
  out += "\n";
  out += fmt::format("{:<24} {:<10} {:>8} {:>14} {:>8}\n", "process", "lane", "tasks", "busy us", "busy %");
  for (const LaneBusy& b : s.lanes) {
    const TraceLane& lane = trace.lanes[b.lane];
    out += fmt::format("{:<24} {:<10} {:>8} {:>14.3f} {:>7.1f}%\n", trace.processes[lane.process].name, lane.name,
                       b.tasks, b.busy_us, b.busy_pct);
  }
  out += fmt::format(
      "\nscheduler overhead (last predecessor's end to start), over {} tasks with predecessors:\n"
      "  mean {:.3f} us  p50 {:.3f} us  p99 {:.3f} us  max {:.3f} us\n",
      s.overhead.tasks, s.overhead.mean_us, s.overhead.p50_us, s.overhead.p99_us, s.overhead.max_us);
  if (s.critical_paths.empty()) return out;

  out += "\ncritical path per run (last-ending task back through its last-ending predecessor):\n";
  out += fmt::format("  {:<24} {:>8} {:>8} {:>14}\n", "process", "run", "tasks", "length us");
  const CriticalPath* longest = &s.critical_paths.front();
  for (const CriticalPath& p : s.critical_paths) {
    const TraceTask& first = first_slice(trace, trace.nodes[p.nodes.front()]);
    out += fmt::format("  {:<24} {:>8} {:>8} {:>14.3f}\n", trace.processes[trace.lanes[first.lane].process].name, p.run,
                       p.nodes.size(), p.length_us);
    if (p.length_us > longest->length_us) longest = &p;
  }
  out += fmt::format("\nthe longest, pid {} run {}: {:.3f} us through {} tasks\n", longest->pid, longest->run,
                     longest->length_us, longest->nodes.size());
  out += fmt::format("  {:>10} {:<20} {:<8} {:>14} {:>12}\n", "task", "kernel", "lane", "start us", "dur us");
  for (uint32_t i : longest->nodes) {
    const TraceNode& n = trace.nodes[i];
    const TraceTask& t = first_slice(trace, n);
    out += fmt::format("  {:>10} {:<20} {:<8} {:>14.3f} {:>12.3f}\n", n.id, trace.kernels[t.kernel],
                       trace.lanes[t.lane].name, n.start - s.span_begin_us, n.end - n.start);
  }
  return out;
}

std::string summary_json(const Trace& trace, const TraceSummary& s) {
  using Json = nlohmann::ordered_json;
  Json j;
  j["tasks"] = s.tasks;
  j["slices"] = s.slices;
  j["runs"] = s.runs;
  j["missing_preds"] = s.missing_preds;
  j["span_begin_us"] = s.span_begin_us;
  j["span_us"] = s.span_us;
  Json lanes = Json::array();
  for (const LaneBusy& b : s.lanes) {
    const TraceLane& lane = trace.lanes[b.lane];
    lanes.push_back({{"process", trace.processes[lane.process].name},
                     {"pid", lane.pid},
                     {"tid", lane.tid},
                     {"lane", lane.name},
                     {"tasks", b.tasks},
                     {"busy_us", b.busy_us},
                     {"busy_pct", b.busy_pct}});
  }
  j["lanes"] = std::move(lanes);
  j["overhead"] = {{"tasks", s.overhead.tasks},
                   {"mean_us", s.overhead.mean_us},
                   {"p50_us", s.overhead.p50_us},
                   {"p99_us", s.overhead.p99_us},
                   {"max_us", s.overhead.max_us}};
  Json paths = Json::array();
  for (const CriticalPath& p : s.critical_paths) {
    Json tasks = Json::array();
    for (uint32_t i : p.nodes) {
      const TraceNode& n = trace.nodes[i];
      const TraceTask& t = first_slice(trace, n);
      tasks.push_back({{"task", n.id},
                       {"kernel", trace.kernels[t.kernel]},
                       {"lane", trace.lanes[t.lane].name},
                       {"ts", n.start},
                       {"dur", n.end - n.start},
                       {"blocks", n.slices.size()}});
    }
    paths.push_back({{"pid", p.pid}, {"run", p.run}, {"length_us", p.length_us}, {"tasks", std::move(tasks)}});
  }
  j["critical_paths"] = std::move(paths);
  return j.dump(2) + "\n";
}

}  // namespace simpler::diag
