// The network level (L4): a Worker whose next-level workers are forked nodes,
// each a Level::Node Worker with chips and sub workers of its own. The same
// engine runs both levels (the level is a label), so these cases check what
// nesting adds: a node run built in the node's own process from a
// NodeCallable, tensors in the network's shared heap reaching grandchildren,
// node failures and deaths confined to their own runs, and the R68 grant
// check one level up.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ipc/sub_worker_handler.h"
#include "node/node_worker.h"
#include "node/observer.h"
#include "node_test_util.h"
#include "test_util.h"

namespace simpler::testing {
namespace {

constexpr int kN = 128;

// z = x + y over f32 tensors: the sub function at both levels.
Status add_sub(const TaskArgsView& a) {
  const int64_t n = a[0].tensor.shape(0);
  for (int64_t i = 0; i < n; ++i) a.data<float>(2)[i] = a.data<float>(0)[i] + a.data<float>(1)[i];
  return Status();
}

// A node as the network adds it: one chip, one sub worker, the axpb callable
// and add_sub registered in that order, so every node's handles agree.
struct NodeHandles {
  CallableHandle axpb;
  FunctionHandle add;
};

NodeHandles add_node(Worker& net, uint32_t depth) {
  Worker node(Level::Node, node_config(1, 1, depth));
  auto axpb = node.register_callable(axpb_callable());
  auto add = node.register_function(add_sub);
  EXPECT_TRUE(axpb.ok() && add.ok());
  auto index = net.add_next_level_worker(std::move(node));
  EXPECT_TRUE(index.ok()) << index.status().to_string();
  return NodeHandles{*axpb, *add};
}

// One node run: y = x * mul + gate-free add (on the node's chip, y in the
// node's own heap), then z = y + x (on the node's sub worker). x and z live in
// the network's heap; args: x, z, mul, gate.
NodeCallable step_callable(const NodeHandles& h) {
  return NodeCallable("step", [h](Orchestrator& o, const TaskArgs& a) -> Status {
    Scope scope(o);
    auto y = o.alloc({kN}, DType::F32);
    if (!y.ok()) return y.status();
    SIMPLER_RETURN_IF_ERROR(
        o.submit_next_level(h.axpb, axpb_args(a[0].tensor, *y, a[2].scalar, 0, a[3].scalar), 0).status());
    TaskArgs s;
    s.add_tensor(*y, Tag::Input).add_tensor(a[0].tensor, Tag::Input).add_tensor(a[1].tensor, Tag::OutputExisting);
    return o.submit_sub(h.add, s).status();
  });
}

TaskArgs step_args(const DeviceBuffer& x, const DeviceBuffer& z, int64_t mul, int64_t gate = -1) {
  TaskArgs a;
  a.add_tensor(x.view({kN}, DType::F32), Tag::Input)
      .add_tensor(z.view({kN}, DType::F32), Tag::OutputExisting)
      .add_scalar(mul)
      .add_scalar(gate);
  return a;
}

const float* floats(const DeviceBuffer& b) { return reinterpret_cast<const float*>(b.addr); }

// The issue's nesting through the public API: two forked nodes, each with a
// chip and a sub worker, run a NodeCallable per run; the network's own sub
// worker then sums both nodes' outputs, waiting on them through tensor tags.
// Runs are pipelined four deep.
TEST(NetworkWorker, TwoNodesRunNodeCallablesAndTheNetworkSubWorkerJoinsThem) {
  Watchdog dog;
  make_node_gates();
  WorkerConfig nc = network_config(1, 4);
  Worker net(Level::Network, nc);
  const NodeHandles h0 = add_node(net, 4);
  const NodeHandles h1 = add_node(net, 4);
  ASSERT_EQ(h0.axpb.digest, h1.axpb.digest);
  auto step = net.register_callable(step_callable(h0));
  auto join = net.register_function(add_sub);
  ASSERT_TRUE(step.ok() && join.ok());
  ASSERT_TRUE(net.init().ok());

  const int runs = 8;
  const DeviceBuffer x = shared_iota(net, kN, 1.0f);
  std::vector<DeviceBuffer> z0(runs), z1(runs), out(runs);
  std::vector<RunHandle> handles;
  for (int r = 0; r < runs; ++r) {
    z0[r] = shared_iota(net, kN, 0);
    z1[r] = shared_iota(net, kN, 0);
    out[r] = shared_iota(net, kN, 0);
    handles.push_back(net.submit([&, r](Orchestrator& o) -> Status {
      SIMPLER_RETURN_IF_ERROR(o.submit_next_level(*step, step_args(x, z0[r], 2 + r), 0).status());
      SIMPLER_RETURN_IF_ERROR(o.submit_next_level(*step, step_args(x, z1[r], 10), 1).status());
      TaskArgs s;
      s.add_tensor(z0[r].view({kN}, DType::F32), Tag::Input)
          .add_tensor(z1[r].view({kN}, DType::F32), Tag::Input)
          .add_tensor(out[r].view({kN}, DType::F32), Tag::OutputExisting);
      return o.submit_sub(*join, s).status();
    }));
  }
  for (int r = 0; r < runs; ++r) {
    ASSERT_TRUE(wait_run(handles[r]).ok()) << "run " << r << ": " << handles[r].result().to_string();
    for (int i = 0; i < kN; ++i) {
      const float xi = 1.0f + static_cast<float>(i);
      // node 0: x*(2+r) + x; node 1: x*10 + x; the network sums them.
      ASSERT_EQ(floats(out[r])[i], xi * static_cast<float>(2 + r) + xi + xi * 10.0f + xi) << "run " << r << " i " << i;
    }
    EXPECT_EQ(handles[r].stats().tasks, 3u);
    EXPECT_EQ(handles[r].stats().executed, 3u);
  }
  EXPECT_TRUE(net.close().ok());
}

// A failing chip kernel inside one node fails that node run, and so only the
// network run that held it, with the kernel's own text; the runs around it
// succeed (R14, R15 one level up).
TEST(NetworkWorker, AFailureInsideANodeIsOnlyItsOwnRuns) {
  Watchdog dog;
  make_node_gates();
  Worker net(Level::Network, network_config(0, 2));
  const NodeHandles h = add_node(net, 2);
  auto step = net.register_callable(step_callable(h));
  ASSERT_TRUE(step.ok());
  ASSERT_TRUE(net.init().ok());
  const DeviceBuffer x = shared_iota(net, kN, 0);
  std::vector<DeviceBuffer> z;
  std::vector<RunHandle> handles;
  for (int r = 0; r < 3; ++r) {
    z.push_back(shared_iota(net, kN, 0));
    const int64_t mul = r == 1 ? kAxpbFail : 3;
    handles.push_back(net.submit(
        [&, r, mul](Orchestrator& o) { return o.submit_next_level(*step, step_args(x, z[r], mul), 0).status(); }));
  }
  EXPECT_TRUE(wait_run(handles[0]).ok()) << handles[0].result().to_string();
  const Status failed = wait_run(handles[1]);
  EXPECT_FALSE(failed.ok());
  EXPECT_TRUE(contains(failed.message(), "asked to fail")) << failed.to_string();
  EXPECT_TRUE(wait_run(handles[2]).ok()) << handles[2].result().to_string();
  EXPECT_EQ(floats(z[2])[5], 5.0f * 3 + 5.0f);
  EXPECT_TRUE(net.close().ok());
}

// Every refusal names what is wrong and changes nothing: the wrong level,
// an initialised node, a node whose own config is invalid, callables of the
// other level, and memory calls a network does not serve.
TEST(NetworkWorker, RefusalsNameTheFieldAndChangeNothing) {
  Watchdog dog;
  Worker net(Level::Network, network_config(0, 2));
  Worker chip_level(Level::Chip, node_config(0, 0, 2));
  EXPECT_REFUSED(net.add_next_level_worker(std::move(chip_level)).status(), StatusCode::kInvalidArgument,
                 "Level::Node");
  Worker bad(Level::Node, node_config(1, 0, 0));
  EXPECT_REFUSED(net.add_next_level_worker(std::move(bad)).status(), StatusCode::kInvalidArgument,
                 "next-level worker 0: pipeline_depth = 0");
  EXPECT_REFUSED(bad.init(), StatusCode::kInvalidArgument, "pipeline_depth = 0");  // `bad` was left as it was
  EXPECT_REFUSED(net.register_callable(axpb_callable()).status(), StatusCode::kFailedPrecondition, "NodeCallables");
  Worker launching(Level::Network, network_config(1, 2, 1));
  EXPECT_REFUSED(launching.init(), StatusCode::kInvalidArgument, "launch_depth = 1");

  Worker node(Level::Node, node_config(1, 0, 2));
  ASSERT_TRUE(node.register_callable(axpb_callable()).ok());
  EXPECT_REFUSED(
      node.register_callable(NodeCallable("n", [](Orchestrator&, const TaskArgs&) { return Status(); })).status(),
      StatusCode::kFailedPrecondition, "Level::Network");
  EXPECT_REFUSED(node.add_next_level_worker(Worker(Level::Node, node_config(1, 0, 2))).status(),
                 StatusCode::kFailedPrecondition, "Level::Network workers only");
  auto index = net.add_next_level_worker(std::move(node));
  ASSERT_TRUE(index.ok()) << index.status().to_string();
  EXPECT_EQ(*index, 0u);
  EXPECT_REFUSED(node.init(), StatusCode::kFailedPrecondition, "closed");  // it lives on in the network now
  auto noop = NodeCallable("noop", [](Orchestrator&, const TaskArgs&) { return Status(); });
  ASSERT_TRUE(net.register_callable(noop).ok());
  EXPECT_REFUSED(net.register_callable(noop).status(), StatusCode::kInvalidArgument, "already registered");

  ASSERT_TRUE(net.init().ok());
  EXPECT_REFUSED(net.malloc(64).status(), StatusCode::kFailedPrecondition, "malloc_shared");
  EXPECT_REFUSED(net.malloc_on(0, 64).status(), StatusCode::kFailedPrecondition, "malloc_shared");
  Worker late(Level::Node, node_config(1, 0, 2));
  EXPECT_REFUSED(net.add_next_level_worker(std::move(late)).status(), StatusCode::kFailedPrecondition, "before init");
  EXPECT_TRUE(net.close().ok());
}

// R72 one level up: the network's memory info is the exact sum of its
// nodes', each read through that node's control frame from its own chips.
TEST(NetworkWorker, R72MemoryInfoIsTheExactSumOverNodes) {
  Watchdog dog;
  Worker net(Level::Network, network_config(0, 2));
  WorkerConfig a = node_config(1, 0, 2), b = node_config(2, 0, 2);
  a.device_memory_bytes = (48ull << 20) + 4096;
  b.device_memory_bytes = 80ull << 20;
  Worker na(Level::Node, a), nb(Level::Node, b);
  ASSERT_TRUE(na.register_callable(axpb_callable()).ok());
  ASSERT_TRUE(nb.register_callable(axpb_callable()).ok());
  ASSERT_TRUE(net.add_next_level_worker(std::move(na)).ok());
  ASSERT_TRUE(net.add_next_level_worker(std::move(nb)).ok());
  ASSERT_TRUE(net.init().ok());
  auto m = net.memory_info();
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->total_bytes, a.device_memory_bytes + 2 * b.device_memory_bytes);
  auto on1 = net.memory_info_on(1);
  ASSERT_TRUE(on1.ok()) << on1.status().to_string();
  EXPECT_EQ(on1->total_bytes, 2 * b.device_memory_bytes);
  EXPECT_REFUSED(net.memory_info_on(2).status(), StatusCode::kInvalidArgument, "worker = 2");
  EXPECT_LE(m->free_bytes, m->total_bytes);
  auto again = net.memory_info();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->total_bytes, m->total_bytes);
  EXPECT_TRUE(net.close().ok());
}

// R68 one level up: a node that admits fewer runs than the network's
// pipeline_depth fails the network's startup, naming both numbers.
TEST(NetworkWorker, R68ANodeGrantingFewerSetsFailsStartup) {
  Watchdog dog;
  Worker net(Level::Network, network_config(0, 4));
  Worker node(Level::Node, node_config(1, 0, 2));
  ASSERT_TRUE(node.register_callable(axpb_callable()).ok());
  ASSERT_TRUE(net.add_next_level_worker(std::move(node)).ok());
  EXPECT_REFUSED(net.init(), StatusCode::kFailedPrecondition, "granted 2 run-resource sets of the pipeline_depth = 4");
}

// Issue 9 item 8, one level up: a node whose chip refuses init fails the
// node's own init, and the network's init reports the innermost code
// (RESOURCE_EXHAUSTED), naming the node and its chip.
TEST(NetworkWorker, Issue9ARefusedInitInsideANodeSurfacesItsOwnCode) {
  Watchdog dog;
  Worker net(Level::Network, network_config(0, 2));
  WorkerConfig c = node_config(1, 0, 2);
  c.device_memory_bytes = 4096;
  Worker node(Level::Node, c);
  ASSERT_TRUE(node.register_callable(axpb_callable()).ok());
  ASSERT_TRUE(net.add_next_level_worker(std::move(node)).ok());
  const Status st = net.init();
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "node worker 0: child init failed: chip worker 0: child init failed: "))
      << st.to_string();
}

// Issue 9 item 15, one level down: a network's node is simpler-node<i>, and
// the processes it forks are named as in any node.
TEST(NetworkWorker, Issue9NodesAndTheirChildrenAreNamed) {
  Watchdog dog;
  make_node_gates();
  NodeSpec spec;
  spec.level = Level::Network;
  spec.config = network_config(0, 2);
  for (int i = 0; i < 3; ++i) {
    NodeSpec node;
    node.config = node_config(1, 1, 2);
    node.chip_callables = {axpb_callable()};
    node.functions = {add_sub};
    spec.nodes.push_back(node);
  }
  auto created = NodeWorker::create(spec);
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  NodeWorker& net = **created;
  for (uint32_t i = 0; i < 3; ++i) {
    const pid_t node = net.next_child(i).pid();
    EXPECT_EQ(comm_of(node), "simpler-node" + std::to_string(i));
    std::multiset<std::string> names;
    for (pid_t d : descendants_of(node)) names.insert(comm_of(d));
    EXPECT_EQ(names, (std::multiset<std::string>{"simpler-chip0", "simpler-fork", "simpler-sub0"})) << "node " << i;
  }
  EXPECT_TRUE(net.close(std::chrono::seconds(30)).ok());
}

// A node killed with SIGKILL: its fork server, chip and sub worker die with
// it (they serve nobody), the run it held ends with an error naming the kill, and
// the other node keeps serving.
TEST(NetworkWorker, AKilledNodeEndsItsRunsAndTakesItsChildrenWithIt) {
  Watchdog dog;
  TestGates* gates = make_node_gates();
  NodeSpec spec;
  spec.level = Level::Network;
  spec.config = node_config(0, 0, 2);
  NodeHandles h{};
  for (int i = 0; i < 2; ++i) {
    NodeSpec node;
    node.config = node_config(1, 1, 2);
    node.chip_callables = {axpb_callable()};
    node.functions = {add_sub};
    spec.nodes.push_back(node);
  }
  h.axpb = CallableHandle{0, axpb_callable().digest()};
  h.add = FunctionHandle{0, sub_function_digest(0)};
  spec.node_callables = {step_callable(h)};
  const CallableHandle step{0, spec.node_callables[0].digest()};
  auto created = NodeWorker::create(spec);
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  NodeWorker& net = **created;

  const pid_t victim = net.next_child(0).pid();
  const std::vector<pid_t> grandchildren = descendants_of(victim);
  ASSERT_EQ(grandchildren.size(), 3u) << "node 0 forks its fork server, and that one chip and one sub worker";
  std::vector<int> pidfds;  // opened while they run, so a reused pid cannot fool the check
  for (pid_t g : grandchildren) pidfds.push_back(open_pidfd(g));

  auto x = net.malloc_shared(kN * sizeof(float)), z0 = net.malloc_shared(kN * sizeof(float)),
       z1 = net.malloc_shared(kN * sizeof(float));
  ASSERT_TRUE(x.ok() && z0.ok() && z1.ok());
  for (int i = 0; i < kN; ++i) reinterpret_cast<float*>(x->addr)[i] = static_cast<float>(i);
  Observer obs;
  ASSERT_TRUE(
      obs.start({{net.next_child(0).mapping(), net.next_child(0).endpoint().view()}}, now_ns() + kTestWaitNs).ok());
  // Gate 0 stays shut: the run on node 0 cannot finish before its node dies.
  RunHandle held =
      net.submit([&](Orchestrator& o) { return o.submit_next_level(step, step_args(*x, *z0, 2, 0), 0).status(); });
  ASSERT_TRUE(eventually([&] { return obs.evidence(0).widest == 1; })) << "the run never launched on node 0";
  ASSERT_TRUE(obs.stop(now_ns() + kTestWaitNs).ok());
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  const Status ended = wait_run(held);
  EXPECT_EQ(ended.code(), StatusCode::kAborted) << ended.to_string();
  EXPECT_TRUE(contains(ended.message(), "signal 9")) << ended.to_string();
  for (size_t k = 0; k < pidfds.size(); ++k) {
    EXPECT_TRUE(exits_within(pidfds[k], 30'000)) << "descendant " << grandchildren[k] << " outlived its node";
  }

  RunHandle other =
      net.submit([&](Orchestrator& o) { return o.submit_next_level(step, step_args(*x, *z1, 4), 1).status(); });
  EXPECT_TRUE(wait_run(other).ok()) << other.result().to_string();
  EXPECT_EQ(floats(*z1)[3], 3.0f * 4 + 3.0f);
  gates->open_gate(0);
  EXPECT_TRUE(net.close(std::chrono::seconds(30)).ok()) << "the killed node's replacement closes cleanly";
}

// R54 at the network level: close() with 5 unwaited runs in flight (4 held
// behind gate 0 on the node's chip, one that fails once the gate opens).
// The signal that close() is under way is deterministic, not a thread
// state: with all pipeline_depth runs admitted, try_submit() finds no room
// (nothing created) until close() sets the closing flag, and from then on it
// is refused. The 5 runs are still in flight then; once the gate opens,
// close() drains them: every handle is terminal, no run is admitted, and the
// failed run returns the same error on every read.
TEST(NetworkClose, R54CloseDrainsRunsHeldInFlight) {
  Watchdog dog;
  TestGates* gates = make_node_gates();
  constexpr int kRuns = 5;
  NodeSpec spec;
  spec.level = Level::Network;
  spec.config = network_config(0, kRuns);
  NodeSpec node;
  node.config = node_config(1, 1, kRuns);
  node.chip_callables = {axpb_callable()};
  node.functions = {add_sub};
  spec.nodes.push_back(node);
  const NodeHandles h{CallableHandle{0, axpb_callable().digest()}, FunctionHandle{0, sub_function_digest(0)}};
  spec.node_callables = {step_callable(h)};
  const CallableHandle step{0, spec.node_callables[0].digest()};
  auto created = NodeWorker::create(spec);
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  NodeWorker& net = **created;
  auto x = net.malloc_shared(kN * sizeof(float));
  ASSERT_TRUE(x.ok());
  for (int i = 0; i < kN; ++i) reinterpret_cast<float*>(x->addr)[i] = static_cast<float>(i);
  std::vector<DeviceBuffer> z;
  std::vector<RunHandle> runs;
  for (int r = 0; r < kRuns; ++r) {
    auto b = net.malloc_shared(kN * sizeof(float));
    ASSERT_TRUE(b.ok());
    z.push_back(*b);
    const int64_t mul = r == kRuns - 1 ? kAxpbFail : 2;
    runs.push_back(net.submit(
        [&, r, mul](Orchestrator& o) { return o.submit_next_level(step, step_args(*x, z[r], mul, 0), 0).status(); }));
  }
  ASSERT_EQ(net.admitted_runs(), static_cast<uint32_t>(kRuns));
  Status closed = internal_error("close() never returned");
  std::thread closer([&] { closed = net.close(std::chrono::seconds(30)); });
  std::optional<RunHandle> probe;
  const bool refused = eventually([&] {
    probe = net.try_submit([](Orchestrator&) { return internal_error("a refused run is never built"); });
    return probe.has_value();
  });
  if (!refused) {
    gates->open_gate(0);
    closer.join();
    FAIL() << "try_submit never saw the closing network";
  }
  ASSERT_TRUE(probe->done());
  EXPECT_REFUSED(probe->result(), StatusCode::kFailedPrecondition, "closed");
  for (int r = 0; r < kRuns; ++r) EXPECT_FALSE(runs[r].done()) << "run " << r << " ended before its gate opened";
  gates->open_gate(0);
  closer.join();
  EXPECT_TRUE(closed.ok()) << closed.to_string();
  EXPECT_EQ(net.admitted_runs(), 0u);
  for (int r = 0; r + 1 < kRuns; ++r) {
    ASSERT_TRUE(runs[r].done());
    EXPECT_TRUE(runs[r].result().ok()) << runs[r].result().to_string();
    EXPECT_EQ(floats(z[r])[3], 3.0f * 2 + 3.0f);
  }
  RunHandle& failing = runs[kRuns - 1];
  ASSERT_TRUE(failing.done());
  const Status first = failing.result();
  EXPECT_FALSE(first.ok());
  EXPECT_TRUE(contains(first.message(), "asked to fail")) << first.to_string();
  EXPECT_EQ(failing.result(), first);
  EXPECT_EQ(failing.wait(), first);
}

// Issue 9 item 5, one level up: a killed node is replaced by a node
// initialised the same way (its own fork server, chip and sub worker, named
// as before) that serves later runs, until its budget is spent; then a run
// for it is refused naming it, and the network's memory_info names it.
TEST(NetworkWorker, Issue9AKilledNodeIsReplacedInitialisedTheSameWay) {
  Watchdog dog;
  make_node_gates();
  NodeSpec spec;
  spec.level = Level::Network;
  spec.config = network_config(0, 2);
  NodeSpec node;
  node.config = node_config(1, 1, 2);
  node.chip_callables = {axpb_callable()};
  node.functions = {add_sub};
  spec.nodes = {node, node};
  const NodeHandles h{CallableHandle{0, axpb_callable().digest()}, FunctionHandle{0, sub_function_digest(0)}};
  spec.node_callables = {step_callable(h)};
  const CallableHandle step{0, spec.node_callables[0].digest()};
  auto created = NodeWorker::create(spec);
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  NodeWorker& net = **created;
  auto x = net.malloc_shared(kN * sizeof(float)), z = net.malloc_shared(kN * sizeof(float));
  ASSERT_TRUE(x.ok() && z.ok());
  for (int i = 0; i < kN; ++i) reinterpret_cast<float*>(x->addr)[i] = static_cast<float>(i);
  auto step_on = [&](uint32_t n, int64_t mul) {
    return wait_run(net.submit(
        [&, n, mul](Orchestrator& o) { return o.submit_next_level(step, step_args(*x, *z, mul), n).status(); }));
  };
  ForkedChild& node0 = net.next_child(0);
  for (size_t k = 0; k < kRespawnBudget; ++k) {
    const uint64_t before = node0.incarnation();
    ASSERT_EQ(::kill(node0.pid(), SIGKILL), 0);
    ASSERT_TRUE(eventually([&] { return node0.incarnation() != before; })) << "no replacement node was forked";
    const Status st = step_on(0, static_cast<int64_t>(k + 2));
    ASSERT_TRUE(st.ok()) << "replacement " << k + 1 << ": " << st.to_string();
    EXPECT_EQ(floats(*z)[3], 3.0f * static_cast<float>(k + 2) + 3.0f);
    EXPECT_EQ(comm_of(node0.pid()), "simpler-node0");
    std::multiset<std::string> names;
    for (pid_t d : descendants_of(node0.pid())) names.insert(comm_of(d));
    EXPECT_EQ(names, (std::multiset<std::string>{"simpler-chip0", "simpler-fork", "simpler-sub0"}));
  }
  ASSERT_EQ(::kill(node0.pid(), SIGKILL), 0);
  ASSERT_TRUE(eventually([&] { return node0.failure().has_value(); })) << "the spent budget never failed node 0";
  const std::string gone = "node worker 0 is gone: ABORTED: it died again after 3 replacements within 60 s";
  EXPECT_REFUSED(step_on(0, 2), StatusCode::kAborted, gone);
  EXPECT_REFUSED(net.memory_info().status(), StatusCode::kAborted, gone);
  EXPECT_TRUE(step_on(1, 5).ok()) << "node 1 serves on";
  EXPECT_EQ(floats(*z)[3], 3.0f * 5 + 3.0f);
  EXPECT_FALSE(net.close(std::chrono::seconds(30)).ok()) << "close reports how the failed node last died";
}

}  // namespace
}  // namespace simpler::testing
