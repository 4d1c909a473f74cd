// Swimlane traces (issue 12): CallConfig's checks, the lane's drop count, the
// wire form's decoder, and what a traced chip run writes to trace.json on
// each runtime that dispatches to cores: exactly its graph's tasks and
// edges, the categories of its level, the lanes of its geometry.
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "diag/args_dump_file.h"
#include "diag/call_config.h"
#include "diag/lane.h"
#include "gate.h"
#include "scratch_dir.h"
#include "test_util.h"

namespace simpler::testing {
namespace {

using nlohmann::json;

void copy_kernel1d(int64_t* args) {
  const DeviceTensor *a = tensor_arg(args, 0), *b = tensor_arg(args, 1);
  for (int64_t i = 0; i < a->shape[0]; ++i) tensor_data<float>(b)[i] = tensor_data<float>(a)[i] + 1.f;
}
void add_kernel1d(int64_t* args) {
  const DeviceTensor *a = tensor_arg(args, 0), *b = tensor_arg(args, 1), *c = tensor_arg(args, 2);
  for (int64_t i = 0; i < a->shape[0]; ++i) {
    tensor_data<float>(c)[i] = tensor_data<float>(a)[i] + tensor_data<float>(b)[i];
  }
}

json read_trace(const std::string& dir) {
  std::ifstream in(std::filesystem::path(dir) / "trace.json");
  EXPECT_TRUE(in.good()) << "no trace.json in " << dir;
  return json::parse(in);
}

// The diamond x -> {t0: y = x+1, t1: z = x+1} -> t2: w = y+z -> t3: v = w+1,
// whose graph has exactly the edges 0->2, 1->2, 2->3.
struct Diamond {
  static constexpr int kN = 256;
  const std::set<std::pair<uint32_t, uint32_t>> edges{{0, 2}, {1, 2}, {2, 3}};
  const std::vector<std::string> kernels{"inc_kernel", "inc_kernel", "add_kernel", "inc_kernel"};

  Worker w;
  CallableHandle h{};
  DeviceBuffer x, y, z, wb, v;

  explicit Diamond(const std::string& runtime, CallConfig call = {}) : w(Level::Chip, config(runtime, call)) {}
  static WorkerConfig config(const std::string& runtime, const CallConfig& call) {
    WorkerConfig c;
    c.runtime = runtime;
    c.call = call;
    return c;
  }
  void init() {
    KernelLibrary k;
    ASSERT_TRUE(k.add_function(0, CoreType::AIV, "inc_kernel", copy_kernel1d).ok());
    ASSERT_TRUE(k.add_function(1, CoreType::AIV, "add_kernel", add_kernel1d).ok());
    auto reg = w.register_callable(
        ChipCallable("diamond",
                     [](ChipOrchestrator& o, const TaskArgs& a) -> Status {
                       const auto t = [&](uint32_t fn, std::vector<std::pair<int, Tag>> ts) {
                         TaskArgs args;
                         for (auto [i, tag] : ts) args.add_tensor(a[i].tensor, tag);
                         return o.submit_aiv(fn, args).status();
                       };
                       if (Status st = t(0, {{0, Tag::Input}, {1, Tag::OutputExisting}}); !st.ok()) return st;
                       if (Status st = t(0, {{0, Tag::Input}, {2, Tag::OutputExisting}}); !st.ok()) return st;
                       if (Status st = t(1, {{1, Tag::Input}, {2, Tag::Input}, {3, Tag::OutputExisting}}); !st.ok())
                         return st;
                       return t(0, {{3, Tag::Input}, {4, Tag::OutputExisting}});
                     },
                     k, {Param::input(), Param::output(), Param::output(), Param::output(), Param::output()}));
    ASSERT_TRUE(reg.ok()) << reg.status().to_string();
    h = *reg;
    ASSERT_TRUE(w.init().ok());
    for (DeviceBuffer* b : {&x, &y, &z, &wb, &v}) {
      auto m = w.malloc(kN * 4);
      ASSERT_TRUE(m.ok());
      *b = *m;
    }
    std::vector<float> host(kN, 1.f);
    ASSERT_TRUE(w.copy_to(x, host.data(), kN * 4).ok());
  }
  TaskArgs args() const {
    TaskArgs a;
    a.add_tensor(x.view({kN}, DType::F32), Tag::Input);
    for (const DeviceBuffer* b : {&y, &z, &wb, &v}) a.add_tensor(b->view({kN}, DType::F32), Tag::OutputExisting);
    return a;
  }
  void check_output() {
    std::vector<float> out(kN);
    ASSERT_TRUE(w.copy_from(out.data(), v, kN * 4).ok());
    EXPECT_EQ(out[0], 5.f);  // ((1+1) + (1+1)) + 1
  }
};

std::vector<std::string> runtimes_with_cores() { return {"host_build_graph", "tensormap_and_ringbuffer"}; }

// The trace's task slices, flows and lanes, read back.
struct Parsed {
  std::map<uint32_t, std::string> task_names;     // task -> kernel
  std::set<std::pair<uint32_t, uint32_t>> preds;  // (pred, task) from args.preds
  std::set<std::pair<uint32_t, uint32_t>> flows;  // (producer tid/ts matched) counted below
  std::map<std::string, int> categories;          // cat -> events
  std::set<std::string> lane_names;
  size_t flow_starts = 0, flow_ends = 0;
  std::set<uint64_t> flow_ids;
};

Parsed parse(const json& doc) {
  Parsed p;
  for (const json& e : doc.at("traceEvents")) {
    const std::string ph = e.at("ph");
    if (ph == "M") {
      if (e.at("name") == "thread_name") p.lane_names.insert(e.at("args").at("name").get<std::string>());
      continue;
    }
    if (ph == "s" || ph == "f") {
      (ph == "s" ? p.flow_starts : p.flow_ends)++;
      p.flow_ids.insert(e.at("id").get<uint64_t>());
      p.categories[e.at("cat")]++;
      continue;
    }
    p.categories[e.at("cat")]++;
    if (e.at("cat") == "task") {
      const uint32_t task = e.at("args").at("task");
      p.task_names[task] = e.at("name");
      for (uint32_t pred : e.at("args").at("preds")) p.preds.insert({pred, task});
    }
  }
  return p;
}

TEST(TraceTest, TraceHoldsExactlyTheGraphsTasksAndEdges) {
  for (const std::string& rt : runtimes_with_cores()) {
    SCOPED_TRACE(rt);
    const std::string dir = scratch_dir("trace", "graph_" + rt);
    Diamond d(rt);
    d.init();
    CallConfig call;
    call.swimlane_level = 1;
    call.trace_dir = dir;
    Status st = d.w.submit(d.h, d.args(), call).wait_for(20s);
    ASSERT_TRUE(st.ok()) << st.to_string();
    d.check_output();
    const json doc = read_trace(dir);
    EXPECT_EQ(doc.at("otherData").at("simpler_trace_version"), 1);
    EXPECT_EQ(doc.at("otherData").at("swimlane_level"), 1);
    const Parsed p = parse(doc);
    ASSERT_EQ(p.task_names.size(), 4u);
    for (uint32_t t = 0; t < 4; ++t) EXPECT_EQ(p.task_names.at(t), d.kernels[t]) << "task " << t;
    EXPECT_EQ(p.preds, d.edges);
    EXPECT_EQ(p.flow_starts, d.edges.size());
    EXPECT_EQ(p.flow_ends, d.edges.size());
    EXPECT_EQ(p.flow_ids.size(), d.edges.size());
    // Level 1 is task slices and their edges only.
    EXPECT_EQ(p.categories.count("dispatch"), 0u);
    EXPECT_EQ(p.categories.count("sched"), 0u);
    EXPECT_EQ(p.categories.count("submit"), 0u);
    EXPECT_TRUE(d.w.close().ok());
  }
}

// Runs pipelined into one directory: the writer thread may skip a
// trace.json that a later, already queued run's replaces, and each run
// dumps into its own staging directory; every handle still completes OK
// and what stays is one whole run's trace and one whole run's dump, with no
// temporary file or staging directory left.
TEST(TraceTest, PipelinedRunsIntoOneDirectoryLeaveOneWholeTraceAndDump) {
  const std::string dir = scratch_dir("trace", "pipelined");
  Diamond d("host_build_graph");
  d.init();
  CallConfig call;
  call.swimlane_level = 4;
  call.trace_dir = dir;
  call.dump_args = DumpArgs::Full;
  // Each run writes buffers of its own: runs in flight at once share only x.
  std::vector<RunHandle> runs;
  std::vector<DeviceBuffer> last_v;
  for (int i = 0; i < 24; ++i) {
    TaskArgs a;
    a.add_tensor(d.x.view({Diamond::kN}, DType::F32), Tag::Input);
    for (int b = 0; b < 4; ++b) {
      auto m = d.w.malloc(Diamond::kN * 4);
      ASSERT_TRUE(m.ok()) << m.status().to_string();
      a.add_tensor(m->view({Diamond::kN}, DType::F32), Tag::OutputExisting);
      if (b == 3) last_v.push_back(*m);
    }
    runs.push_back(d.w.submit(d.h, a, call));
  }
  for (RunHandle& h : runs) {
    Status st = h.wait_for(20s);
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
  std::vector<float> out(Diamond::kN);
  ASSERT_TRUE(d.w.copy_from(out.data(), last_v.back(), Diamond::kN * 4).ok());
  EXPECT_EQ(out[0], 5.f);
  const json doc = read_trace(dir);
  EXPECT_EQ(doc.at("otherData").at("runs").size(), 1u);
  const Parsed p = parse(doc);
  EXPECT_EQ(p.task_names.size(), 4u);
  EXPECT_EQ(p.preds, d.edges);
  // The orchestrator lanes are reused from run to run: the file holds this
  // run's four submits, none of an earlier run's.
  EXPECT_EQ(p.categories.at("submit"), 4);
  auto dump = load_args_dump(dir + "/args_dump");
  ASSERT_TRUE(dump.ok()) << dump.status().to_string();
  EXPECT_TRUE(dump->complete);
  EXPECT_EQ(dump->args.size(), 9u);  // t0, t1: x in, y/z out; t2: y, z in, w out; t3: w in, v out
  std::set<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir)) left.insert(e.path().filename().string());
  EXPECT_EQ(left, (std::set<std::string>{"trace.json", "args_dump"}));
  EXPECT_TRUE(d.w.close().ok());
}

// Gates for the overlapping stream below: the gated kernel that enters
// k-th parks on gate k.
Gate* g_stream_gates = nullptr;
std::atomic<uint32_t> g_stream_entered{0};
void stream_gate_kernel(int64_t*) { g_stream_gates[g_stream_entered.fetch_add(1)].pass(); }
void noop_kernel(int64_t*) {}

// Traced runs that overlap, so that one is always in flight (each run's
// first task parks on its gate until the next run's first task runs),
// push far more events through each core lane than it holds. The lanes
// must reuse what closed runs no longer read: every run's trace holds
// exactly its own tasks, none dropped. (Before the lanes were rings, they
// were reset only when no traced run was in flight: this stream's later
// traces came out empty, every event counted as dropped.)
TEST(TraceTest, OverlappingTracedRunsKeepEveryTaskPastTheLaneCapacity) {
  constexpr uint32_t kRuns = 24;
  constexpr uint32_t kTasks = 8000;  // 24 x 8,000 AIV tasks on 4 AIV lanes of 32,768 events
  std::unique_ptr<Gate[]> gates(new Gate[kRuns]);
  g_stream_gates = gates.get();
  g_stream_entered = 0;
  const std::string dir = scratch_dir("trace", "overlapping");
  KernelLibrary k;
  ASSERT_TRUE(k.add_function(0, CoreType::AIV, "stream_gate", stream_gate_kernel).ok());
  ASSERT_TRUE(k.add_function(1, CoreType::AIV, "noop", noop_kernel).ok());
  WorkerConfig cfg;
  cfg.pipeline_depth = 4;
  cfg.call.swimlane_level = 1;
  cfg.call.trace_dir = dir;
  Worker w(Level::Chip, cfg);
  auto h = w.register_callable(ChipCallable("stream",
                                            [](ChipOrchestrator& o, const TaskArgs&) -> Status {
                                              if (Status st = o.submit_aiv(0, TaskArgs{}).status(); !st.ok()) return st;
                                              for (uint32_t t = 1; t < kTasks; ++t) {
                                                if (Status st = o.submit_aiv(1, TaskArgs{}).status(); !st.ok())
                                                  return st;
                                              }
                                              return Status();
                                            },
                                            k, {}));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  ASSERT_TRUE(w.init().ok());
  std::vector<RunHandle> runs;
  for (uint32_t r = 0; r < kRuns; ++r) {
    runs.push_back(w.submit(*h, TaskArgs{}));
    ASSERT_TRUE(gates[r].wait_entered()) << "run " << r << "'s gated task never started";
    if (r > 0) gates[r - 1].release();
  }
  gates[kRuns - 1].release();
  for (RunHandle& run : runs) {
    Status st = run.wait_for(60s);
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
  const json doc = read_trace(dir);
  ASSERT_EQ(doc.at("otherData").at("runs").size(), 1u);
  EXPECT_EQ(doc.at("otherData").at("runs")[0].at("dropped"), 0u);
  EXPECT_EQ(parse(doc).task_names.size(), kTasks);
  EXPECT_TRUE(w.close().ok());
}

TEST(TraceTest, LevelsAddTheirCategories) {
  for (const std::string& rt : runtimes_with_cores()) {
    SCOPED_TRACE(rt);
    Diamond d(rt);
    d.init();
    for (uint32_t level = 1; level <= kMaxSwimlaneLevel; ++level) {
      SCOPED_TRACE(level);
      const std::string dir = scratch_dir("trace", "level_" + rt + std::to_string(level));
      CallConfig call;
      call.swimlane_level = level;
      call.trace_dir = dir;
      Status st = d.w.submit(d.h, d.args(), call).wait_for(20s);
      ASSERT_TRUE(st.ok()) << st.to_string();
      const Parsed p = parse(read_trace(dir));
      const auto count = [&](const char* cat) { return p.categories.count(cat) != 0 ? p.categories.at(cat) : 0; };
      EXPECT_EQ(count("task"), 4);
      // Level 2: one dispatch and one finish per task; level 3: scheduler
      // phases (a run with tasks reaps and places at least once); level 4:
      // one submit per task.
      EXPECT_EQ(count("dispatch"), level >= 2 ? 8 : 0);
      EXPECT_EQ(count("sched") != 0, level >= 3);
      EXPECT_EQ(count("submit"), level >= 4 ? 4 : 0);
    }
    EXPECT_TRUE(d.w.close().ok());
  }
}

// The resident route records level 1 where its tasks start, on the cores:
// one slice per task on a core lane, and nothing on an AICPU lane (no AICPU
// thread sees a task there, so levels 2 and 3 have nothing of its tasks).
TEST(TraceTest, TheResidentRouteRecordsEachTasksCoreSliceAtLevelOne) {
  Diamond d("resident");
  d.init();
  const std::string dir = scratch_dir("trace", "resident_level1");
  CallConfig call;
  call.swimlane_level = 1;
  call.trace_dir = dir;
  Status st = d.w.submit(d.h, d.args(), call).wait_for(20s);
  ASSERT_TRUE(st.ok()) << st.to_string();
  d.check_output();
  const json doc = read_trace(dir);
  const Parsed p = parse(doc);
  EXPECT_EQ(p.categories.count("task") != 0 ? p.categories.at("task") : 0, 4);
  EXPECT_EQ(p.task_names.size(), 4u);
  for (const json& e : doc.at("traceEvents")) {
    if (e.value("cat", "") != "task") continue;
    EXPECT_EQ(e.at("args").at("core").get<std::string>().rfind("AIV", 0), 0u) << e.dump();
  }
  EXPECT_TRUE(d.w.close().ok());
}

TEST(TraceTest, LanesAreNamedPerTheGeometry) {
  const std::string dir = scratch_dir("trace", "lanes");
  CallConfig call;
  call.swimlane_level = 1;
  call.trace_dir = dir;
  Diamond d("host_build_graph", call);  // the Worker's default CallConfig
  d.init();
  ASSERT_TRUE(d.w.submit(d.h, d.args()).wait_for(20s).ok());
  const json doc = read_trace(dir);
  const Parsed p = parse(doc);
  const Geometry g = Geometry::small();
  std::set<std::string> want{"Orchestrator"};
  for (uint32_t i = 0; i < g.aic_cores(); ++i) want.insert("AIC" + std::to_string(i));
  for (uint32_t i = 0; i < g.aiv_cores(); ++i) want.insert("AIV" + std::to_string(i));
  for (uint32_t i = 0; i < g.aicpu_threads; ++i) want.insert("AICPU" + std::to_string(i));
  EXPECT_EQ(p.lane_names, want);
  // Every task slice sits on an AIV lane (the diamond's kernels are AIV) and names it.
  for (const json& e : doc.at("traceEvents")) {
    if (e.value("cat", "") != "task") continue;
    EXPECT_EQ(e.at("args").at("core").get<std::string>().rfind("AIV", 0), 0u) << e.dump();
  }
  bool named_chip0 = false;
  for (const json& e : doc.at("traceEvents")) {
    if (e.at("ph") == "M" && e.at("name") == "process_name") named_chip0 |= e.at("args").at("name") == "chip0";
  }
  EXPECT_TRUE(named_chip0);
  EXPECT_TRUE(d.w.close().ok());
}

TEST(TraceTest, UntracedRunWritesNothing) {
  const std::string dir = scratch_dir("trace", "off");
  Diamond d("host_build_graph");
  d.init();
  ASSERT_TRUE(d.w.submit(d.h, d.args()).wait_for(20s).ok());
  d.check_output();
  EXPECT_FALSE(std::filesystem::exists(dir));
  EXPECT_TRUE(d.w.close().ok());
}

TEST(TraceTest, BadCallConfigIsRefusedNamingTheField) {
  Diamond d("host_build_graph");
  d.init();
  const std::string dir = scratch_dir("trace", "bad");
  CallConfig high;
  high.swimlane_level = 5;
  high.trace_dir = dir;
  Status st = d.w.submit(d.h, d.args(), high).wait_for(10s);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("swimlane_level = 5"), std::string::npos) << st.to_string();
  EXPECT_FALSE(std::filesystem::exists(dir)) << "a refused config created its directory";

  CallConfig no_dir;
  no_dir.swimlane_level = 1;
  st = d.w.submit(d.h, d.args(), no_dir).wait_for(10s);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("trace_dir"), std::string::npos) << st.to_string();

  // A directory under a regular file cannot be created.
  const std::string file = scratch_dir("trace", "file");
  std::ofstream(file) << "x";
  CallConfig bad_dir;
  bad_dir.swimlane_level = 1;
  bad_dir.trace_dir = file + "/sub";
  st = d.w.submit(d.h, d.args(), bad_dir).wait_for(10s);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("trace_dir = '" + bad_dir.trace_dir + "' cannot be created"), std::string::npos)
      << st.to_string();
  std::filesystem::remove(file);

  CallConfig dump;
  dump.dump_args = DumpArgs::Full;  // with nowhere to write it
  st = d.w.submit(d.h, d.args(), dump).wait_for(10s);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("trace_dir"), std::string::npos) << st.to_string();
  dump.dump_args = static_cast<DumpArgs>(9);
  dump.trace_dir = file;
  st = d.w.submit(d.h, d.args(), dump).wait_for(10s);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("dump_args"), std::string::npos) << st.to_string();

  // The refusals changed nothing: the next run is fine.
  ASSERT_TRUE(d.w.submit(d.h, d.args()).wait_for(20s).ok());
  d.check_output();
  EXPECT_TRUE(d.w.close().ok());

  // The Worker's default is checked at init, named as its WorkerConfig field.
  Diamond bad("host_build_graph", high);
  const Status init = bad.w.init();
  EXPECT_EQ(init.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(init.message().find("call.swimlane_level = 5"), std::string::npos) << init.to_string();
}

TEST(TraceTest, FullLaneCountsDropsAndNeverBlocks) {
  diag::Lane lane(4);
  lane.allocate();
  for (uint32_t i = 0; i < 10; ++i) lane.record(diag::Event{1, i, i + 1, "k", i, 0, diag::EventKind::kTask});
  EXPECT_EQ(lane.end(), 4u);
  EXPECT_EQ(lane.dropped(), 6u);
  for (uint32_t i = 0; i < 4; ++i) EXPECT_EQ(lane.at(i).task, i);  // the first four kept, whole
}

namespace {
void record_runs(diag::Lane& lane, uint64_t run, uint32_t count) {
  for (uint32_t i = 0; i < count; ++i) lane.record(diag::Event{run, i, i + 1, "k", i, 0, diag::EventKind::kTask});
}
// The tasks of `run` in the window opened at `begin`, in order.
std::vector<uint32_t> window_tasks(const diag::Lane& lane, uint64_t begin, uint64_t run) {
  std::vector<uint32_t> tasks;
  for (uint64_t i = begin; i < lane.end(); ++i) {
    if (lane.at(i).run == run) tasks.push_back(lane.at(i).task);
  }
  return tasks;
}
}  // namespace

TEST(TraceTest, RecorderWindowsKeepEachRunsEventsWhileTheLanesRunAsRings) {
  diag::Recorder rec(3, 1, 8);
  diag::Lane& lane = rec.core_lane(0);
  auto w1 = rec.begin_run(1);
  ASSERT_TRUE(w1.ok());
  EXPECT_EQ(rec.live_level(), 1u);
  record_runs(lane, 7, 6);
  auto w2 = rec.begin_run(3);  // overlaps: the level rises, run 7's events stay
  ASSERT_TRUE(w2.ok());
  EXPECT_EQ(rec.live_level(), 3u);
  EXPECT_EQ(w2->core_begin[0], 6u);
  // Run 8 may not overwrite what run 7's open window still reads: of its 6
  // events 2 fit (8 slots from run 7's begin), 4 are dropped.
  record_runs(lane, 8, 6);
  EXPECT_EQ(lane.dropped() - w2->core_dropped[0], 4u);
  EXPECT_EQ(window_tasks(lane, w1->core_begin[0], 7), (std::vector<uint32_t>{0, 1, 2, 3, 4, 5}));
  rec.end_run(*w1);
  EXPECT_EQ(rec.live_level(), 3u);
  // Run 7's window closed: its slots take run 8's later events.
  record_runs(lane, 8, 6);
  EXPECT_EQ(window_tasks(lane, w2->core_begin[0], 8), (std::vector<uint32_t>{0, 1, 0, 1, 2, 3, 4, 5}));
  rec.end_run(*w2);
  EXPECT_EQ(rec.live_level(), 0u);
  // No window open: events of no traced run wrap freely, and the next
  // run's window starts clean wherever the ring stands. Far more events
  // than slots pass through the one lane, and each window reads its own.
  record_runs(lane, 0, 5);
  for (uint64_t run = 9; run < 40; ++run) {
    auto w = rec.begin_run(1);
    ASSERT_TRUE(w.ok());
    record_runs(lane, run, 5);
    EXPECT_EQ(window_tasks(lane, w->core_begin[0], run), (std::vector<uint32_t>{0, 1, 2, 3, 4})) << "run " << run;
    EXPECT_EQ(lane.dropped() - w->core_dropped[0], 0u) << "run " << run;
    rec.end_run(*w);
  }
  EXPECT_EQ(rec.live_level(), 0u);
}

TEST(TraceTest, CallConfigWireRoundTripsAndRefusesBadBytes) {
  diag::ChildCallConfig c;
  c.call.swimlane_level = 3;
  c.call.trace_dir = "/tmp/some dir";
  c.child_index = 2;
  uint8_t buf[1024];
  auto n = diag::encode_call_config(c, buf, sizeof buf);
  ASSERT_TRUE(n.ok());
  auto back = diag::decode_call_config(buf, *n);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->call.swimlane_level, 3u);
  EXPECT_EQ(back->call.trace_dir, "/tmp/some dir");
  EXPECT_EQ(back->child_index, 2u);
  EXPECT_TRUE(diag::decode_call_config(buf, 0).ok());  // no config: no diagnostics
  EXPECT_NE(diag::decode_call_config(buf, *n - 1).status().message().find("dir_bytes"), std::string::npos);
  EXPECT_NE(diag::decode_call_config(buf, 10).status().message().find("header"), std::string::npos);
  uint8_t bad[1024];
  std::memcpy(bad, buf, *n);
  bad[6] = 9;  // swimlane_level
  EXPECT_NE(diag::decode_call_config(bad, *n).status().message().find("swimlane_level = 9"), std::string::npos);
  std::memcpy(bad, buf, *n);
  bad[0] ^= 1;
  EXPECT_NE(diag::decode_call_config(bad, *n).status().message().find("magic"), std::string::npos);
  c.call.trace_dir.assign(2000, 'a');
  EXPECT_FALSE(diag::encode_call_config(c, buf, sizeof buf).ok());
}

}  // namespace
}  // namespace simpler::testing
