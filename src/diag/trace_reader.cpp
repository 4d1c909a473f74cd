#include "diag/trace_reader.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include <tuple>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "base/errors.h"

namespace simpler::diag {
namespace {

using Json = nlohmann::json;

const char* type_name(const Json& v) {
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

// Field readers of one event: each names the event and the field in its error.
class EventFields {
 public:
  EventFields(const Json& e, size_t index, const std::string& source) : e_(e), index_(index), source_(source) {}

  Status missing(const char* field) const { return invalid_argument("{}: event {} has no {}", source_, index_, field); }
  Status wrong(const char* field, const Json& v, const char* expected) const {
    return invalid_argument("{}: event {}: {} is {}, expected {}", source_, index_, field, type_name(v), expected);
  }

  // `label` names the field in messages ("args.task"); by default its key.
  Result<int64_t> integer(const Json& obj, const char* key, const char* label = nullptr) const {
    const char* field = label != nullptr ? label : key;
    auto it = obj.find(key);
    if (it == obj.end()) return missing(field);
    if (!it->is_number_integer()) return wrong(field, *it, "an integer");
    if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(INT64_MAX)) return wrong(field, *it, "an int64");
    return it->get<int64_t>();
  }
  Result<uint64_t> unsigned_integer(const Json& obj, const char* key, const char* label = nullptr) const {
    const char* field = label != nullptr ? label : key;
    auto it = obj.find(key);
    if (it == obj.end()) return missing(field);
    if (!it->is_number_integer() || (!it->is_number_unsigned() && it->get<int64_t>() < 0)) {
      return wrong(field, *it, "a non-negative integer");
    }
    return it->get<uint64_t>();
  }
  // A time in µs: finite and not negative.
  Result<double> time(const char* field) const {
    auto it = e_.find(field);
    if (it == e_.end()) return missing(field);
    if (!it->is_number()) return wrong(field, *it, "a number");
    const double v = it->get<double>();
    if (!std::isfinite(v) || v < 0) {
      return invalid_argument("{}: event {}: {} is {}, expected a finite time >= 0", source_, index_, field, v);
    }
    return v;
  }
  Result<std::string> string(const Json& obj, const char* key, const char* label = nullptr) const {
    const char* field = label != nullptr ? label : key;
    auto it = obj.find(key);
    if (it == obj.end()) return missing(field);
    if (!it->is_string()) return wrong(field, *it, "a string");
    return it->get<std::string>();
  }

 private:
  const Json& e_;
  size_t index_;
  const std::string& source_;
};

struct LaneKey {
  int64_t pid;
  int64_t tid;
  friend bool operator<(const LaneKey& a, const LaneKey& b) { return std::tie(a.pid, a.tid) < std::tie(b.pid, b.tid); }
};

struct LaneDraft {
  std::string name;
  int64_t sort_index = 0;
  bool named = false;
  bool has_sort_index = false;
  bool has_tasks = false;
};

struct TaskDraft {
  LaneKey lane;
  std::string kernel;
  uint64_t id;
  int64_t run;
  double ts;
  double dur;
  std::vector<uint64_t> preds;
  uint32_t event;
};

struct SliceDraft {
  LaneKey lane;
  std::string name;
  std::string cat;
  double ts;
  double dur;
};

bool is_core_name(const std::string& name) {
  size_t digits = 0;
  if (name.rfind("AIC", 0) == 0 && name.rfind("AICPU", 0) != 0) digits = 3;
  if (name.rfind("AIV", 0) == 0) digits = 3;
  if (digits == 0 || name.size() == digits) return false;
  return std::all_of(name.begin() + digits, name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

Result<Json> parse_json(std::string_view text, const std::string& source) {
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    // nlohmann's text names the byte ("at line 3, column 5"); its prefix is noise.
    std::string what = e.what();
    if (const size_t at = what.find("] "); at != std::string::npos) what = what.substr(at + 2);
    return invalid_argument("{}: not valid JSON: {}", source, what);
  }
}

Status read_metadata(const Json& e, const EventFields& f, std::map<int64_t, std::string>& process_names,
                     std::map<LaneKey, LaneDraft>& lanes) {
  SIMPLER_ASSIGN_OR_RETURN(std::string name, f.string(e, "name"));
  SIMPLER_ASSIGN_OR_RETURN(int64_t pid, f.integer(e, "pid"));
  if (name == "process_name" || name == "thread_name" || name == "thread_sort_index") {
    auto args = e.find("args");
    if (args == e.end()) return f.missing("args");
    if (!args->is_object()) return f.wrong("args", *args, "an object");
    if (name == "process_name") {
      SIMPLER_ASSIGN_OR_RETURN(process_names[pid], f.string(*args, "name", "args.name"));
      return Status();
    }
    SIMPLER_ASSIGN_OR_RETURN(int64_t tid, f.integer(e, "tid"));
    LaneDraft& lane = lanes[{pid, tid}];
    if (name == "thread_name") {
      SIMPLER_ASSIGN_OR_RETURN(lane.name, f.string(*args, "name", "args.name"));
      lane.named = true;
    } else {
      SIMPLER_ASSIGN_OR_RETURN(lane.sort_index, f.integer(*args, "sort_index", "args.sort_index"));
      lane.has_sort_index = true;
    }
  }
  return Status();
}

Status read_slice(const Json& e, const EventFields& f, uint32_t index, std::vector<TaskDraft>& tasks,
                  std::vector<SliceDraft>& slices, std::map<LaneKey, LaneDraft>& lanes) {
  SIMPLER_ASSIGN_OR_RETURN(std::string name, f.string(e, "name"));
  SIMPLER_ASSIGN_OR_RETURN(int64_t pid, f.integer(e, "pid"));
  SIMPLER_ASSIGN_OR_RETURN(int64_t tid, f.integer(e, "tid"));
  SIMPLER_ASSIGN_OR_RETURN(double ts, f.time("ts"));
  SIMPLER_ASSIGN_OR_RETURN(double dur, f.time("dur"));
  std::string cat;
  if (auto c = e.find("cat"); c != e.end()) {
    if (!c->is_string()) return f.wrong("cat", *c, "a string");
    cat = c->get<std::string>();
  }
  LaneDraft& lane = lanes[{pid, tid}];
  if (cat != "task") {
    slices.push_back({{pid, tid}, std::move(name), std::move(cat), ts, dur});
    return Status();
  }
  auto args = e.find("args");
  if (args == e.end()) return f.missing("args");
  if (!args->is_object()) return f.wrong("args", *args, "an object");
  TaskDraft t{{pid, tid}, std::move(name), 0, 0, ts, dur, {}, index};
  SIMPLER_ASSIGN_OR_RETURN(t.id, f.unsigned_integer(*args, "task", "args.task"));
  SIMPLER_ASSIGN_OR_RETURN(t.run, f.integer(*args, "run", "args.run"));
  auto preds = args->find("preds");
  if (preds == args->end()) return f.missing("args.preds");
  if (!preds->is_array()) return f.wrong("args.preds", *preds, "an array");
  t.preds.reserve(preds->size());
  for (const Json& p : *preds) {
    if (!p.is_number_integer() || (!p.is_number_unsigned() && p.get<int64_t>() < 0)) {
      return f.wrong("an element of args.preds", p, "a task id");
    }
    t.preds.push_back(p.get<uint64_t>());
  }
  lane.has_tasks = true;
  tasks.push_back(std::move(t));
  return Status();
}

}  // namespace

Result<Trace> parse_trace(std::string_view text, const std::string& source) {
  SIMPLER_ASSIGN_OR_RETURN(Json doc, parse_json(text, source));
  if (!doc.is_object()) {
    return invalid_argument("{}: the top level is {}, expected an object with traceEvents", source, type_name(doc));
  }
  auto other = doc.find("otherData");
  auto version = other != doc.end() && other->is_object() ? other->find("simpler_trace_version") : doc.end();
  if (other == doc.end() || !other->is_object() || version == other->end()) {
    return invalid_argument("{}: no otherData.simpler_trace_version: not a simpler trace", source);
  }
  if (!version->is_number_integer() || version->get<int64_t>() != kTraceVersion) {
    return invalid_argument("{}: otherData.simpler_trace_version is {}, this build reads {}", source, version->dump(),
                            kTraceVersion);
  }
  Trace trace;
  if (auto level = other->find("swimlane_level"); level != other->end() && level->is_number_integer()) {
    trace.swimlane_level = level->get<int>();
  }
  auto events = doc.find("traceEvents");
  if (events == doc.end()) return invalid_argument("{}: no traceEvents", source);
  if (!events->is_array())
    return invalid_argument("{}: traceEvents is {}, expected an array", source, type_name(*events));
  if (events->size() > UINT32_MAX) return invalid_argument("{}: {} events, more than 2^32", source, events->size());

  std::map<int64_t, std::string> process_names;
  std::map<LaneKey, LaneDraft> lane_drafts;
  std::vector<TaskDraft> task_drafts;
  std::vector<SliceDraft> slice_drafts;
  for (size_t i = 0; i < events->size(); ++i) {
    const Json& e = (*events)[i];
    if (!e.is_object()) return invalid_argument("{}: event {} is {}, expected an object", source, i, type_name(e));
    EventFields f(e, i, source);
    SIMPLER_ASSIGN_OR_RETURN(std::string ph, f.string(e, "ph"));
    if (ph == "M") {
      SIMPLER_RETURN_IF_ERROR(read_metadata(e, f, process_names, lane_drafts));
    } else if (ph == "X") {
      SIMPLER_RETURN_IF_ERROR(read_slice(e, f, static_cast<uint32_t>(i), task_drafts, slice_drafts, lane_drafts));
    }
  }

  // Processes: every pid a lane or a name mentions, in pid order.
  std::map<int64_t, uint32_t> process_index;
  for (const auto& [pid, name] : process_names) process_index[pid] = 0;
  for (const auto& [key, lane] : lane_drafts) process_index[key.pid] = 0;
  for (auto& [pid, index] : process_index) {
    index = static_cast<uint32_t>(trace.processes.size());
    auto name = process_names.find(pid);
    trace.processes.push_back({pid, name != process_names.end() ? name->second : fmt::format("pid {}", pid)});
  }

  // Lanes: by process, then sort index (named cores before the rest when
  // none is given), then tid.
  std::vector<std::pair<LaneKey, LaneDraft>> ordered(lane_drafts.begin(), lane_drafts.end());
  std::stable_sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) {
    return std::tie(a.first.pid, a.second.sort_index, a.first.tid) <
           std::tie(b.first.pid, b.second.sort_index, b.first.tid);
  });
  std::map<LaneKey, uint32_t> lane_index;
  for (auto& [key, d] : ordered) {
    lane_index[key] = static_cast<uint32_t>(trace.lanes.size());
    TraceLane lane;
    lane.pid = key.pid;
    lane.tid = key.tid;
    lane.name = d.named ? d.name : fmt::format("tid {}", key.tid);
    lane.sort_index = d.sort_index;
    lane.process = process_index.at(key.pid);
    lane.core = d.has_tasks || is_core_name(lane.name);
    trace.lanes.push_back(std::move(lane));
  }

  std::unordered_map<std::string, uint32_t> name_index;
  auto intern = [&](std::string& name) {
    auto [it, fresh] = name_index.emplace(name, static_cast<uint32_t>(trace.kernels.size()));
    if (fresh) trace.kernels.push_back(std::move(name));
    return it->second;
  };

  std::sort(task_drafts.begin(), task_drafts.end(), [&](const TaskDraft& a, const TaskDraft& b) {
    return std::make_tuple(lane_index.at(a.lane), a.ts, a.event) <
           std::make_tuple(lane_index.at(b.lane), b.ts, b.event);
  });
  // (pid, run, task id) -> its node. A task may have several slices: the
  // blocks of an SPMD task, each run by a core of its own.
  std::map<std::tuple<int64_t, int64_t, uint64_t>, uint32_t> by_id;
  trace.tasks.reserve(task_drafts.size());
  for (TaskDraft& d : task_drafts) {
    const uint32_t index = static_cast<uint32_t>(trace.tasks.size());
    auto [it, fresh] =
        by_id.emplace(std::make_tuple(d.lane.pid, d.run, d.id), static_cast<uint32_t>(trace.nodes.size()));
    if (fresh) trace.nodes.push_back({d.lane.pid, d.run, d.id, d.ts, d.ts + d.dur, {}, {}});
    TraceNode& node = trace.nodes[it->second];
    node.start = std::min(node.start, d.ts);
    node.end = std::max(node.end, d.ts + d.dur);
    node.slices.push_back(index);
    TraceTask t;
    t.lane = lane_index.at(d.lane);
    t.kernel = intern(d.kernel);
    t.id = d.id;
    t.run = d.run;
    t.ts = d.ts;
    t.dur = d.dur;
    t.node = it->second;
    t.event = d.event;
    trace.tasks.push_back(std::move(t));
  }
  for (size_t i = 0; i < task_drafts.size(); ++i) {
    const TaskDraft& d = task_drafts[i];
    TraceTask& t = trace.tasks[i];
    TraceNode& node = trace.nodes[t.node];
    for (uint64_t p : d.preds) {
      if (p == d.id) {
        return invalid_argument("{}: event {}: task {} names itself as a predecessor", source, d.event, d.id);
      }
      auto it = by_id.find(std::make_tuple(d.lane.pid, d.run, p));
      if (it == by_id.end()) {
        // A lane that filled up dropped the predecessor's slice (the file's
        // runs[].dropped counts them): the edge is kept out and counted.
        if (trace.missing_preds++ == 0) {
          trace.first_missing_pred =
              fmt::format("event {}: task {} of pid {} run {} names predecessor {}, which has no slice", d.event, d.id,
                          d.lane.pid, d.run, p);
        }
        continue;
      }
      const TraceNode& pred = trace.nodes[it->second];
      t.preds.insert(t.preds.end(), pred.slices.begin(), pred.slices.end());
      if (std::find(node.preds.begin(), node.preds.end(), it->second) == node.preds.end()) {
        node.preds.push_back(it->second);
      }
    }
  }

  // A cycle through preds is no run's graph (and would loop the chain walks):
  // Kahn's order leaves exactly the tasks on or behind a cycle unvisited.
  std::vector<uint32_t> unmet(trace.nodes.size());
  std::vector<std::vector<uint32_t>> succs(trace.nodes.size());
  std::vector<uint32_t> ready;
  for (uint32_t i = 0; i < trace.nodes.size(); ++i) {
    unmet[i] = static_cast<uint32_t>(trace.nodes[i].preds.size());
    for (uint32_t p : trace.nodes[i].preds) succs[p].push_back(i);
    if (unmet[i] == 0) ready.push_back(i);
  }
  size_t visited = 0;
  while (!ready.empty()) {
    const uint32_t i = ready.back();
    ready.pop_back();
    ++visited;
    for (uint32_t s : succs[i]) {
      if (--unmet[s] == 0) ready.push_back(s);
    }
  }
  if (visited != trace.nodes.size()) {
    for (uint32_t i = 0; i < trace.nodes.size(); ++i) {
      if (unmet[i] != 0) {
        const TraceNode& n = trace.nodes[i];
        return invalid_argument("{}: event {}: task {} of pid {} run {} is on or behind a cycle of predecessors",
                                source, trace.tasks[n.slices.front()].event, n.id, n.pid, n.run);
      }
    }
  }

  std::sort(slice_drafts.begin(), slice_drafts.end(), [&](const SliceDraft& a, const SliceDraft& b) {
    return std::make_tuple(lane_index.at(a.lane), a.ts) < std::make_tuple(lane_index.at(b.lane), b.ts);
  });
  trace.slices.reserve(slice_drafts.size());
  for (SliceDraft& d : slice_drafts) {
    trace.slices.push_back({lane_index.at(d.lane), intern(d.name), std::move(d.cat), d.ts, d.dur});
  }
  return trace;
}

Result<std::string> read_trace_text(const std::string& path, const std::string& dir) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return not_found("{}: no such file (is {} a trace directory?)", path, dir);
  if (!S_ISREG(st.st_mode)) return invalid_argument("{}: not a regular file", path);
  if (static_cast<uint64_t>(st.st_size) > kMaxTraceBytes) {
    return invalid_argument("{}: {} bytes, more than the {} this reader takes", path, st.st_size, kMaxTraceBytes);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("{}: cannot open", path);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return internal_error("{}: read failed", path);
  return text.str();
}

Result<Trace> read_trace_dir(const std::string& dir) {
  const std::string path = dir + "/trace.json";
  SIMPLER_ASSIGN_OR_RETURN(const std::string text, read_trace_text(path, dir));
  return parse_trace(text, path);
}

std::string task_key(const Trace& trace, const TraceTask& task) {
  return fmt::format("{}:{}:{}", trace.lanes[task.lane].pid, task.run, task.id);
}

}  // namespace simpler::diag
