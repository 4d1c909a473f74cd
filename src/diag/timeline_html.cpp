#include "diag/timeline_html.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/errors.h"
#include "diag/timeline_page.h"

namespace simpler::diag {
namespace {

using Json = nlohmann::json;

// Nanosecond resolution keeps the embedded numbers short (µs with 3 decimals).
double to_ns_grid(double us) { return std::round(us * 1000.0) / 1000.0; }

// Replaces the one occurrence of `marker` in `page` with `content`.
void fill(std::string& page, std::string_view marker, std::string_view content) {
  const size_t at = page.find(marker);
  if (at != std::string::npos) page.replace(at, marker.size(), content);
}

}  // namespace

std::string timeline_data_json(const Trace& trace) {
  double begin = std::numeric_limits<double>::infinity();
  double end = -std::numeric_limits<double>::infinity();
  for (const TraceTask& t : trace.tasks) {
    begin = std::min(begin, t.ts);
    end = std::max(end, t.ts + t.dur);
  }
  if (trace.tasks.empty()) {
    // A trace of other slices only is still drawn, from its own first slice.
    for (const TraceSlice& s : trace.slices) {
      begin = std::min(begin, s.ts);
      end = std::max(end, s.ts + s.dur);
    }
  }
  if (!std::isfinite(begin)) begin = end = 0;

  Json j;
  j["version"] = 1;
  j["t0"] = begin;
  j["span"] = to_ns_grid(end - begin);
  Json processes = Json::array();
  for (const TraceProcess& p : trace.processes) processes.push_back({{"pid", p.pid}, {"name", p.name}});
  j["processes"] = std::move(processes);
  Json lanes = Json::array();
  for (const TraceLane& l : trace.lanes) {
    lanes.push_back({{"process", l.process}, {"tid", l.tid}, {"name", l.name}, {"core", l.core}});
  }
  j["lanes"] = std::move(lanes);
  j["names"] = trace.kernels;

  Json lane = Json::array(), ts = Json::array(), dur = Json::array(), name = Json::array(), id = Json::array(),
       run = Json::array(), pred_off = Json::array(), preds = Json::array();
  uint64_t offset = 0;
  for (const TraceTask& t : trace.tasks) {
    lane.push_back(t.lane);
    ts.push_back(to_ns_grid(t.ts - begin));
    dur.push_back(to_ns_grid(t.dur));
    name.push_back(t.kernel);
    id.push_back(t.id);
    run.push_back(t.run);
    pred_off.push_back(offset);
    for (uint32_t p : t.preds) preds.push_back(p);
    offset += t.preds.size();
  }
  pred_off.push_back(offset);
  j["tasks"] = {{"lane", std::move(lane)},         {"ts", std::move(ts)},      {"dur", std::move(dur)},
                {"name", std::move(name)},         {"id", std::move(id)},      {"run", std::move(run)},
                {"pred_off", std::move(pred_off)}, {"preds", std::move(preds)}};

  std::map<std::string, uint32_t> cat_index;
  Json cats = Json::array();
  Json s_lane = Json::array(), s_ts = Json::array(), s_dur = Json::array(), s_name = Json::array(),
       s_cat = Json::array();
  for (const TraceSlice& s : trace.slices) {
    auto [it, fresh] = cat_index.emplace(s.cat, static_cast<uint32_t>(cats.size()));
    if (fresh) cats.push_back(s.cat);
    s_lane.push_back(s.lane);
    s_ts.push_back(to_ns_grid(s.ts - begin));
    s_dur.push_back(to_ns_grid(s.dur));
    s_name.push_back(s.name);
    s_cat.push_back(it->second);
  }
  j["cats"] = std::move(cats);
  j["slices"] = {{"lane", std::move(s_lane)},
                 {"ts", std::move(s_ts)},
                 {"dur", std::move(s_dur)},
                 {"name", std::move(s_name)},
                 {"cat", std::move(s_cat)}};
  // Inside <script>, "</script" or "<!--" in a kernel name would end or
  // confuse the element; '<' occurs only inside JSON strings, where \u003c
  // reads back as the same character.
  std::string text = j.dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '<') {
      out += "\\u003c";
    } else {
      out += c;
    }
  }
  return out;
}

std::string render_timeline_html(const Trace& trace) {
  std::string page = page::kTimelineHtml;
  // The data goes in last so that a marker inside it is never replaced.
  fill(page, "/*@STYLE@*/", page::kTimelineCss);
  fill(page, "/*@SCRIPT@*/", page::kTimelineJs);
  fill(page, "@TRACE_DATA@", timeline_data_json(trace));
  return page;
}

Result<std::string> write_timeline(const std::string& dir) {
  SIMPLER_ASSIGN_OR_RETURN(Trace trace, read_trace_dir(dir));
  const std::string path = dir + "/timeline.html";
  const std::string tmp = path + ".tmp";
  const std::string page = render_timeline_html(trace);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return failed_precondition("{}: cannot create", tmp);
    out.write(page.data(), static_cast<std::streamsize>(page.size()));
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      return internal_error("{}: write failed", tmp);
    }
  }
  // A reader never sees half a page: the finished file replaces the old one.
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return internal_error("{}: cannot rename to {}", tmp, path);
  }
  return path;
}

}  // namespace simpler::diag
