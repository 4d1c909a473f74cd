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
  for (uint32_t i = 0; i < trace.tasks.size(); ++i) {
    const TraceTask& t = trace.tasks[i];
    auto [it, fresh] = last.emplace(std::make_pair(trace.lanes[t.lane].pid, t.run), i);
    if (!fresh && end_of(t) > end_of(trace.tasks[it->second])) it->second = i;
  }
  std::vector<CriticalPath> out;
  for (const auto& [key, tail] : last) {
    CriticalPath path;
    path.pid = key.first;
    path.run = key.second;
    // The reader refuses cycles, so the walk ends at a task without predecessors.
    uint32_t at = tail;
    for (;;) {
      path.tasks.push_back(at);
      const TraceTask& t = trace.tasks[at];
      if (t.preds.empty()) break;
      uint32_t next = t.preds.front();
      for (uint32_t p : t.preds) {
        if (end_of(trace.tasks[p]) > end_of(trace.tasks[next])) next = p;
      }
      at = next;
    }
    std::reverse(path.tasks.begin(), path.tasks.end());
    path.length_us = end_of(trace.tasks[path.tasks.back()]) - trace.tasks[path.tasks.front()].ts;
    out.push_back(std::move(path));
  }
  return out;
}

}  // namespace

TraceSummary summarize(const Trace& trace) {
  TraceSummary s;
  s.tasks = trace.tasks.size();
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
  for (const TraceTask& t : trace.tasks) {
    if (t.preds.empty()) continue;
    double ready = -std::numeric_limits<double>::infinity();
    for (uint32_t p : t.preds) ready = std::max(ready, end_of(trace.tasks[p]));
    overheads.push_back(t.ts - ready);
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
  std::string out = fmt::format("{} tasks in {} runs over {:.3f} us (first task start to last task end)\n\n", s.tasks,
                                s.runs, s.span_us);
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
    const TraceTask& first = trace.tasks[p.tasks.front()];
    out += fmt::format("  {:<24} {:>8} {:>8} {:>14.3f}\n", trace.processes[trace.lanes[first.lane].process].name, p.run,
                       p.tasks.size(), p.length_us);
    if (p.length_us > longest->length_us) longest = &p;
  }
  out += fmt::format("\nthe longest, pid {} run {}: {:.3f} us through {} tasks\n", longest->pid, longest->run,
                     longest->length_us, longest->tasks.size());
  out += fmt::format("  {:>10} {:<20} {:<8} {:>14} {:>12}\n", "task", "kernel", "lane", "start us", "dur us");
  for (uint32_t i : longest->tasks) {
    const TraceTask& t = trace.tasks[i];
    out += fmt::format("  {:>10} {:<20} {:<8} {:>14.3f} {:>12.3f}\n", t.id, trace.kernels[t.kernel],
                       trace.lanes[t.lane].name, t.ts - s.span_begin_us, t.dur);
  }
  return out;
}

std::string summary_json(const Trace& trace, const TraceSummary& s) {
  using Json = nlohmann::ordered_json;
  Json j;
  j["tasks"] = s.tasks;
  j["runs"] = s.runs;
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
    for (uint32_t i : p.tasks) {
      const TraceTask& t = trace.tasks[i];
      tasks.push_back({{"task", t.id},
                       {"kernel", trace.kernels[t.kernel]},
                       {"lane", trace.lanes[t.lane].name},
                       {"ts", t.ts},
                       {"dur", t.dur}});
    }
    paths.push_back({{"pid", p.pid}, {"run", p.run}, {"length_us", p.length_us}, {"tasks", std::move(tasks)}});
  }
  j["critical_paths"] = std::move(paths);
  return j.dump(2) + "\n";
}

}  // namespace simpler::diag
