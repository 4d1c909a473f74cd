// A generator of trace.json files in the exact format the recorder writes
// (docs/diagnostics.md, "The file"): process and lane metadata, one task
// slice per task with its args, a flow pair per dependency edge, and other
// slices on AICPU/host lanes. Test-thread use only.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace simpler::testing {

struct GenTask {
  int64_t pid;
  std::string lane;    // "AIV0", "AIC1", ...
  std::string kernel;  // the slice's name
  uint64_t id;
  int64_t run;
  double ts;  // µs
  double dur;
  std::vector<uint64_t> preds;
};

struct GenSlice {
  int64_t pid;
  std::string lane;  // "AICPU0", "Orchestrator", "Scheduler"
  std::string cat;   // "dispatch", "sched", "submit", "host"
  std::string name;
  double ts;
  double dur;
};

class TraceGen {
 public:
  // A process and its lanes (tids 1, 2, ... in the order given, each with a
  // thread_name and a thread_sort_index).
  void process(int64_t pid, const std::string& name, const std::vector<std::string>& lanes) {
    procs_.push_back({pid, name});
    for (const std::string& l : lanes) {
      const int64_t tid = static_cast<int64_t>(tids_[pid].size()) + 1;
      tids_[pid][l] = tid;
      lane_order_.push_back({pid, l});
    }
  }
  void task(GenTask t) { tasks_.push_back(std::move(t)); }
  void slice(GenSlice s) { slices_.push_back(std::move(s)); }

  int64_t tid(int64_t pid, const std::string& lane) const { return tids_.at(pid).at(lane); }
  size_t lane_count() const { return lane_order_.size(); }
  size_t task_count() const { return tasks_.size(); }

  nlohmann::json json() const {
    using Json = nlohmann::json;
    Json events = Json::array();
    for (const auto& [pid, name] : procs_) {
      events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", name}}}});
    }
    int64_t sort = 0;
    for (const auto& [pid, lane] : lane_order_) {
      const int64_t t = tid(pid, lane);
      events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", t}, {"args", {{"name", lane}}}});
      events.push_back(
          {{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", pid}, {"tid", t}, {"args", {{"sort_index", sort++}}}});
    }
    std::map<std::tuple<int64_t, int64_t, uint64_t>, const GenTask*> by_id;
    for (const GenTask& t : tasks_) by_id[{t.pid, t.run, t.id}] = &t;
    uint64_t flow = 0;
    for (const GenTask& t : tasks_) {
      Json preds = Json::array();
      for (uint64_t p : t.preds) preds.push_back(p);
      events.push_back(
          {{"name", t.kernel},
           {"cat", "task"},
           {"ph", "X"},
           {"pid", t.pid},
           {"tid", tid(t.pid, t.lane)},
           {"ts", t.ts},
           {"dur", t.dur},
           {"args", {{"task", t.id}, {"run", t.run}, {"func_id", 0}, {"core", t.lane}, {"preds", std::move(preds)}}}});
      for (uint64_t p : t.preds) {
        auto it = by_id.find({t.pid, t.run, p});
        if (it == by_id.end()) continue;  // a test of a dangling predecessor: no flow to draw
        const GenTask& prod = *it->second;
        events.push_back({{"ph", "s"},
                          {"cat", "dep"},
                          {"name", "dep"},
                          {"id", flow},
                          {"pid", t.pid},
                          {"tid", tid(prod.pid, prod.lane)},
                          {"ts", prod.ts + prod.dur}});
        events.push_back({{"ph", "f"},
                          {"bp", "e"},
                          {"cat", "dep"},
                          {"name", "dep"},
                          {"id", flow},
                          {"pid", t.pid},
                          {"tid", tid(t.pid, t.lane)},
                          {"ts", t.ts}});
        ++flow;
      }
    }
    for (const GenSlice& s : slices_) {
      events.push_back({{"name", s.name},
                        {"cat", s.cat},
                        {"ph", "X"},
                        {"pid", s.pid},
                        {"tid", tid(s.pid, s.lane)},
                        {"ts", s.ts},
                        {"dur", s.dur},
                        {"args", Json::object()}});
    }
    std::set<std::pair<int64_t, int64_t>> runs_seen;
    Json runs = Json::array();
    for (const GenTask& t : tasks_) {
      if (!runs_seen.insert({t.pid, t.run}).second) continue;
      std::string label;
      for (const auto& [pid, name] : procs_) {
        if (pid == t.pid) label = name;
      }
      runs.push_back({{"run", t.run}, {"pid", t.pid}, {"label", label}});
    }
    return {{"displayTimeUnit", "ns"},
            {"otherData", {{"simpler_trace_version", 1}, {"swimlane_level", 2}, {"runs", std::move(runs)}}},
            {"traceEvents", std::move(events)}};
  }

  // Writes DIR/trace.json (creating DIR).
  void write(const std::filesystem::path& dir) const {
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "trace.json") << json().dump();
  }

 private:
  std::vector<std::pair<int64_t, std::string>> procs_;
  std::map<int64_t, std::map<std::string, int64_t>> tids_;
  std::vector<std::pair<int64_t, std::string>> lane_order_;
  std::vector<GenTask> tasks_;
  std::vector<GenSlice> slices_;
};

}  // namespace simpler::testing
