// Traces and argument dumps through remote nodes (issues 12 and 15), under
// `mpirun -np 3`: rank 0 runs one gtest case (argv[1] names it) on a network
// of a forked node (node0) and two remote ones (node1 on rank 1, node2 on
// rank 2); ranks 1 and 2 serve, with the shipment faults the case injects.
// Every wait has a deadline (the Watchdog, heartbeat_timeout).
#include <unistd.h>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "diag/args_dump_file.h"
#include "diag/trace_merge.h"
#include "diag/trace_reader.h"
#include "dist/node_server.h"
#include "dist/wire.h"
#include "node_test_util.h"
#include "scratch_dir.h"
#include "test_util.h"

namespace simpler::testing {
namespace {

std::string g_case;
constexpr int64_t kLen = 256;
constexpr int64_t kSkewNs = 5'000'000'000;

// One node run: out = in * mul + add on the node's chip (args: in, out, mul, add).
NodeCallable scale_callable() {
  return NodeCallable("scale", [](Orchestrator& o, const TaskArgs& a) -> Status {
    const CallableHandle axpb{0, axpb_callable().digest()};
    return o.submit_next_level(axpb, axpb_args(a[0].tensor, a[1].tensor, a[2].scalar, a[3].scalar, -1), 0).status();
  });
}

NodeSpec node_spec(uint32_t depth) {
  NodeSpec s;
  s.level = Level::Node;
  s.config = node_config(1, 0, depth);
  s.chip_callables = {axpb_callable()};
  return s;
}

// Ranks 1 and 2: serve a node. In the malformed-shipment case rank 1 spoils
// the files of its first three runs, one way each.
int serve_rank(int rank) {
  dist::ServeHooks hooks;
  if (g_case == "AMalformedShipmentIsRefusedAndTheRunFinishes" && rank == 1) {
    hooks.on_shipment = [](uint64_t n, std::vector<dist::ShippedFile>& files) {
      if (files.empty()) return;
      dist::ShippedFile& trace = files.back();  // sorted by name: trace.json after chip0/...
      if (n == 1) trace.name = "../../escaped.json";
      if (n == 2) trace.bytes = dist::kWireMaxFileBytes + 1;
      if (n == 3) trace.send = trace.bytes / 2;
    };
  }
  // Rank 1 sends its first dump's files under a name that climbs out.
  if (g_case == "ARefusedDumpFailsItsRun" && rank == 1) {
    hooks.on_shipment = [](uint64_t n, std::vector<dist::ShippedFile>& files) {
      if (n == 1 && !files.empty()) files.back().name = "../../escaped.bin";
    };
  }
  // Rank 1 finds its first dump beyond the shipment limit and sends none of it.
  if (g_case == "AnUnsentDumpFailsItsRun" && rank == 1) {
    hooks.on_shipment = [](uint64_t n, std::vector<dist::ShippedFile>& files) {
      if (n == 1 && !files.empty()) files.back().bytes = dist::kWireMaxShipmentBytes + 1;
    };
  }
  // Rank 2 answers clock pings 5 s ahead of the shared clock its trace uses.
  if (g_case == "ARemoteNodesTraceNestsInsideItsServeSlice" && rank == 2) hooks.pong_skew_ns = kSkewNs;
  ServeOptions o;
  o.tensor_heap_bytes = 64ull << 20;
  o.heartbeat_period = std::chrono::milliseconds(50);
  const Status st = dist::serve(node_spec(2), {scale_callable()}, o, std::move(hooks));
  if (!st.ok()) std::fprintf(stderr, "rank %d: serve_node: %s\n", rank, st.to_string().c_str());
  return st.ok() ? 0 : 1;
}

struct Network {
  std::unique_ptr<Worker> w;
  CallableHandle scale;
  DeviceBuffer x, y0, y1, y2;
};

Network make_network() {
  Network n;
  WorkerConfig c = network_config(0, 2);
  c.shared_heap_bytes = 64ull << 20;
  n.w = std::make_unique<Worker>(Level::Network, c);
  Worker node(Level::Node, node_config(1, 0, 2));
  EXPECT_TRUE(node.register_callable(axpb_callable()).ok());
  RemoteNodeOptions ro;
  ro.heartbeat_timeout = std::chrono::seconds(5);
  ro.ready_timeout = std::chrono::seconds(30);
  EXPECT_EQ(*n.w->add_next_level_worker(std::move(node)), 0u);
  EXPECT_EQ(*n.w->add_remote_worker(1, ro), 1u);
  EXPECT_EQ(*n.w->add_remote_worker(2, ro), 2u);
  auto s = n.w->register_callable(scale_callable());
  EXPECT_TRUE(s.ok());
  n.scale = *s;
  const Status st = n.w->init();
  EXPECT_TRUE(st.ok()) << st.to_string();
  n.x = shared_iota(*n.w, kLen, 1);
  n.y0 = shared_iota(*n.w, kLen, 0);
  n.y1 = shared_iota(*n.w, kLen, 0);
  n.y2 = shared_iota(*n.w, kLen, 0);
  return n;
}

TaskArgs scale_args(const DeviceBuffer& in, const DeviceBuffer& out, int64_t mul, int64_t add) {
  TaskArgs a;
  a.add_tensor(in.view({kLen}, DType::F32), Tag::Input)
      .add_tensor(out.view({kLen}, DType::F32), Tag::OutputExisting)
      .add_scalar(mul)
      .add_scalar(add);
  return a;
}

// y0 = x*3+1 on the forked node 0, y1 = x*3+1 on node 1 (rank 1): tasks 0 and 1.
Status run_both(Network& n, const CallConfig& call, bool remote_only = false) {
  RunHandle h = n.w->submit(
      [&](Orchestrator& o) -> Status {
        if (!remote_only)
          SIMPLER_RETURN_IF_ERROR(o.submit_next_level(n.scale, scale_args(n.x, n.y0, 3, 1), 0).status());
        return o.submit_next_level(n.scale, scale_args(n.x, n.y1, 3, 1), 1).status();
      },
      call);
  return wait_run(h);
}

// Each of `ys` holds x*3+1.
void expect_outputs(std::initializer_list<const DeviceBuffer*> ys) {
  for (const DeviceBuffer* y : ys) {
    const float* p = reinterpret_cast<const float*>(y->addr);
    for (int64_t i = 0; i < kLen; ++i) ASSERT_EQ(p[i], (1.f + static_cast<float>(i)) * 3 + 1) << "element " << i;
  }
}

nlohmann::json other_data(const std::string& dir) {
  std::ifstream in(dir + "/trace.json");
  const auto doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  EXPECT_TRUE(doc.is_object() && doc.contains("otherData")) << dir;
  return doc.is_object() ? doc.value("otherData", nlohmann::json::object()) : nlohmann::json::object();
}

std::string process_of(const diag::Trace& t, uint32_t lane) { return t.processes[t.lanes[lane].process].name; }

// Issue 12 through a remote node: one trace.json holds the network, the
// nodes and their chips; a remote node's host slices and its chip's tasks lie
// inside the network's `Serve node<i>` slice once its clock is mapped onto
// rank 0's, with an offset off by at most half the ping-pong's round trip.
// One host: node1's true offset is 0; node2 answers pings 5 s ahead, so its
// estimate must be -5 s and its slices land 5 s early, by exactly that.
TEST(DistMpiTrace, ARemoteNodesTraceNestsInsideItsServeSlice) {
  Watchdog dog(std::chrono::seconds(50));
  Network n = make_network();
  CallConfig call;
  call.swimlane_level = 2;
  call.trace_dir = scratch_dir("mpi_trace", "nest");
  RunHandle h = n.w->submit(
      [&](Orchestrator& o) -> Status {
        SIMPLER_RETURN_IF_ERROR(o.submit_next_level(n.scale, scale_args(n.x, n.y0, 3, 1), 0).status());
        SIMPLER_RETURN_IF_ERROR(o.submit_next_level(n.scale, scale_args(n.x, n.y1, 3, 1), 1).status());
        return o.submit_next_level(n.scale, scale_args(n.x, n.y2, 3, 1), 2).status();
      },
      call);
  ASSERT_TRUE(wait_run(h).ok()) << h.result().to_string();
  expect_outputs({&n.y0, &n.y1, &n.y2});
  auto t = diag::read_trace_dir(call.trace_dir);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  std::set<std::string> names;
  for (const diag::TraceProcess& p : t->processes) {
    names.insert(p.name);
    // Another host's pids may be this one's: a remote node's are moved to rank << 22.
    const int64_t rank = p.name.rfind("node1", 0) == 0 ? 1 : p.name.rfind("node2", 0) == 0 ? 2 : 0;
    EXPECT_EQ(p.pid >> diag::kRemotePidShift, rank) << p.name;
  }
  EXPECT_EQ(names,
            (std::set<std::string>{"network", "node0", "node0/chip0", "node1", "node1/chip0", "node2", "node2/chip0"}));
  ASSERT_EQ(t->tasks.size(), 3u);  // one chip task per node
  const auto other = other_data(call.trace_dir);
  EXPECT_EQ(other["fragments_missing"], nlohmann::json::array());
  ASSERT_EQ(other["remote_fragments"].size(), 2u) << other.dump();
  for (int node = 1; node <= 2; ++node) {
    SCOPED_TRACE("node" + std::to_string(node));
    const auto& r = other["remote_fragments"][node - 1];
    EXPECT_EQ(r["rank"], node);
    EXPECT_EQ(r["path"],
              call.trace_dir + "/run1/node" + std::to_string(node) + "/task" + std::to_string(node) + "/trace.json");
    const int64_t offset = r["clock_offset_ns"].get<int64_t>();
    const int64_t rtt = r["clock_rtt_ns"].get<int64_t>();
    const int64_t skew = node == 2 ? kSkewNs : 0;
    EXPECT_GT(rtt, 0);
    // The offset is rank 0's clock minus the node's: -skew, off by at most rtt / 2.
    EXPECT_LE(std::llabs(offset + skew), rtt / 2 + 1) << "offset " << offset << " ns, round trip " << rtt << " ns";
    const diag::TraceSlice* serve = nullptr;
    for (const diag::TraceSlice& s : t->slices) {
      if (process_of(*t, s.lane) == "network" && t->lanes[s.lane].name == "Serve node" + std::to_string(node)) {
        serve = &s;
      }
    }
    ASSERT_NE(serve, nullptr);
    // Undo the fake skew (what the estimate added beyond the true offset of 0);
    // what is left may be off by the estimate's error, at most rtt / 2.
    const double slack_us = node == 2 ? static_cast<double>(rtt / 2 + 1) / 1000.0 : 0;
    const double back_us = static_cast<double>(skew) / 1000.0;
    int inside = 0;
    const auto expect_inside = [&](double ts, double dur, const std::string& what) {
      EXPECT_GE(ts + back_us, serve->ts - slack_us) << what;
      EXPECT_LE(ts + back_us + dur, serve->ts + serve->dur + slack_us) << what;
      ++inside;
    };
    const std::string me = "node" + std::to_string(node);
    for (const diag::TraceSlice& s : t->slices) {
      const std::string p = process_of(*t, s.lane);
      if (p.rfind(me, 0) == 0) expect_inside(s.ts, s.dur, p + " " + t->kernels[s.name]);
    }
    for (const diag::TraceTask& k : t->tasks) {
      if (process_of(*t, k.lane) == me + "/chip0") expect_inside(k.ts, k.dur, me + "/chip0 task");
    }
    EXPECT_GE(inside, 3);  // the node's build and Serve chip0 slices, its chip's task
    // Rank 0 holds the files where a forked node's go.
    EXPECT_TRUE(
        std::filesystem::exists(call.trace_dir + "/run1/" + me + "/task" + std::to_string(node) + "/trace.json"));
  }
  EXPECT_TRUE(n.w->close().ok());
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Issue 12 through a remote node: the FULL dump of a task on the remote node
// holds the same records and bytes as the same task's on the forked node,
// each under run<R>/node<i>/task<t>/chip0/task0, and `dump diff` finds no
// difference between them.
TEST(DistMpiTrace, ARemoteNodesDumpsEqualAForkedNodes) {
  Watchdog dog(std::chrono::seconds(50));
  Network n = make_network();
  CallConfig call;
  call.dump_args = DumpArgs::Full;
  call.trace_dir = scratch_dir("mpi_trace", "dump");
  ASSERT_TRUE(run_both(n, call).ok());
  expect_outputs({&n.y0, &n.y1});
  const auto dumps = find_args_dumps(call.trace_dir);
  ASSERT_EQ(dumps.size(), 2u);
  EXPECT_EQ(dumps[0].first, "run1/node0/task0/chip0/task0");
  EXPECT_EQ(dumps[1].first, "run1/node1/task1/chip0/task0");
  auto forked = load_args_dump(dumps[0].second);
  auto remote = load_args_dump(dumps[1].second);
  ASSERT_TRUE(forked.ok()) << forked.status().to_string();
  ASSERT_TRUE(remote.ok()) << remote.status().to_string();
  EXPECT_TRUE(remote->complete);
  ASSERT_EQ(remote->args.size(), forked->args.size());
  ASSERT_FALSE(remote->args.empty());
  for (size_t i = 0; i < remote->args.size(); ++i) {
    const DumpedArg &a = forked->args[i], &b = remote->args[i];
    EXPECT_EQ(std::tie(a.task, a.kernel, a.func_id, a.role, a.stage, a.arg, a.dtype, a.shape, a.strides, a.offset,
                       a.bin_offset, a.bytes, a.logical_bytes, a.truncated, a.metadata_only),
              std::tie(b.task, b.kernel, b.func_id, b.role, b.stage, b.arg, b.dtype, b.shape, b.strides, b.offset,
                       b.bin_offset, b.bytes, b.logical_bytes, b.truncated, b.metadata_only))
        << "record " << i;
  }
  const std::string bin = file_bytes(dumps[1].second + "/args.bin");
  EXPECT_FALSE(bin.empty());
  EXPECT_EQ(bin, file_bytes(dumps[0].second + "/args.bin"));
  EXPECT_FALSE(diff_args_dumps(*forked, *remote, 0, 0).differs);
  // The remote output's bytes are the run's: x*3+1.
  const DumpedArg* out = nullptr;
  for (const DumpedArg& a : remote->args) {
    if (a.stage == DumpStage::kAfter && a.arg == 1) out = &a;
  }
  ASSERT_NE(out, nullptr);
  for (int64_t i = 0; i < kLen; ++i) ASSERT_EQ(dumped_element(*remote, *out, i), (1.0 + i) * 3 + 1) << i;
  EXPECT_TRUE(n.w->close().ok());
}

// Files that arrive spoiled are refused whole, naming the field, and the run
// still finishes with its result: a name that leaves the run's directory, a
// file over the size bound, a file cut short before the terminal. The trace
// says which fragment is missing and why; the next run's files are whole.
TEST(DistMpiTrace, AMalformedShipmentIsRefusedAndTheRunFinishes) {
  Watchdog dog(std::chrono::seconds(50));
  Network n = make_network();
  CallConfig call;
  call.swimlane_level = 1;
  call.trace_dir = scratch_dir("mpi_trace", "malformed");
  const char* want[] = {"name \"../../escaped.json\" has a component \"..\"", "file_bytes", "truncated"};
  for (int r = 1; r <= 3; ++r) {
    SCOPED_TRACE("run " + std::to_string(r));
    std::memset(reinterpret_cast<void*>(n.y1.addr), 0, kLen * sizeof(float));
    ASSERT_TRUE(run_both(n, call, /*remote_only=*/true).ok());
    expect_outputs({&n.y1});
    const std::string run_dir = call.trace_dir + "/run" + std::to_string(r);
    const auto other = other_data(call.trace_dir);
    ASSERT_EQ(other["remote_fragments"].size(), 1u) << other.dump();
    const std::string refused = other["remote_fragments"][0].value("refused", "");
    EXPECT_NE(refused.find(want[r - 1]), std::string::npos) << refused;
    EXPECT_NE(refused.find("MPI rank 1"), std::string::npos) << refused;
    EXPECT_EQ(other["fragments_missing"], nlohmann::json::array({run_dir + "/node1/task0/trace.json"}));
    // Nothing of a refused shipment stays, nor escaped the run's directory.
    std::error_code ec;
    size_t kept = 0;
    for (auto it = std::filesystem::recursive_directory_iterator(run_dir + "/node1", ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      kept += it->is_regular_file() ? 1 : 0;
    }
    EXPECT_EQ(kept, 0u);
    EXPECT_FALSE(std::filesystem::exists(call.trace_dir + "/escaped.json"));
    EXPECT_FALSE(std::filesystem::exists(run_dir + "/escaped.json"));
  }
  // The fourth run's files are whole.
  ASSERT_TRUE(run_both(n, call, /*remote_only=*/true).ok());
  const auto other = other_data(call.trace_dir);
  EXPECT_EQ(other["fragments_missing"], nlohmann::json::array());
  EXPECT_FALSE(other["remote_fragments"][0].contains("refused"));
  auto t = diag::read_trace_dir(call.trace_dir);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  std::set<std::string> names;
  for (const diag::TraceProcess& p : t->processes) names.insert(p.name);
  EXPECT_EQ(names, (std::set<std::string>{"network", "node1", "node1/chip0"}));
  EXPECT_TRUE(n.w->close().ok());
}

// A dump-only run has no trace to mark a refused fragment in, and the dump
// is what the user asked for: the run fails, naming the task, the node and
// why its files were refused, and the node's outputs are still in place. The
// next run's dump arrives whole.
TEST(DistMpiTrace, ARefusedDumpFailsItsRun) {
  Watchdog dog(std::chrono::seconds(50));
  Network n = make_network();
  CallConfig call;
  call.dump_args = DumpArgs::Full;
  call.trace_dir = scratch_dir("mpi_trace", "refused_dump");
  const Status first = run_both(n, call, /*remote_only=*/true);
  EXPECT_EQ(first.code(), StatusCode::kInternal) << first.to_string();
  EXPECT_NE(first.message().find("argument dump from next-level worker 1 did not arrive"), std::string::npos)
      << first.to_string();
  EXPECT_NE(first.message().find("MPI rank 1"), std::string::npos) << first.to_string();
  EXPECT_NE(first.message().find("\"..\""), std::string::npos) << first.to_string();
  expect_outputs({&n.y1});
  EXPECT_TRUE(find_args_dumps(call.trace_dir).empty());
  EXPECT_FALSE(std::filesystem::exists(call.trace_dir + "/escaped.bin"));
  ASSERT_TRUE(run_both(n, call, /*remote_only=*/true).ok());
  const auto dumps = find_args_dumps(call.trace_dir);
  ASSERT_EQ(dumps.size(), 1u);
  EXPECT_EQ(dumps[0].first, "run2/node1/task0/chip0/task0");
  EXPECT_TRUE(n.w->close().ok());
}

// A dump the node could not send at all (beyond the shipment limit) fails
// its run like a refused one: the dump the user asked for is lost, which
// is never a success. The next run's dump arrives whole.
TEST(DistMpiTrace, AnUnsentDumpFailsItsRun) {
  Watchdog dog(std::chrono::seconds(50));
  Network n = make_network();
  CallConfig call;
  call.dump_args = DumpArgs::Full;
  call.trace_dir = scratch_dir("mpi_trace", "unsent_dump");
  const Status first = run_both(n, call, /*remote_only=*/true);
  EXPECT_EQ(first.code(), StatusCode::kInternal) << first.to_string();
  EXPECT_NE(first.message().find("argument dump from next-level worker 1 did not arrive"), std::string::npos)
      << first.to_string();
  EXPECT_NE(first.message().find("none arrived before the TERMINAL"), std::string::npos) << first.to_string();
  expect_outputs({&n.y1});
  EXPECT_TRUE(find_args_dumps(call.trace_dir).empty());
  ASSERT_TRUE(run_both(n, call, /*remote_only=*/true).ok());
  EXPECT_EQ(find_args_dumps(call.trace_dir).size(), 1u);
  EXPECT_TRUE(n.w->close().ok());
}

}  // namespace
}  // namespace simpler::testing

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: mpirun -np 3 %s <case>\n", argv[0]);
    return 2;
  }
  simpler::testing::g_case = argv[1];
  const int rank = simpler::mpi_rank();
  if (simpler::mpi_size() != 3) {
    std::fprintf(stderr, "run under mpirun -np 3 (this is rank %d of %d)\n", rank, simpler::mpi_size());
    return 2;
  }
  if (rank != 0) return simpler::testing::serve_rank(rank);
  const std::string filter = "--gtest_filter=DistMpiTrace." + simpler::testing::g_case;
  std::vector<char*> args = {argv[0], const_cast<char*>(filter.c_str()), nullptr};
  int n = static_cast<int>(args.size()) - 1;
  ::testing::InitGoogleTest(&n, args.data());
  return RUN_ALL_TESTS();
}
