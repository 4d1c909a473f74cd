// Diagnostics through a node and a network (issue 12): a traced run's one
// trace.json holds the parent's host lanes (Orchestrator, Scheduler, a Serve
// lane per child, Sub lanes) and every chip's lanes, each chip its own
// process, on the parent's clock; argument dumps land in one directory per
// (chip, node task), and `dump diff` over two node runs names the first
// task, in execution order, whose output differs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "diag/args_dump_file.h"
#include "diag/trace_reader.h"
#include "node_test_util.h"
#include "scratch_dir.h"
#include "test_util.h"

namespace simpler::testing {
namespace {

constexpr int kN = 64;

Status add_sub(const TaskArgsView& a) {
  for (int64_t i = 0; i < a[0].tensor.shape(0); ++i) a.data<float>(2)[i] = a.data<float>(0)[i] + a.data<float>(1)[i];
  return Status();
}

TensorView vec(const DeviceBuffer& b) { return b.view({kN}, DType::F32); }

// Two chips and a sub worker: y0 = x*2+1 on chip0, y1 = x*3+mul1 on chip1,
// z = y0 + y1 on the sub worker. Node tasks 0, 1, 2.
struct TwoChipNode {
  Worker w{Level::Node, node_config(2, 1, 2)};
  CallableHandle axpb{};
  FunctionHandle add{};
  DeviceBuffer x, y0, y1, z;

  TwoChipNode() {
    make_node_gates();
    auto a = w.register_callable(axpb_callable());
    auto f = w.register_function(add_sub);
    EXPECT_TRUE(a.ok() && f.ok());
    axpb = *a;
    add = *f;
    EXPECT_TRUE(w.init().ok());
    x = shared_iota(w, kN, 1);
    y0 = shared_iota(w, kN, 0);
    y1 = shared_iota(w, kN, 0);
    z = shared_iota(w, kN, 0);
  }
  ~TwoChipNode() { EXPECT_TRUE(w.close().ok()); }

  Status run(const CallConfig& call, int64_t add1 = 5) {
    RunHandle h = w.submit(
        [&](Orchestrator& o) -> Status {
          SIMPLER_RETURN_IF_ERROR(o.submit_next_level(axpb, axpb_args(vec(x), vec(y0), 2, 1, -1), 0).status());
          SIMPLER_RETURN_IF_ERROR(o.submit_next_level(axpb, axpb_args(vec(x), vec(y1), 3, add1, -1), 1).status());
          TaskArgs s;
          s.add_tensor(vec(y0), Tag::Input).add_tensor(vec(y1), Tag::Input).add_tensor(vec(z), Tag::OutputExisting);
          return o.submit_sub(add, s).status();
        },
        call);
    return wait_run(h);
  }
};

const diag::TraceProcess* process_named(const diag::Trace& t, const std::string& name) {
  for (const diag::TraceProcess& p : t.processes) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

// The lane `name` of the process `process`, or null.
const diag::TraceLane* lane_named(const diag::Trace& t, const std::string& process, const std::string& name) {
  for (const diag::TraceLane& l : t.lanes) {
    if (t.processes[l.process].name == process && l.name == name) return &l;
  }
  return nullptr;
}

// The host slices on one lane.
std::vector<diag::TraceSlice> slices_on(const diag::Trace& t, const diag::TraceLane* lane) {
  std::vector<diag::TraceSlice> out;
  for (const diag::TraceSlice& s : t.slices) {
    if (lane != nullptr && &t.lanes[s.lane] == lane) out.push_back(s);
  }
  return out;
}

// Issue 12: a node run adds its host lanes in the same file as its chips'
// lanes, each chip its own process, on one clock: every chip task lies inside
// the span its Serve lane shows for it (published .. terminal seen).
TEST(NodeTrace, ANodeRunsFileHoldsItsHostLanesAndEachChipsTasksOnOneClock) {
  Watchdog dog;
  TwoChipNode n;
  CallConfig call;
  call.swimlane_level = 2;
  call.trace_dir = scratch_dir("node_trace", "node");
  ASSERT_TRUE(n.run(call).ok());
  auto t = diag::read_trace_dir(call.trace_dir);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_NE(process_named(*t, "node"), nullptr);
  ASSERT_NE(process_named(*t, "chip0"), nullptr);
  ASSERT_NE(process_named(*t, "chip1"), nullptr);
  EXPECT_EQ(t->processes.size(), 3u);
  for (const char* lane : {"Orchestrator", "Scheduler", "Serve chip0", "Serve chip1", "Sub0"}) {
    EXPECT_NE(lane_named(*t, "node", lane), nullptr) << lane;
  }
  EXPECT_EQ(slices_on(*t, lane_named(*t, "node", "Scheduler")).size(), 3u);  // one publication per task
  ASSERT_EQ(slices_on(*t, lane_named(*t, "node", "Sub0")).size(), 1u);
  // Exactly the two chip tasks ran on cores, one in each chip's process.
  ASSERT_EQ(t->tasks.size(), 2u);
  for (int chip = 0; chip < 2; ++chip) {
    const std::string name = "chip" + std::to_string(chip);
    const auto serve = slices_on(*t, lane_named(*t, "node", "Serve " + name));
    ASSERT_EQ(serve.size(), 1u) << name;
    int found = 0;
    for (const diag::TraceTask& task : t->tasks) {
      if (t->processes[t->lanes[task.lane].process].name != name) continue;
      ++found;
      EXPECT_EQ(t->kernels[task.kernel], "node_axpb_kernel");
      // The chip's clock is the node's: its task ran while the node held it out.
      EXPECT_GE(task.ts, serve[0].ts) << name;
      EXPECT_LE(task.ts + task.dur, serve[0].ts + serve[0].dur) << name;
    }
    EXPECT_EQ(found, 1) << name;
  }
  // The sub worker ran after both chips (it reads their outputs).
  const auto sub = slices_on(*t, lane_named(*t, "node", "Sub0"));
  for (const diag::TraceTask& task : t->tasks) EXPECT_GE(sub[0].ts, task.ts + task.dur);
}

// A network's file nests: its own host lanes, each node's (node<i>) and each
// node's chips (node<i>/chip0), one process each.
TEST(NodeTrace, ANetworkRunsFileNestsEachNodeAndItsChips) {
  Watchdog dog;
  make_node_gates();
  Worker net(Level::Network, network_config(0, 2));
  std::vector<CallableHandle> axpb;
  for (int i = 0; i < 2; ++i) {
    Worker node(Level::Node, node_config(1, 0, 2));
    auto a = node.register_callable(axpb_callable());
    ASSERT_TRUE(a.ok());
    axpb.push_back(*a);
    ASSERT_TRUE(net.add_next_level_worker(std::move(node)).ok());
  }
  const CallableHandle chip_axpb = axpb[0];
  auto step = net.register_callable(NodeCallable("step", [chip_axpb](Orchestrator& o, const TaskArgs& a) {
    return o.submit_next_level(chip_axpb, axpb_args(a[0].tensor, a[1].tensor, 2, 1, -1), 0).status();
  }));
  ASSERT_TRUE(step.ok());
  ASSERT_TRUE(net.init().ok());
  const DeviceBuffer x = shared_iota(net, kN, 1), y0 = shared_iota(net, kN, 0), y1 = shared_iota(net, kN, 0);
  CallConfig call;
  call.swimlane_level = 1;
  call.trace_dir = scratch_dir("node_trace", "network");
  RunHandle h = net.submit(
      [&](Orchestrator& o) -> Status {
        for (uint32_t node = 0; node < 2; ++node) {
          TaskArgs a;
          a.add_tensor(vec(x), Tag::Input).add_tensor(vec(node == 0 ? y0 : y1), Tag::OutputExisting);
          SIMPLER_RETURN_IF_ERROR(o.submit_next_level(*step, a, node).status());
        }
        return Status();
      },
      call);
  ASSERT_TRUE(wait_run(h).ok()) << h.result().to_string();
  auto t = diag::read_trace_dir(call.trace_dir);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  std::set<std::string> names;
  for (const diag::TraceProcess& p : t->processes) names.insert(p.name);
  EXPECT_EQ(names, (std::set<std::string>{"network", "node0", "node1", "node0/chip0", "node1/chip0"}));
  EXPECT_NE(lane_named(*t, "network", "Serve node1"), nullptr);
  EXPECT_NE(lane_named(*t, "node1", "Serve chip0"), nullptr);
  ASSERT_EQ(t->tasks.size(), 2u);
  for (const diag::TraceTask& task : t->tasks) {
    const std::string proc = t->processes[t->lanes[task.lane].process].name;
    EXPECT_TRUE(proc == "node0/chip0" || proc == "node1/chip0") << proc;
  }
  for (const float* y : {reinterpret_cast<const float*>(y0.addr), reinterpret_cast<const float*>(y1.addr)}) {
    EXPECT_EQ(y[kN - 1], (1 + kN - 1) * 2 + 1);
  }
  EXPECT_TRUE(net.close().ok());
}

// Issue 12: through a node, each chip's dump lands under its own
// (chip, task) directory with the bytes of its moment; `dump diff` of two
// node runs, one with chip1's task perturbed, names that task.
TEST(NodeTrace, DumpsLandPerChipAndTaskAndTheDiffNamesThePerturbedOne) {
  Watchdog dog;
  TwoChipNode n;
  CallConfig call;
  call.dump_args = DumpArgs::Full;
  call.trace_dir = scratch_dir("node_trace", "dump_a");
  ASSERT_TRUE(n.run(call).ok());
  const auto dumps = find_args_dumps(call.trace_dir);
  ASSERT_EQ(dumps.size(), 2u);
  // The node's run 1: its parts sit under run1/, one directory per (chip, node task).
  EXPECT_EQ(dumps[0].first, "run1/chip0/task0");
  EXPECT_EQ(dumps[1].first, "run1/chip1/task1");
  for (int chip = 0; chip < 2; ++chip) {
    auto d = load_args_dump(dumps[chip].second);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    EXPECT_TRUE(d->complete);
    const DumpedArg* out = nullptr;
    for (const DumpedArg& a : d->args) {
      if (a.stage == DumpStage::kAfter && a.arg == 1) out = &a;
    }
    ASSERT_NE(out, nullptr) << "chip " << chip;
    for (int i = 0; i < kN; ++i) {
      const float x = 1.f + static_cast<float>(i);
      ASSERT_EQ(dumped_element(*d, *out, i), chip == 0 ? x * 2 + 1 : x * 3 + 5) << "chip " << chip << " element " << i;
    }
  }
  // The same orchestration with chip1's addend perturbed.
  const std::string a = call.trace_dir;
  call.trace_dir = scratch_dir("node_trace", "dump_b");
  ASSERT_TRUE(n.run(call, 6).ok());
  const auto b = find_args_dumps(call.trace_dir);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[1].first, "run2/chip1/task1");
  auto a0 = load_args_dump(dumps[0].second), b0 = load_args_dump(b[0].second);
  auto a1 = load_args_dump(dumps[1].second), b1 = load_args_dump(b[1].second);
  ASSERT_TRUE(a0.ok() && b0.ok() && a1.ok() && b1.ok());
  EXPECT_FALSE(diff_args_dumps(*a0, *b0, 0, 0).differs);
  const DumpDifference d = diff_args_dumps(*a1, *b1, 0, 0);
  ASSERT_TRUE(d.differs);
  EXPECT_EQ(d.arg, 1u);
  EXPECT_EQ(d.a, 1 * 3 + 5);
  EXPECT_EQ(d.b, 1 * 3 + 6);
}

// A node run's bad CallConfig is refused before anything of it exists,
// naming the field, and the node serves the next run.
TEST(NodeTrace, ANodeRefusesABadCallConfigNamingTheFieldAndServesOn) {
  Watchdog dog;
  TwoChipNode n;
  CallConfig no_dir;
  no_dir.swimlane_level = 1;
  EXPECT_REFUSED(n.run(no_dir), StatusCode::kInvalidArgument, "call.trace_dir");
  CallConfig high;
  high.swimlane_level = 5;
  high.trace_dir = scratch_dir("node_trace", "refused");
  EXPECT_REFUSED(n.run(high), StatusCode::kInvalidArgument, "call.swimlane_level");
  EXPECT_FALSE(std::filesystem::exists(high.trace_dir));
  EXPECT_TRUE(n.run(CallConfig{}).ok());
}

// The order `dump show` and `dump diff` walk a run directory in: by run,
// then by node task before chip at each level, numbers compared as numbers.
TEST(NodeTrace, DumpsOfARunDirectoryComeInExecutionOrder) {
  const std::string root = scratch_dir("node_trace", "order");
  const std::vector<std::string> expected{"run1/chip1/task0",
                                          "run1/chip0/task2",
                                          "run1/chip0/task10",
                                          "run1/node0/task11/chip0/task0",
                                          "run1/node0/task11/chip0/task1",
                                          "run2/chip0/task0"};
  for (auto it = expected.rbegin(); it != expected.rend(); ++it) {
    const auto dir = std::filesystem::path(root) / *it / "args_dump";
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "manifest.json") << "{}";
    std::ofstream(dir / "args.bin");
  }
  std::filesystem::create_directories(std::filesystem::path(root) / "run1" / "chip3" / "task1");  // no dump in it
  std::vector<std::string> labels;
  for (const auto& [label, path] : find_args_dumps(root)) {
    labels.push_back(label);
    EXPECT_EQ(path, (std::filesystem::path(root) / label / "args_dump").string());
  }
  EXPECT_EQ(labels, expected);
  // One run's own directory: labels relative to it.
  const auto one = find_args_dumps(root + "/run2");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].first, "chip0/task0");
}

}  // namespace
}  // namespace simpler::testing
