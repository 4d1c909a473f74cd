#include "diag/trace_merge.h"

#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/errors.h"
#include "diag/chrome_trace.h"
#include "diag/trace_reader.h"

namespace simpler::diag {

namespace {

using Json = nlohmann::json;

std::string us(uint64_t ns) { return fmt::format("{}.{:03}", ns / 1000, ns % 1000); }

void append(std::string& out, const std::string& event) {
  if (!out.empty()) out += ",\n";
  out += event;
}

void render_host(const HostTrace& h, std::string& events) {
  append(events, fmt::format(R"({{"name":"process_name","ph":"M","pid":{},"tid":0,"args":{{"name":"{}"}}}})", h.pid,
                             json_escape(h.label.c_str())));
  for (const LaneInfo& lane : h.lanes) {
    append(events, fmt::format(R"({{"name":"thread_name","ph":"M","pid":{},"tid":{},"args":{{"name":"{}"}}}})", h.pid,
                               lane.tid, json_escape(lane.name.c_str())));
    append(events,
           fmt::format(R"({{"name":"thread_sort_index","ph":"M","pid":{},"tid":{},"args":{{"sort_index":{}}}}})", h.pid,
                       lane.tid, lane.tid));
  }
  for (const HostSlice& s : h.slices) {
    const uint64_t dur = s.end_ns > s.begin_ns ? s.end_ns - s.begin_ns : 0;
    append(events,
           fmt::format(R"({{"name":"{}","cat":"host","ph":"X","pid":{},"tid":{},"ts":{},"dur":{},"args":{{{}}}}})",
                       json_escape(s.name.c_str()), h.pid, s.tid, us(s.begin_ns), us(dur), s.args_json));
  }
}

// Splices one fragment's events into `events`, renumbering its flow ids
// above `next_flow_id` (which it advances past them) and prefixing its
// process labels. Its runs go to `runs` with their labels prefixed.
Status splice(const Json& doc, const TraceFragment& f, const std::string& prefix, uint64_t& next_flow_id,
              std::string& events, std::vector<std::string>& runs, uint32_t& level) {
  if (!doc.is_object()) return invalid_argument("{}: the top level is not an object", f.path);
  auto other = doc.find("otherData");
  if (other == doc.end() || !other->is_object()) return invalid_argument("{}: no otherData", f.path);
  auto version = other->find("simpler_trace_version");
  if (version == other->end() || !version->is_number_integer() || version->get<int64_t>() != kTraceFormatVersion) {
    return invalid_argument("{}: otherData.simpler_trace_version is not {}", f.path, kTraceFormatVersion);
  }
  if (auto l = other->find("swimlane_level"); l != other->end() && l->is_number_unsigned()) {
    level = std::max(level, l->get<uint32_t>());
  }
  // Another host's pids may be this one's: a remote fragment's move to their own range.
  const int64_t pid_shift = f.remote_rank >= 0 ? int64_t{f.remote_rank} << kRemotePidShift : 0;
  if (auto r = other->find("runs"); r != other->end()) {
    if (!r->is_array()) return invalid_argument("{}: otherData.runs is not an array", f.path);
    for (Json run : *r) {
      if (!run.is_object()) return invalid_argument("{}: an entry of otherData.runs is not an object", f.path);
      if (auto label = run.find("label"); label != run.end() && label->is_string()) {
        *label = prefix + label->get<std::string>();
      }
      if (auto pid = run.find("pid"); pid != run.end() && pid->is_number_integer() && pid_shift != 0) {
        *pid = pid->get<int64_t>() + pid_shift;
      }
      runs.push_back(run.dump());
    }
  }
  auto list = doc.find("traceEvents");
  if (list == doc.end() || !list->is_array()) return invalid_argument("{}: no traceEvents array", f.path);
  const double offset_us = static_cast<double>(f.clock_offset_ns) / 1000.0;
  uint64_t max_id = 0;
  for (size_t i = 0; i < list->size(); ++i) {
    Json e = (*list)[i];
    if (!e.is_object()) return invalid_argument("{}: event {} is not an object", f.path, i);
    auto pid = e.find("pid");
    if (pid == e.end() || !pid->is_number_integer())
      return invalid_argument("{}: event {} has no integer pid", f.path, i);
    if (pid_shift != 0) *pid = pid->get<int64_t>() + pid_shift;
    if (auto id = e.find("id"); id != e.end()) {
      if (!id->is_number_unsigned()) return invalid_argument("{}: event {}: id is not an unsigned integer", f.path, i);
      const uint64_t v = id->get<uint64_t>();
      if (v > UINT32_MAX) return invalid_argument("{}: event {}: flow id {} is out of range", f.path, i, v);
      max_id = std::max(max_id, v);
      *id = next_flow_id + v;
    }
    if (auto ts = e.find("ts"); ts != e.end() && offset_us != 0) {
      if (!ts->is_number()) return invalid_argument("{}: event {}: ts is not a number", f.path, i);
      *ts = ts->get<double>() + offset_us;
    }
    if (e.value("ph", "") == "M" && e.value("name", "") == "process_name") {
      auto args = e.find("args");
      if (args == e.end() || !args->is_object() || !args->contains("name") || !(*args)["name"].is_string()) {
        return invalid_argument("{}: event {}: process_name without args.name", f.path, i);
      }
      (*args)["name"] = prefix + (*args)["name"].get<std::string>();
    }
    append(events, e.dump());
  }
  next_flow_id += max_id + 1;
  return Status();
}

}  // namespace

Result<MergedTrace> merge_trace(const HostTrace& host, const std::vector<TraceFragment>& fragments,
                                const std::string& label_prefix) {
  MergedTrace out;
  std::string events;
  render_host(host, events);
  std::vector<std::string> runs{fmt::format(R"({{"run":{},"pid":{},"label":"{}","dropped":0}})", host.run, host.pid,
                                            json_escape(host.label.c_str()))};
  uint32_t level = host.level;
  uint64_t next_flow_id = 1;
  std::vector<std::string> remote;
  for (const TraceFragment& f : fragments) {
    if (f.remote_rank >= 0) {
      remote.push_back(fmt::format(
          R"({{"path":"{}","rank":{},"clock_offset_ns":{},"clock_rtt_ns":{}{}}})", json_escape(f.path.c_str()),
          f.remote_rank, f.clock_offset_ns, f.clock_rtt_ns,
          f.refused.empty() ? std::string() : fmt::format(R"(,"refused":"{}")", json_escape(f.refused.c_str()))));
    }
    std::error_code ec;
    if (!f.refused.empty() || !std::filesystem::exists(f.path, ec)) {
      out.missing.push_back(f.path);
      continue;
    }
    SIMPLER_ASSIGN_OR_RETURN(const std::string text,
                             read_trace_text(f.path, std::filesystem::path(f.path).parent_path()));
    Json doc;
    try {
      doc = Json::parse(text);
    } catch (const Json::exception& e) {
      return invalid_argument("{}: not valid JSON: {}", f.path, e.what());
    }
    SIMPLER_RETURN_IF_ERROR(splice(doc, f, label_prefix, next_flow_id, events, runs, level));
    ++out.fragments;
  }
  std::vector<std::string> missing;
  for (const std::string& m : out.missing) missing.push_back(fmt::format("\"{}\"", json_escape(m.c_str())));
  out.document = fmt::format(
      "{{\"displayTimeUnit\":\"ns\",\n\"otherData\":{{\"simpler_trace_version\":{},\"swimlane_level\":{},"
      "\"runs\":[{}],\"fragments_missing\":[{}],\"remote_fragments\":[{}]}},\n\"traceEvents\":[\n{}\n]}}\n",
      kTraceFormatVersion, level, fmt::join(runs, ","), fmt::join(missing, ","), fmt::join(remote, ","), events);
  return out;
}

}  // namespace simpler::diag
