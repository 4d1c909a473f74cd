#include "diag/chrome_trace.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <initializer_list>
#include <iterator>
#include <string_view>
#include <unordered_map>
#include <utility>

#include <unistd.h>

#include <fmt/compile.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/errors.h"

namespace simpler::diag {

namespace {

void append(std::string& out, const std::string& event) {
  if (!out.empty()) out += ",\n";
  out += event;
}

// append() without the event's own string: formatted in place, from a
// format compiled at build time (FMT_COMPILE), since the export formats
// thousands of events per run. Chrome's unit is the microsecond; ns keep
// three decimals, so a timestamp goes in as its two halves, "{}.{:03}" of
// t / 1000 and t % 1000.
template <typename S, typename... T>
void append_formatted(std::string& out, const S& format, T&&... args) {
  if (!out.empty()) out += ",\n";
  fmt::format_to(std::back_inserter(out), format, std::forward<T>(args)...);
}

// A kernel name as JSON string contents, escaped once per distinct name.
class EscapedNames {
 public:
  const std::string& operator()(const char* name) {
    auto it = cache_.find(name);
    if (it == cache_.end()) it = cache_.emplace(name, json_escape(name)).first;
    return it->second;
  }

 private:
  std::unordered_map<const char*, std::string> cache_;
};

struct TaskSlices {
  // The first start and the last end over the task's subtasks, with their lanes.
  uint64_t first_begin = UINT64_MAX;
  uint32_t first_tid = 0;
  uint64_t last_end = 0;
  uint32_t last_tid = 0;
  bool ran() const { return first_begin != UINT64_MAX; }
};

}  // namespace

std::string json_escape(const char* s) {
  std::string out;
  if (s == nullptr) return "?";
  for (const char* p = s; *p != '\0'; ++p) {
    const unsigned char c = static_cast<unsigned char>(*p);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      out += fmt::format("\\u{:04x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

uint64_t render_chip_run(const ChipRunTrace& r, uint64_t& next_flow_id, std::string& events) {
  const Recorder& rec = *r.recorder;
  const int64_t off = r.clock_offset_ns;
  uint64_t dropped = 0;
  EscapedNames escaped;
  append(events, fmt::format(R"({{"name":"process_name","ph":"M","pid":{},"tid":0,"args":{{"name":"{}"}}}})", r.pid,
                             json_escape(r.label.c_str())));
  const auto thread_name = [&](const LaneInfo& info) {
    append(events, fmt::format(R"({{"name":"thread_name","ph":"M","pid":{},"tid":{},"args":{{"name":"{}"}}}})", r.pid,
                               info.tid, info.name));
    append(events,
           fmt::format(R"({{"name":"thread_sort_index","ph":"M","pid":{},"tid":{},"args":{{"sort_index":{}}}}})", r.pid,
                       info.tid, info.tid));
  };
  for (uint32_t c = 0; c < rec.cores(); ++c) thread_name(Recorder::core_info(c));
  for (uint32_t a = 0; a < rec.aicpu_threads(); ++a) thread_name(rec.aicpu_info(a));
  const LaneInfo orch{"Orchestrator", rec.orchestrator_tid()};
  thread_name(orch);

  // The run's graph, from its orchestrator lane.
  std::vector<std::vector<uint32_t>> preds;
  std::vector<std::pair<uint32_t, uint32_t>> edges;  // (producer, consumer)
  if (r.orchestrator != nullptr) {
    const Lane& o = *r.orchestrator;
    dropped += o.dropped();
    for (uint64_t i = 0, n = o.end(); i < n; ++i) {
      const Event& e = o.at(i);
      if (e.kind == EventKind::kEdge) {
        if (preds.size() <= e.task) preds.resize(size_t{e.task} + 1);
        auto& p = preds[e.task];
        if (std::find(p.begin(), p.end(), e.aux) != p.end()) continue;
        p.push_back(e.aux);
        edges.emplace_back(e.aux, e.task);
      } else if (e.kind == EventKind::kSubmit && r.level >= 4) {
        const int64_t t = static_cast<int64_t>(e.begin_ns) + off;
        const uint64_t d = e.end_ns > e.begin_ns ? e.end_ns - e.begin_ns : 0;
        append_formatted(events,
                         FMT_COMPILE(R"({{"name":"submit {}","cat":"submit","ph":"X","pid":{},"tid":{},"ts":{}.{:03},)"
                                     R"("dur":{}.{:03},"args":{{"task":{},"run":{}}}}})"),
                         escaped(e.name), r.pid, orch.tid, t / 1000, t % 1000, d / 1000, d % 1000, e.task, r.run);
      }
    }
  }
  const std::vector<uint32_t> no_preds;
  const auto preds_of = [&](uint32_t task) -> const std::vector<uint32_t>& {
    return task < preds.size() ? preds[task] : no_preds;
  };

  std::vector<TaskSlices> slices;  // by task id (dense within a run)
  for (uint32_t c = 0; c < rec.cores(); ++c) {
    const Lane& lane = rec.core_lane(c);
    if (!lane.allocated() || c >= r.window.core_begin.size()) continue;
    dropped += lane.dropped() - r.window.core_dropped[c];
    const LaneInfo info = Recorder::core_info(c);
    for (uint64_t i = r.window.core_begin[c], n = lane.end(); i < n; ++i) {
      const Event& e = lane.at(i);
      if (e.kind != EventKind::kTask || e.run != r.run) continue;
      const int64_t t = static_cast<int64_t>(e.begin_ns) + off;
      const uint64_t d = e.end_ns > e.begin_ns ? e.end_ns - e.begin_ns : 0;
      append_formatted(
          events,
          FMT_COMPILE(R"({{"name":"{}","cat":"task","ph":"X","pid":{},"tid":{},"ts":{}.{:03},"dur":{}.{:03},)"
                      R"("args":{{"task":{},"run":{},"func_id":{},"core":"{}","preds":[)"),
          escaped(e.name), r.pid, info.tid, t / 1000, t % 1000, d / 1000, d % 1000, e.task, r.run, e.aux, info.name);
      const std::vector<uint32_t>& ps = preds_of(e.task);
      for (size_t k = 0; k < ps.size(); ++k) {
        if (k != 0) events += ',';
        events += fmt::format_int(ps[k]).c_str();
      }
      events += "]}}";
      if (slices.size() <= e.task) slices.resize(size_t{e.task} + 1);
      TaskSlices& s = slices[e.task];
      if (e.begin_ns < s.first_begin) {
        s.first_begin = e.begin_ns;
        s.first_tid = info.tid;
      }
      if (e.end_ns >= s.last_end) {
        s.last_end = e.end_ns;
        s.last_tid = info.tid;
      }
    }
  }
  // One flow pair per edge whose both ends ran (a poisoned task has no slice).
  for (auto [from, to] : edges) {
    if (from >= slices.size() || to >= slices.size()) continue;
    const TaskSlices& p = slices[from];
    const TaskSlices& c = slices[to];
    if (!p.ran() || !c.ran()) continue;
    const uint64_t id = next_flow_id++;
    const int64_t ts = static_cast<int64_t>(p.last_end) + off;
    const int64_t tf = static_cast<int64_t>(c.first_begin) + off;
    append_formatted(events,
                     FMT_COMPILE(R"({{"ph":"s","cat":"dep","name":"dep","id":{},"pid":{},"tid":{},"ts":{}.{:03}}})"),
                     id, r.pid, p.last_tid, ts / 1000, ts % 1000);
    append_formatted(
        events,
        FMT_COMPILE(R"({{"ph":"f","bp":"e","cat":"dep","name":"dep","id":{},"pid":{},"tid":{},"ts":{}.{:03}}})"), id,
        r.pid, c.first_tid, tf / 1000, tf % 1000);
  }

  if (r.level >= 2) {
    for (uint32_t a = 0; a < rec.aicpu_threads(); ++a) {
      const Lane& lane = rec.aicpu_lane(a);
      if (!lane.allocated() || a >= r.window.aicpu_begin.size()) continue;
      dropped += lane.dropped() - r.window.aicpu_dropped[a];
      const LaneInfo info = rec.aicpu_info(a);
      for (uint64_t i = r.window.aicpu_begin[a], n = lane.end(); i < n; ++i) {
        const Event& e = lane.at(i);
        const int64_t t = static_cast<int64_t>(e.begin_ns) + off;
        const uint64_t d = e.end_ns > e.begin_ns ? e.end_ns - e.begin_ns : 0;
        if ((e.kind == EventKind::kDispatch || e.kind == EventKind::kFinish) && e.run == r.run) {
          append_formatted(events,
                           FMT_COMPILE(R"({{"name":"{} {}","cat":"dispatch","ph":"X","pid":{},"tid":{},"ts":{}.{:03},)"
                                       R"("dur":{}.{:03},"args":{{"task":{},"run":{}}}}})"),
                           e.kind == EventKind::kDispatch ? "dispatch" : "finish", escaped(e.name), r.pid, info.tid,
                           t / 1000, t % 1000, d / 1000, d % 1000, e.task, r.run);
        } else if (e.kind == EventKind::kSched && r.level >= 3 && e.begin_ns >= r.launch_ns && e.begin_ns <= r.end_ns) {
          append_formatted(
              events,
              FMT_COMPILE(R"({{"name":"{}","cat":"sched","ph":"X","pid":{},"tid":{},"ts":{}.{:03},"dur":{}.{:03}}})"),
              escaped(e.name), r.pid, info.tid, t / 1000, t % 1000, d / 1000, d % 1000);
        }
      }
    }
  }
  return dropped;
}

namespace {

// The document around the events: what goes before them and after.
std::pair<std::string, std::string> document_frame(uint32_t level, const std::vector<TraceRunEntry>& runs) {
  std::vector<std::string> entries;
  for (const TraceRunEntry& e : runs) {
    entries.push_back(fmt::format(R"({{"run":{},"pid":{},"label":"{}","dropped":{}}})", e.run, e.pid,
                                  json_escape(e.label.c_str()), e.dropped));
  }
  return {
      fmt::format("{{\"displayTimeUnit\":\"ns\",\n\"otherData\":{{\"simpler_trace_version\":{},\"swimlane_level\":{},"
                  "\"runs\":[{}]}},\n\"traceEvents\":[\n",
                  kTraceFormatVersion, level, fmt::join(entries, ",")),
      "\n]}\n"};
}

Status write_trace_parts(const std::string& dir, uint64_t run, std::initializer_list<std::string_view> parts) {
  const std::string path = (std::filesystem::path(dir) / "trace.json").string();
  const std::string tmp = fmt::format("{}.{}.{}.tmp", path, ::getpid(), run);
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return failed_precondition("trace: cannot open '{}' for writing", tmp);
  bool wrote = true;
  for (std::string_view part : parts) wrote = wrote && std::fwrite(part.data(), 1, part.size(), f) == part.size();
  const bool closed = std::fclose(f) == 0;
  std::error_code ec;
  if (wrote && closed) {
    // The previous run's file goes first: a rename over an existing file
    // makes ext4 (auto_da_alloc) write the new one to disk at once, which
    // costs every traced run a flush. A reader may find no file for that
    // instant, never a partial one.
    std::filesystem::remove(path, ec);
    std::filesystem::rename(tmp, path, ec);
  }
  if (!wrote || !closed || ec) {
    std::filesystem::remove(tmp, ec);
    return failed_precondition("trace: writing '{}' failed", path);
  }
  return Status();
}

// A retired run's events are rendered into a buffer its exporting thread
// keeps, so a stream of traced runs does not map and fault in a fresh
// buffer per run; one left larger than this by a huge run is let go.
constexpr size_t kKeptRenderBytes = 4 << 20;

}  // namespace

std::string trace_document(uint32_t level, const std::vector<TraceRunEntry>& runs, const std::string& events) {
  auto [head, tail] = document_frame(level, runs);
  return head + events + tail;
}

Status write_trace_file(const std::string& dir, uint64_t run, const std::string& document) {
  return write_trace_parts(dir, run, {document});
}

Status export_chip_run(const std::string& dir, const ChipRunTrace& run) {
  thread_local std::string events;
  events.clear();
  uint64_t flow = 1;
  const uint64_t dropped = render_chip_run(run, flow, events);
  const auto [head, tail] = document_frame(run.level, {{run.run, run.pid, run.label, dropped}});
  Status written = write_trace_parts(dir, run.run, {head, events, tail});
  if (events.capacity() > kKeptRenderBytes) std::string().swap(events);
  return written;
}

}  // namespace simpler::diag
