// Issue 12, reading a trace: the reader on well-formed and malformed
// trace.json files, `simpler trace summary` (busy %, scheduler overhead,
// critical path) on hand-built traces with known answers, the timeline page's
// data, the two commands, and the page itself in headless Chromium.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "diag/timeline_html.h"
#include "diag/trace_reader.h"
#include "diag/trace_summary.h"
#include "health_scan.h"
#include "test_util.h"
#include "trace_gen.h"

namespace {

namespace fs = std::filesystem;
using simpler::StatusCode;
using simpler::diag::Trace;
using simpler::testing::CommandResult;
using simpler::testing::GenSlice;
using simpler::testing::GenTask;
using simpler::testing::run_command;
using simpler::testing::TraceGen;

// A fresh directory under the build's temp area, removed with the fixture.
class TraceDir : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           fmt::format("simpler_trace_{}_{}_{}", info->test_suite_name(), info->name(), ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  fs::path dir_;
};

Trace parse_ok(const TraceGen& g) {
  auto t = simpler::diag::parse_trace(g.json().dump());
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? std::move(*t) : Trace{};
}

// The index of task `id` of (pid, run) in the model.
uint32_t index_of(const Trace& t, int64_t pid, int64_t run, uint64_t id) {
  for (uint32_t i = 0; i < t.tasks.size(); ++i) {
    if (t.lanes[t.tasks[i].lane].pid == pid && t.tasks[i].run == run && t.tasks[i].id == id) return i;
  }
  ADD_FAILURE() << "no task " << pid << ":" << run << ":" << id;
  return 0;
}

std::vector<uint64_t> ids_of(const Trace& t, const std::vector<uint32_t>& indices) {
  std::vector<uint64_t> out;
  for (uint32_t i : indices) out.push_back(t.tasks[i].id);
  return out;
}

// The task ids along a critical path.
std::vector<uint64_t> path_ids(const Trace& t, const simpler::diag::CriticalPath& p) {
  std::vector<uint64_t> out;
  for (uint32_t n : p.nodes) out.push_back(t.nodes[n].id);
  return out;
}

// A chain A -> B -> C over two cores, times in µs:
//   A 0..10 on AIV0, B 12..20 on AIV1, C 25..30 on AIV0.
TraceGen chain_trace() {
  TraceGen g;
  g.process(1, "chip0", {"AIC0", "AIV0", "AIV1", "AICPU0"});
  g.task({1, "AIV0", "load", 1, 0, 100.0, 10.0, {}});
  g.task({1, "AIV1", "scale", 2, 0, 112.0, 8.0, {1}});
  g.task({1, "AIV0", "store", 3, 0, 125.0, 5.0, {2}});
  g.slice({1, "AICPU0", "dispatch", "dispatch load", 99.0, 1.0});
  return g;
}

// A diamond A -> {B, C} -> D, and E independent of it, ending before D:
//   A 0..10 (AIV0), B 10..30 (AIV0), C 11..15 (AIV1), D 32..40 (AIV1), E 0..35 (AIC0).
TraceGen diamond_trace(int64_t pid = 1, int64_t run = 0) {
  TraceGen g;
  g.process(pid, "chip0", {"AIC0", "AIV0", "AIV1", "AICPU0", "AICPU1"});
  g.task({pid, "AIV0", "a", 10, run, 0.0, 10.0, {}});
  g.task({pid, "AIV0", "b", 11, run, 10.0, 20.0, {10}});
  g.task({pid, "AIV1", "c", 12, run, 11.0, 4.0, {10}});
  g.task({pid, "AIV1", "d", 13, run, 32.0, 8.0, {11, 12}});
  g.task({pid, "AIC0", "e", 14, run, 0.0, 35.0, {}});
  g.slice({pid, "AICPU0", "sched", "poll", 0.0, 5.0});
  g.slice({pid, "AICPU1", "dispatch", "dispatch d", 31.0, 1.0});
  return g;
}

// ---- the reader -------------------------------------------------------------

TEST(TraceReader, ReadsProcessesLanesTasksAndResolvesPredecessors) {
  TraceGen g = diamond_trace();
  g.process(2, "chip1", {"AIV0"});
  g.task({2, "AIV0", "a", 10, 0, 5.0, 1.0, {}});  // the same id in another process is another task
  const Trace t = parse_ok(g);
  ASSERT_EQ(t.processes.size(), 2u);
  EXPECT_EQ(t.processes[0].name, "chip0");
  EXPECT_EQ(t.processes[1].name, "chip1");
  ASSERT_EQ(t.lanes.size(), 6u);
  EXPECT_EQ(t.lanes[0].name, "AIC0");
  EXPECT_EQ(t.lanes[3].name, "AICPU0");
  EXPECT_TRUE(t.lanes[0].core);
  EXPECT_FALSE(t.lanes[3].core);
  EXPECT_EQ(t.lanes[5].pid, 2);
  ASSERT_EQ(t.tasks.size(), 6u);
  EXPECT_EQ(t.slices.size(), 2u);
  const auto& d = t.tasks[index_of(t, 1, 0, 13)];
  EXPECT_EQ(t.kernels[d.kernel], "d");
  EXPECT_DOUBLE_EQ(d.ts, 32.0);
  EXPECT_DOUBLE_EQ(d.dur, 8.0);
  EXPECT_EQ(ids_of(t, d.preds), (std::vector<uint64_t>{11, 12}));
  EXPECT_EQ(simpler::diag::task_key(t, d), "1:0:13");
  // Tasks are ordered by lane, then start.
  for (size_t i = 1; i < t.tasks.size(); ++i) {
    const auto& a = t.tasks[i - 1];
    const auto& b = t.tasks[i];
    EXPECT_TRUE(a.lane < b.lane || (a.lane == b.lane && a.ts <= b.ts)) << i;
  }
}

TEST(TraceReader, RefusesMalformedAndForeignFilesNamingWhatIsWrong) {
  const std::string head = R"({"otherData":{"simpler_trace_version":1},"traceEvents":[)";
  const std::string meta = R"({"name":"thread_name","ph":"M","pid":1,"tid":1,"args":{"name":"AIV0"}},)";
  auto task = [](const std::string& fields) {
    return R"({"name":"k","cat":"task","ph":"X","pid":1,"tid":1,)" + fields + "}";
  };
  const std::string args0 = R"("args":{"task":0,"run":0,"preds":[]})";
  struct Case {
    std::string text;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"", "not valid JSON"},
      {"{\"traceEvents\": [", "not valid JSON"},
      {"[]", "the top level is an array"},
      {R"({"traceEvents":[]})", "no otherData.simpler_trace_version: not a simpler trace"},
      {R"({"otherData":{"simpler_trace_version":2},"traceEvents":[]})",
       "simpler_trace_version is 2, this build reads 1"},
      {R"({"otherData":{"simpler_trace_version":1}})", "no traceEvents"},
      {R"({"otherData":{"simpler_trace_version":1},"traceEvents":{}})", "traceEvents is an object, expected an array"},
      {head + "7]}", "event 0 is a number, expected an object"},
      {head + meta + R"({"name":"x"}]})", "event 1 has no ph"},
      {head + meta + task(R"("dur":1,)" + args0) + "]}", "event 1 has no ts"},
      {head + meta + task(R"("ts":"5","dur":1,)" + args0) + "]}", "event 1: ts is a string, expected a number"},
      {head + meta + task(R"("ts":5,"dur":-1,)" + args0) + "]}", "event 1: dur is -1, expected a finite time >= 0"},
      {head + meta + task(R"("ts":5)") + "]}", "event 1 has no dur"},
      {head + meta + task(R"("ts":5,"dur":1)") + "]}", "event 1 has no args"},
      {head + meta + task(R"("ts":5,"dur":1,"args":{"run":0,"preds":[]})") + "]}", "event 1 has no args.task"},
      {head + meta + task(R"("ts":5,"dur":1,"args":{"task":-3,"run":0,"preds":[]})") + "]}",
       "event 1: args.task is a number, expected a non-negative integer"},
      {head + meta + task(R"("ts":5,"dur":1,"args":{"task":0,"run":0})") + "]}", "event 1 has no args.preds"},
      {head + meta + task(R"("ts":5,"dur":1,"args":{"task":0,"run":0,"preds":3})") + "]}",
       "event 1: args.preds is a number, expected an array"},
      {head + meta + task(R"("ts":5,"dur":1,"args":{"task":0,"run":0,"preds":["x"]})") + "]}",
       "an element of args.preds is a string, expected a task id"},
      {head + meta + task(R"("ts":5,"dur":1,"args":{"task":0,"run":0,"preds":[0]})") + "]}",
       "task 0 names itself as a predecessor"},
      {head + meta + task(R"("ts":5,"dur":1,"args":{"task":0,"run":0,"preds":[1]})") + "," +
           task(R"("ts":7,"dur":1,"args":{"task":1,"run":0,"preds":[0]})") + "]}",
       "is on or behind a cycle of predecessors"},
      {head + R"({"name":"k","cat":"task","ph":"X","pid":"one","tid":1,"ts":1,"dur":1,)" + args0 + "}]}",
       "event 0: pid is a string, expected an integer"},
      {head + R"({"name":"thread_name","ph":"M","pid":1,"tid":1,"args":{}}]})", "event 0 has no args.name"},
  };
  for (const Case& c : cases) {
    auto r = simpler::diag::parse_trace(c.text, "trace.json");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(r.status().message().find(c.expected), std::string::npos)
        << "input: " << c.text << "\nmessage: " << r.status().message() << "\nexpected: " << c.expected;
    EXPECT_EQ(r.status().message().rfind("trace.json", 0), 0u) << r.status().message();
  }
}

// An SPMD task has a slice per block, all with its id; the graph has one
// node for it, from its first block's start to its last block's end.
TEST(TraceReader, TheBlocksOfAnSpmdTaskAreOneTaskOfTheGraph) {
  TraceGen g;
  g.process(1, "chip0", {"AIV0", "AIV1", "AIV2"});
  g.task({1, "AIV0", "load", 1, 0, 0.0, 5.0, {}});
  g.task({1, "AIV0", "spmd", 2, 0, 6.0, 4.0, {1}});
  g.task({1, "AIV1", "spmd", 2, 0, 7.0, 10.0, {1}});  // the last block ends at 17
  g.task({1, "AIV2", "spmd", 2, 0, 8.0, 2.0, {1}});
  g.task({1, "AIV0", "store", 3, 0, 20.0, 1.0, {2}});
  const Trace t = parse_ok(g);
  EXPECT_EQ(t.tasks.size(), 5u);
  ASSERT_EQ(t.nodes.size(), 3u);
  const auto& spmd = t.nodes[t.tasks[index_of(t, 1, 0, 2)].node];
  EXPECT_EQ(spmd.slices.size(), 3u);
  EXPECT_DOUBLE_EQ(spmd.start, 6.0);
  EXPECT_DOUBLE_EQ(spmd.end, 17.0);
  // The consumer's predecessors are every block (the page highlights them all).
  EXPECT_EQ(ids_of(t, t.tasks[index_of(t, 1, 0, 3)].preds), (std::vector<uint64_t>{2, 2, 2}));
  const auto s = simpler::diag::summarize(t);
  EXPECT_EQ(s.tasks, 3u);
  EXPECT_EQ(s.slices, 5u);
  ASSERT_EQ(s.critical_paths.size(), 1u);
  EXPECT_EQ(path_ids(t, s.critical_paths[0]), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_DOUBLE_EQ(s.critical_paths[0].length_us, 21.0);
  // Overheads per task: the SPMD task 6 - 5 = 1, the store 20 - 17 = 3.
  EXPECT_EQ(s.overhead.tasks, 2u);
  EXPECT_DOUBLE_EQ(s.overhead.mean_us, 2.0);
}

// A full lane drops events (runs[].dropped): a predecessor without a slice is
// counted and left out of the graph, and the rest of the trace still reads.
TEST(TraceReader, APredecessorWithoutASliceIsCountedNotRefused) {
  TraceGen g = chain_trace();
  g.task({1, "AIV1", "late", 4, 0, 131.0, 1.0, {3, 99}});
  const Trace t = parse_ok(g);
  EXPECT_EQ(t.missing_preds, 1u);
  EXPECT_NE(t.first_missing_pred.find("task 4 of pid 1 run 0 names predecessor 99, which has no slice"),
            std::string::npos)
      << t.first_missing_pred;
  EXPECT_EQ(ids_of(t, t.tasks[index_of(t, 1, 0, 4)].preds), (std::vector<uint64_t>{3}));
  const auto s = simpler::diag::summarize(t);
  EXPECT_EQ(path_ids(t, s.critical_paths[0]), (std::vector<uint64_t>{1, 2, 3, 4}));
  EXPECT_NE(simpler::diag::format_summary(t, s).find("1 predecessor references name a task with no slice"),
            std::string::npos);
}

TEST(TraceReader, SkipsPhasesItDoesNotDrawAndTakesAnEmptyTrace) {
  const std::string text =
      R"({"otherData":{"simpler_trace_version":1},"traceEvents":[
      {"ph":"i","name":"mark","pid":1,"tid":1,"ts":3},
      {"ph":"C","name":"counter","pid":1,"ts":3,"args":{"v":1}},
      {"ph":"M","name":"process_labels","pid":1,"args":{"labels":"x"}}]})";
  auto r = simpler::diag::parse_trace(text);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->tasks.empty());
  const auto s = simpler::diag::summarize(*r);
  EXPECT_EQ(s.tasks, 0u);
  EXPECT_TRUE(s.critical_paths.empty());
  EXPECT_EQ(s.span_us, 0.0);
}

TEST_F(TraceDir, ReadingADirectoryWithoutTraceJsonIsNotFoundNamingTheFile) {
  auto r = simpler::diag::read_trace_dir(dir_.string());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find((dir_ / "trace.json").string()), std::string::npos) << r.status().message();
}

// ---- the summary ------------------------------------------------------------

TEST(TraceSummary, ChainBusyOverheadAndCriticalPath) {
  const Trace t = parse_ok(chain_trace());
  const auto s = simpler::diag::summarize(t);
  EXPECT_EQ(s.tasks, 3u);
  EXPECT_EQ(s.runs, 1u);
  EXPECT_DOUBLE_EQ(s.span_begin_us, 100.0);
  EXPECT_DOUBLE_EQ(s.span_us, 30.0);
  // Core lanes only (AICPU0 is not one), a named idle core at 0 %.
  ASSERT_EQ(s.lanes.size(), 3u);
  std::map<std::string, double> busy;
  for (const auto& b : s.lanes) busy[t.lanes[b.lane].name] = b.busy_pct;
  EXPECT_DOUBLE_EQ(busy.at("AIC0"), 0.0);
  EXPECT_DOUBLE_EQ(busy.at("AIV0"), 100.0 * 15.0 / 30.0);
  EXPECT_DOUBLE_EQ(busy.at("AIV1"), 100.0 * 8.0 / 30.0);
  // B waited 2 µs after A, C 5 µs after B.
  EXPECT_EQ(s.overhead.tasks, 2u);
  EXPECT_DOUBLE_EQ(s.overhead.mean_us, 3.5);
  EXPECT_DOUBLE_EQ(s.overhead.p50_us, 2.0);
  EXPECT_DOUBLE_EQ(s.overhead.p99_us, 5.0);
  EXPECT_DOUBLE_EQ(s.overhead.max_us, 5.0);
  ASSERT_EQ(s.critical_paths.size(), 1u);
  EXPECT_EQ(path_ids(t, s.critical_paths[0]), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_DOUBLE_EQ(s.critical_paths[0].length_us, 30.0);
}

TEST(TraceSummary, DiamondCriticalPathGoesThroughTheLaterPredecessor) {
  const Trace t = parse_ok(diamond_trace());
  const auto s = simpler::diag::summarize(t);
  ASSERT_EQ(s.critical_paths.size(), 1u);
  // D's predecessors end at 30 (B) and 15 (C): the path is A, B, D, not C,
  // and not E, which ran longer than any single task but bounded nothing.
  EXPECT_EQ(path_ids(t, s.critical_paths[0]), (std::vector<uint64_t>{10, 11, 13}));
  EXPECT_DOUBLE_EQ(s.critical_paths[0].length_us, 40.0);
  // Overheads: B 0, C 1, D 2 (after B's end at 30).
  EXPECT_EQ(s.overhead.tasks, 3u);
  EXPECT_DOUBLE_EQ(s.overhead.mean_us, 1.0);
  EXPECT_DOUBLE_EQ(s.overhead.p50_us, 1.0);
  EXPECT_DOUBLE_EQ(s.overhead.max_us, 2.0);
  std::map<std::string, double> busy;
  for (const auto& b : s.lanes) busy[t.lanes[b.lane].name] = b.busy_us;
  EXPECT_DOUBLE_EQ(busy.at("AIV0"), 30.0);
  EXPECT_DOUBLE_EQ(busy.at("AIV1"), 12.0);
  EXPECT_DOUBLE_EQ(busy.at("AIC0"), 35.0);
}

TEST(TraceSummary, OverlappingSlicesOnALaneCountOnceAndPercentilesAreNearestRank) {
  TraceGen g;
  g.process(1, "chip0", {"AIV0", "AIV1"});
  // AIV0: [0, 10) and [5, 12) overlap: busy 12 of the span 100.
  g.task({1, "AIV0", "k", 0, 0, 0.0, 10.0, {}});
  g.task({1, "AIV0", "k", 1, 0, 5.0, 7.0, {}});
  // 100 dependants of task 0 on AIV1, waiting 1, 2, ..., 100 µs after its end (10).
  for (uint64_t i = 0; i < 90; ++i) g.task({1, "AIV1", "k", 2 + i, 0, 10.0 + double(i + 1), 0.0, {0}});
  g.task({1, "AIV1", "k", 200, 0, 99.0, 1.0, {0}});  // waits 89
  const Trace t = parse_ok(g);
  const auto s = simpler::diag::summarize(t);
  EXPECT_DOUBLE_EQ(s.span_us, 100.0);
  EXPECT_DOUBLE_EQ(s.lanes[0].busy_us, 12.0);
  EXPECT_DOUBLE_EQ(s.lanes[0].busy_pct, 12.0);
  // 91 waits: 1..90 and 89. Nearest rank: p50 is the 46th smallest (46), p99 the 91st (90).
  EXPECT_EQ(s.overhead.tasks, 91u);
  EXPECT_DOUBLE_EQ(s.overhead.p50_us, 46.0);
  EXPECT_DOUBLE_EQ(s.overhead.p99_us, 90.0);
}

TEST(TraceSummary, OneCriticalPathPerRunAndProcess) {
  TraceGen g = diamond_trace(1, 0);
  // Run 1 of the same process reuses the task ids: a chain 10 -> 11 at 100.
  g.task({1, "AIV0", "a", 10, 1, 100.0, 1.0, {}});
  g.task({1, "AIV1", "b", 11, 1, 103.0, 1.0, {10}});
  const Trace t = parse_ok(g);
  const auto s = simpler::diag::summarize(t);
  ASSERT_EQ(s.critical_paths.size(), 2u);
  EXPECT_EQ(s.critical_paths[0].run, 0);
  EXPECT_EQ(path_ids(t, s.critical_paths[0]), (std::vector<uint64_t>{10, 11, 13}));
  EXPECT_EQ(s.critical_paths[1].run, 1);
  EXPECT_EQ(path_ids(t, s.critical_paths[1]), (std::vector<uint64_t>{10, 11}));
  EXPECT_DOUBLE_EQ(s.critical_paths[1].length_us, 4.0);
  // The text names the longest run's path and its tasks.
  const std::string text = simpler::diag::format_summary(t, s);
  EXPECT_NE(text.find("the longest, pid 1 run 0: 40.000 us through 3 tasks"), std::string::npos) << text;
}

// ---- the page's data --------------------------------------------------------

TEST(TimelinePage, DataHasEveryLaneAndTaskWithPredecessorIndicesAndIsSafeInsideScript) {
  TraceGen g = diamond_trace();
  g.task({1, "AIV1", "</script><b>x", 20, 0, 41.0, 1.0, {13}});
  const Trace t = parse_ok(g);
  const std::string data = simpler::diag::timeline_data_json(t);
  EXPECT_EQ(data.find('<'), std::string::npos);
  const auto j = nlohmann::json::parse(data);
  EXPECT_EQ(j["lanes"].size(), t.lanes.size());
  EXPECT_EQ(j["tasks"]["ts"].size(), t.tasks.size());
  EXPECT_EQ(j["slices"]["ts"].size(), t.slices.size());
  EXPECT_DOUBLE_EQ(j["span"].get<double>(), 42.0);
  const uint32_t d = index_of(t, 1, 0, 13);
  const auto& off = j["tasks"]["pred_off"];
  ASSERT_EQ(off.size(), t.tasks.size() + 1);
  std::set<uint64_t> pred_ids;
  for (uint64_t k = off[d].get<uint64_t>(); k < off[d + 1].get<uint64_t>(); ++k) {
    pred_ids.insert(j["tasks"]["id"][j["tasks"]["preds"][k].get<size_t>()].get<uint64_t>());
  }
  EXPECT_EQ(pred_ids, (std::set<uint64_t>{11, 12}));
  bool found = false;
  for (const auto& n : j["names"]) found |= n.get<std::string>() == "</script><b>x";
  EXPECT_TRUE(found);

  const std::string page = simpler::diag::render_timeline_html(t);
  EXPECT_EQ(page.find("@TRACE_DATA@"), std::string::npos);
  EXPECT_EQ(page.find("/*@SCRIPT@*/"), std::string::npos);
  EXPECT_EQ(page.find("</script><b>"), std::string::npos);
  EXPECT_NE(page.find("function chainOf"), std::string::npos);
  // Self-contained: nothing is loaded from anywhere.
  for (const char* ref : {"src=", "href=", "http://", "https://", "@import", "fetch("}) {
    EXPECT_EQ(page.find(ref), std::string::npos) << ref;
  }
}

// ---- the commands -----------------------------------------------------------

CommandResult run_cli(const std::string& args) {
  return run_command(fmt::format("timeout 120 {} {} 2>&1", SIMPLER_CLI_PATH, args));
}

TEST_F(TraceDir, SummaryCommandPrintsTextAndJson) {
  diamond_trace().write(dir_);
  CommandResult text = run_cli("trace summary " + dir_.string());
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("5 tasks in 1 runs over 40.000 us"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("the longest, pid 1 run 0: 40.000 us through 3 tasks"), std::string::npos) << text.output;

  CommandResult json = run_cli("trace summary --json " + dir_.string());
  ASSERT_EQ(json.exit_code, 0) << json.output;
  const auto j = nlohmann::json::parse(json.output);
  EXPECT_EQ(j["tasks"], 5);
  EXPECT_DOUBLE_EQ(j["span_us"].get<double>(), 40.0);
  ASSERT_EQ(j["critical_paths"].size(), 1u);
  EXPECT_DOUBLE_EQ(j["critical_paths"][0]["length_us"].get<double>(), 40.0);
  std::vector<uint64_t> path;
  for (const auto& task : j["critical_paths"][0]["tasks"]) path.push_back(task["task"]);
  EXPECT_EQ(path, (std::vector<uint64_t>{10, 11, 13}));
  EXPECT_DOUBLE_EQ(j["overhead"]["mean_us"].get<double>(), 1.0);
  ASSERT_EQ(j["lanes"].size(), 3u);
  EXPECT_EQ(j["lanes"][1]["lane"], "AIV0");
  EXPECT_DOUBLE_EQ(j["lanes"][1]["busy_pct"].get<double>(), 75.0);
}

TEST_F(TraceDir, CommandsRefuseABadTraceNamingTheFileAndTheEvent) {
  CommandResult missing = run_cli("trace view " + dir_.string());
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_NE(missing.output.find("trace.json: no such file"), std::string::npos) << missing.output;
  std::ofstream(dir_ / "trace.json")
      << R"({"otherData":{"simpler_trace_version":1},"traceEvents":[{"ph":"X","cat":"task","name":"k","pid":1,"tid":1,"dur":1}]})";
  for (const char* cmd : {"trace view ", "trace summary "}) {
    CommandResult r = run_cli(cmd + dir_.string());
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("trace.json: event 0 has no ts"), std::string::npos) << r.output;
  }
  EXPECT_FALSE(fs::exists(dir_ / "timeline.html"));
  CommandResult usage = run_cli("trace");
  EXPECT_EQ(usage.exit_code, 2) << usage.output;
}

// ---- the page in a real browser -----------------------------------------------

// The attributes of the page's #timeline-status element in Chromium's
// serialised DOM (values unescaped).
std::map<std::string, std::string> status_attributes(const std::string& dom) {
  std::map<std::string, std::string> out;
  size_t at = dom.find("id=\"timeline-status\"");
  if (at == std::string::npos) return out;
  at = dom.rfind('<', at);
  size_t i = dom.find(' ', at);
  while (i < dom.size() && dom[i] != '>') {
    while (i < dom.size() && dom[i] == ' ') ++i;
    size_t name_end = i;
    while (name_end < dom.size() && dom[name_end] != '=' && dom[name_end] != ' ' && dom[name_end] != '>') ++name_end;
    const std::string name = dom.substr(i, name_end - i);
    std::string value;
    i = name_end;
    if (i < dom.size() && dom[i] == '=' && i + 1 < dom.size() && dom[i + 1] == '"') {
      const size_t close = dom.find('"', i + 2);
      if (close == std::string::npos) break;
      value = dom.substr(i + 2, close - i - 2);
      i = close + 1;
    }
    for (auto [from, to] : {std::pair<const char*, const char*>{"&lt;", "<"},
                            {"&gt;", ">"},
                            {"&quot;", "\""},
                            {"&#10;", "\n"},
                            {"&amp;", "&"}}) {
      for (size_t p = value.find(from); p != std::string::npos; p = value.find(from, p + 1)) {
        value.replace(p, std::strlen(from), to);
      }
    }
    if (!name.empty()) out[name] = value;
  }
  return out;
}

class Browser : public TraceDir {
 protected:
  void SetUp() override {
    TraceDir::SetUp();
    if (run_command("command -v chromium").exit_code != 0) {
      GTEST_SKIP() << "chromium is not installed (Debian package `chromium`; `make deps` installs it): "
                      "the page is not tested in a browser here";
    }
  }

  // `simpler trace view` on the directory, then the page's DOM after load in
  // headless Chromium (with `hash` appended to its URL), within a deadline.
  std::map<std::string, std::string> render(const std::string& hash = "") {
    CommandResult view = run_cli("trace view " + dir_.string());
    EXPECT_EQ(view.exit_code, 0) << view.output;
    const fs::path page = dir_ / "timeline.html";
    EXPECT_TRUE(fs::exists(page));
    const std::string cmd = fmt::format(
        "timeout 90 chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run "
        "--user-data-dir={} --dump-dom 'file://{}{}' 2>{}",
        (dir_ / "profile").string(), page.string(), hash, (dir_ / "chromium.log").string());
    CommandResult r = run_command(cmd);
    std::ifstream log(dir_ / "chromium.log");
    std::stringstream log_text;
    log_text << log.rdbuf();
    EXPECT_EQ(r.exit_code, 0) << "chromium failed or passed its 90 s deadline (exit 124):\n" << log_text.str();
    auto attrs = status_attributes(r.output);
    EXPECT_FALSE(attrs.empty()) << "no #timeline-status in the DOM; chromium printed:\n"
                                << r.output.substr(0, 2000) << "\n"
                                << log_text.str();
    return attrs;
  }
};

TEST_F(Browser, PageDrawsEveryLaneAndEveryTaskOfTheTrace) {
  TraceGen g = diamond_trace(1, 0);
  g.process(7, "node1/chip0", {"AIV0", "AIV1", "AICPU0", "Orchestrator"});
  g.task({7, "AIV0", "x", 0, 3, 2.0, 3.0, {}});
  g.task({7, "AIV1", "y", 1, 3, 6.0, 3.0, {0}});
  g.slice({7, "Orchestrator", "submit", "submit x", 0.0, 1.0});
  g.write(dir_);
  auto a = render();
  EXPECT_EQ(a["data-processes"], "2");
  EXPECT_EQ(a["data-lanes"], std::to_string(g.lane_count()));
  EXPECT_EQ(a["data-tasks"], std::to_string(g.task_count()));
  EXPECT_EQ(a["data-drawn-tasks"], std::to_string(g.task_count()));
  EXPECT_EQ(a["data-selected"], "");
  EXPECT_EQ(a["data-error"], "");
}

TEST_F(Browser, SelectingATaskHighlightsAllItsTransitivePredecessors) {
  TraceGen g = diamond_trace(1, 0);
  g.task({1, "AIV1", "tail", 15, 0, 41.0, 1.0, {13}});
  g.write(dir_);
  // D's chain is A, B, C and D; E (independent) and the tail (a successor) are not in it.
  auto d = render("#select=1:0:13");
  EXPECT_EQ(d["data-error"], "");
  EXPECT_EQ(d["data-selected"], "1:0:13");
  EXPECT_EQ(d["data-highlighted"], "1:0:10 1:0:11 1:0:12 1:0:13");
  // The hover card of the selected task: kernel, id, start, duration, predecessors.
  EXPECT_NE(d["data-card"].find("d\ntask      13  (pid 1, run 0)"), std::string::npos) << d["data-card"];
  EXPECT_NE(d["data-card"].find("start     32.000 us"), std::string::npos) << d["data-card"];
  EXPECT_NE(d["data-card"].find("duration  8.000 us"), std::string::npos) << d["data-card"];
  EXPECT_NE(d["data-card"].find("preds     11, 12"), std::string::npos) << d["data-card"];
  EXPECT_EQ(d["data-arrows"], "4");  // A->B, A->C, B->D, C->D
  // A bare task id works when one task has it; C's chain is A and C.
  auto c = render("#select=12");
  EXPECT_EQ(c["data-highlighted"], "1:0:10 1:0:12");
  auto tail = render("#select=15");
  EXPECT_EQ(tail["data-highlighted"], "1:0:10 1:0:11 1:0:12 1:0:13 1:0:15");
  // Clicks as the mouse makes them: on D, then on C (C's chain), then on C
  // again (cleared).
  auto clicked = render("#click=13,12");
  EXPECT_EQ(clicked["data-selected"], "1:0:12");
  EXPECT_EQ(clicked["data-highlighted"], "1:0:10 1:0:12");
  auto cleared = render("#click=13,12,12");
  EXPECT_EQ(cleared["data-selected"], "");
  EXPECT_EQ(cleared["data-highlighted"], "");
  EXPECT_EQ(cleared["data-highlighted-count"], "0");
  auto none = render("#select=99");
  EXPECT_EQ(none["data-error"], "#select=99: no such task");
  EXPECT_EQ(none["data-highlighted"], "");
}

TEST_F(Browser, AnSpmdTaskIsSelectedAndHighlightedWithAllItsBlocks) {
  TraceGen g;
  g.process(1, "chip0", {"AIV0", "AIV1", "AIV2"});
  g.process(2, "chip1", {"AIV0"});
  g.task({1, "AIV0", "load", 1, 0, 0.0, 5.0, {}});
  g.task({1, "AIV0", "spmd", 2, 0, 6.0, 4.0, {1}});
  g.task({1, "AIV1", "spmd", 2, 0, 7.0, 10.0, {1}});
  g.task({1, "AIV2", "spmd", 2, 0, 8.0, 2.0, {1}});
  g.task({1, "AIV0", "store", 3, 0, 20.0, 1.0, {2}});
  g.task({2, "AIV0", "other", 1, 0, 0.0, 1.0, {}});
  g.write(dir_);
  auto store = render("#select=1:0:3");
  EXPECT_EQ(store["data-highlighted"], "1:0:1 1:0:2 1:0:2 1:0:2 1:0:3");
  const std::string& card = store["data-card"];
  EXPECT_EQ(card.substr(card.rfind('\n') + 1), "preds     2") << card;  // the SPMD predecessor once
  // A bare id names the SPMD task (one task, three slices); id 1 is two tasks.
  auto spmd = render("#select=2");
  EXPECT_EQ(spmd["data-error"], "");
  EXPECT_EQ(spmd["data-highlighted"], "1:0:1 1:0:2 1:0:2 1:0:2");
  auto ambiguous = render("#select=1");
  EXPECT_EQ(ambiguous["data-error"], "#select=1: 2 tasks have that id; name one as PID:RUN:TASK");
}

TEST_F(Browser, AHundredThousandTasksAreAllDrawn) {
  // 16 cores of one chip, 100,000 tasks of 1 µs with a 0.2 µs gap, each
  // depending on the previous task of its core and, every 7th, on one of the
  // core before: the page still draws them all in its first frame.
  constexpr int kCores = 16;
  // The size is the browser's load; under a sanitizer the generator and the
  // command (26 s for 100,000 tasks under ASan) would dominate the suite, and
  // a fifth of it takes the same code paths.
  constexpr uint64_t kTasks = simpler::testing::kSanitized ? 20'000 : 100'000;
  TraceGen g;
  std::vector<std::string> lanes;
  for (int c = 0; c < kCores; ++c) lanes.push_back(fmt::format("AIV{}", c));
  g.process(1, "chip0", lanes);
  for (uint64_t i = 0; i < kTasks; ++i) {
    const int core = static_cast<int>(i % kCores);
    const uint64_t step = i / kCores;
    std::vector<uint64_t> preds;
    if (step > 0) preds.push_back(i - kCores);
    if (step > 1 && core > 0 && i % 7 == 0) preds.push_back(i - kCores - 1);
    g.task({1, lanes[core], i % 3 == 0 ? "matmul" : "add", i, 0, 1.2 * double(step + 1) + 0.01 * core, 1.0, preds});
  }
  g.write(dir_);
  auto a = render("#select=" + std::to_string(kTasks - 1) + "&bench");
  EXPECT_EQ(a["data-lanes"], std::to_string(kCores));
  EXPECT_EQ(a["data-tasks"], std::to_string(kTasks));
  EXPECT_EQ(a["data-drawn-tasks"], std::to_string(kTasks));
  EXPECT_EQ(a["data-error"], "");
  // The last task's chain reaches back to the first step of its core at least.
  EXPECT_GE(std::stoul(a["data-highlighted-count"]), kTasks / kCores);
  // Not asserted (tests never assert timings): the first frame's cost, for the record.
  std::printf(
      "timeline page, %llu tasks: first frame %s ms; with the last task's chain (%s tasks) selected, a frame at "
      "zoom 1x, 10x, 1000x: %s ms\n",
      static_cast<unsigned long long>(kTasks), a["data-first-render-ms"].c_str(), a["data-highlighted-count"].c_str(),
      a["data-bench-ms"].c_str());
}

}  // namespace
