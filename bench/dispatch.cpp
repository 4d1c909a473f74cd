// dispatch: 10k no-op tasks (SIMPLER_BENCH_DISPATCH_TASKS) in three dependency shapes, built from tensor tags
// on the small geometry, against the same DAG in a oneTBB flow graph. The
// reference runtime runs the same DAG too: its row is plain serial execution,
// so the difference is what the AICPU/core hand-off costs. The
// tensormap_and_ringbuffer row builds on the device while the tasks run, so
// its goal is host_build_graph's figure, measured in the same run. The
// resident row builds as host_build_graph does and schedules on the cores.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <deque>
#include <thread>

#include <fmt/format.h>

#include <tbb/flow_graph.h>

#include "base/errors.h"
#include "benchmarks.h"

namespace simpler::bench {
namespace {

// Tasks per graph: SIMPLER_BENCH_DISPATCH_TASKS (a quick run shrinks it), at most the default.
constexpr const char* kTasksDefault = "10000";
constexpr uint32_t kMaxTasks = 10'000;
constexpr uint32_t kLayerWidth = 64;
constexpr int64_t kRowElems = 16;  // one 64-byte row of F32 per task
constexpr int kWarmupReps = 2;
constexpr int kMaxReps = 15;
constexpr uint64_t kShapeBudgetNs = 8'000'000'000;
// Issue 16's goals for each shape against oneTBB: quiet, and beside busy neighbours.
constexpr double kPeerGoalRatioQuiet = 2.5;
constexpr double kPeerGoalRatioLoaded = 3.0;
// Lets the flow graph's worker threads go back to sleep before simpler is timed.
constexpr std::chrono::milliseconds kSettle{50};
constexpr uint64_t kDagSeed = 0x5eed'0f'da6ull;

enum class Shape { Independent, Chain, Layered };

struct ShapeSpec {
  Shape shape;
  const char* name;
  double goal_ns_per_task;  // 0: no absolute goal, only the peer ratio
};
constexpr std::array<ShapeSpec, 3> kShapes = {
    {{Shape::Independent, "independent", 300.0}, {Shape::Chain, "chain", 1000.0}, {Shape::Layered, "layered", 0.0}}};

// One DAG, two encodings: predecessor lists (for the flow graph) and per-task
// arguments whose tags imply exactly those edges (for simpler).
struct Dag {
  std::vector<std::vector<uint32_t>> preds;
  std::vector<TaskArgs> args;
  size_t edges = 0;
};

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Task i owns row i of `rows`; only tags differ between shapes. Chain tasks
// all InOut one row, so each depends on the one before it.
Result<Dag> make_dag(Shape shape, const TensorView& rows, uint32_t tasks) {
  Dag dag;
  dag.preds.resize(tasks);
  dag.args.resize(tasks);
  uint64_t rng = kDagSeed;
  for (uint32_t i = 0; i < tasks; ++i) {
    const uint32_t task_row = shape == Shape::Chain ? 0 : i;
    Result<TensorView> own = rows.tile({task_row, 0}, {1, kRowElems});
    if (!own.ok()) return own.status();
    switch (shape) {
      case Shape::Independent:
        dag.args[i].add_tensor(*own, Tag::OutputExisting);
        break;
      case Shape::Chain:
        dag.args[i].add_tensor(*own, Tag::InOut);
        if (i > 0) dag.preds[i].push_back(i - 1);
        break;
      case Shape::Layered: {
        dag.args[i].add_tensor(*own, Tag::OutputExisting);
        if (i < kLayerWidth) break;
        const uint32_t prev_layer = i / kLayerWidth * kLayerWidth - kLayerWidth;
        const uint32_t want = 1 + static_cast<uint32_t>(splitmix64(rng) % 3);
        auto& preds = dag.preds[i];
        while (preds.size() < want) {
          const uint32_t p = prev_layer + static_cast<uint32_t>(splitmix64(rng) % kLayerWidth);
          if (std::find(preds.begin(), preds.end(), p) != preds.end()) continue;
          preds.push_back(p);
          Result<TensorView> input = rows.tile({p, 0}, {1, kRowElems});
          if (!input.ok()) return input.status();
          dag.args[i].add_tensor(*input, Tag::Input);
        }
        break;
      }
    }
    dag.edges += dag.preds[i].size();
  }
  return dag;
}

struct SimplerFigures {
  Summary ns_per_task;
  Summary build_ns_per_task;
  Summary device_ns_per_task;
  uint32_t tasks = 0;
};

Result<SimplerFigures> measure_simpler(Worker& worker, CallableHandle callable, const Dag*& current, const Dag& dag) {
  current = &dag;
  const auto tasks = static_cast<uint32_t>(dag.args.size());
  std::vector<double> total, build, device;
  SimplerFigures f;
  const uint64_t start = wall_ns();
  for (int rep = 0; rep < kWarmupReps + kMaxReps; ++rep) {
    const uint64_t t0 = wall_ns();
    RunHandle run = worker.submit(callable, TaskArgs{});
    Status s = run.wait();
    const uint64_t t1 = wall_ns();
    if (!s.ok()) return s;
    const RunStats stats = run.stats();
    if (stats.tasks != tasks) {
      return Status(StatusCode::kInternal, fmt::format("run has {} tasks, expected {}", stats.tasks, tasks));
    }
    f.tasks = stats.tasks;
    if (rep < kWarmupReps) continue;
    total.push_back(static_cast<double>(t1 - t0) / tasks);
    build.push_back(stats.build_us * 1000.0 / tasks);
    device.push_back(stats.device_us * 1000.0 / tasks);
    if (wall_ns() - start > kShapeBudgetNs) break;
  }
  f.ns_per_task = summarize(std::move(total));
  f.build_ns_per_task = summarize(std::move(build));
  f.device_ns_per_task = summarize(std::move(device));
  return f;
}

using FlowNode = tbb::flow::continue_node<tbb::flow::continue_msg>;

void build_flow_graph(tbb::flow::graph& g, std::deque<FlowNode>& nodes, const Dag& dag) {
  for (size_t i = 0; i < dag.preds.size(); ++i) {
    nodes.emplace_back(g, [](const tbb::flow::continue_msg&) { return tbb::flow::continue_msg(); });
    for (uint32_t p : dag.preds[i]) tbb::flow::make_edge(nodes[p], nodes[i]);
  }
}

void run_flow_graph(tbb::flow::graph& g, std::deque<FlowNode>& nodes, const Dag& dag) {
  for (size_t i = 0; i < dag.preds.size(); ++i) {
    if (dag.preds[i].empty()) nodes[i].try_put(tbb::flow::continue_msg());
  }
  g.wait_for_all();
}

// Build + run, like a simpler run (which builds its graph per submit); and
// run-only over a graph built once, the flow graph's best case.
std::pair<Summary, Summary> measure_flow_graph(const Dag& dag) {
  std::vector<double> build_and_run, run_only;
  const auto tasks = static_cast<double>(dag.preds.size());
  const uint64_t start = wall_ns();
  for (int rep = 0; rep < kWarmupReps + kMaxReps; ++rep) {
    tbb::flow::graph g;
    std::deque<FlowNode> nodes;
    const uint64_t t0 = wall_ns();
    build_flow_graph(g, nodes, dag);
    run_flow_graph(g, nodes, dag);
    const uint64_t t1 = wall_ns();
    run_flow_graph(g, nodes, dag);
    const uint64_t t2 = wall_ns();
    if (rep < kWarmupReps) continue;
    build_and_run.push_back(static_cast<double>(t1 - t0) / tasks);
    run_only.push_back(static_cast<double>(t2 - t1) / tasks);
    if (wall_ns() - start > kShapeBudgetNs) break;
  }
  return {summarize(std::move(build_and_run)), summarize(std::move(run_only))};
}

// A chip Worker of `runtime` whose one callable submits `*current`'s tasks;
// `guarded`: every allocation checked for out-of-bounds writes after each task.
struct DispatchWorker {
  DispatchWorker(const std::string& runtime, bool guarded) : worker(Level::Chip, config_for(runtime, guarded)) {}
  static WorkerConfig config_for(const std::string& runtime, bool guarded) {
    WorkerConfig c;
    c.runtime = runtime;
    c.guard_device_memory = guarded;
    return c;
  }
  Status open(uint32_t tasks) {
    Result<CallableHandle> c =
        prepare_chip(worker, "bench_dispatch", [this](ChipOrchestrator& o, const TaskArgs&) -> Status {
          for (const TaskArgs& args : current->args) {
            if (Result<TaskRef> t = o.submit_aiv(kNoopFuncId, args); !t.ok()) return t.status();
          }
          return Status();
        });
    if (!c.ok()) return c.status();
    callable = *c;
    Result<DeviceBuffer> b = worker.malloc(tasks * kRowElems * sizeof(float));
    if (!b.ok()) return b.status();
    rows = b->view({tasks, kRowElems}, DType::F32);
    return Status();
  }
  Worker worker;
  CallableHandle callable;
  TensorView rows;
  const Dag* current = nullptr;
};

}  // namespace

Result<Json> dispatch() {
  SIMPLER_ASSIGN_OR_RETURN(const std::vector<uint32_t> sizes,
                           env_sizes("SIMPLER_BENCH_DISPATCH_TASKS", kTasksDefault, kMaxTasks));
  if (sizes.size() != 1) {
    return Status(StatusCode::kInvalidArgument, "SIMPLER_BENCH_DISPATCH_TASKS: one size, not a list");
  }
  const uint32_t tasks = sizes.front();
  DispatchWorker hbg("host_build_graph", false);
  DispatchWorker reference("reference", false);
  DispatchWorker guarded("host_build_graph", true);
  DispatchWorker tmr("tensormap_and_ringbuffer", false);
  DispatchWorker resident("resident", false);
  if (Status st = hbg.open(tasks); !st.ok()) return st;
  if (Status st = reference.open(tasks); !st.ok()) return st;
  if (Status st = guarded.open(tasks); !st.ok()) return st;
  if (Status st = tmr.open(tasks); !st.ok()) return st;
  if (Status st = resident.open(tasks); !st.ok()) return st;
  const TensorView& rows = hbg.rows;

  const double peer_goal_ratio = busy_neighbours() > 0 ? kPeerGoalRatioLoaded : kPeerGoalRatioQuiet;
  Json shapes;
  for (const ShapeSpec& spec : kShapes) {
    Result<Dag> dag = make_dag(spec.shape, rows, tasks);
    if (!dag.ok()) return dag.status();
    Result<Dag> ref_dag = make_dag(spec.shape, reference.rows, tasks);
    if (!ref_dag.ok()) return ref_dag.status();
    Result<Dag> guarded_dag = make_dag(spec.shape, guarded.rows, tasks);
    if (!guarded_dag.ok()) return guarded_dag.status();
    Result<Dag> tmr_dag = make_dag(spec.shape, tmr.rows, tasks);
    if (!tmr_dag.ok()) return tmr_dag.status();
    Result<Dag> resident_dag = make_dag(spec.shape, resident.rows, tasks);
    if (!resident_dag.ok()) return resident_dag.status();
    std::this_thread::sleep_for(kSettle);
    Result<SimplerFigures> mine = measure_simpler(hbg.worker, hbg.callable, hbg.current, *dag);
    if (!mine.ok()) return mine.status();
    Result<SimplerFigures> serial = measure_simpler(reference.worker, reference.callable, reference.current, *ref_dag);
    if (!serial.ok()) return serial.status();
    Result<SimplerFigures> checked = measure_simpler(guarded.worker, guarded.callable, guarded.current, *guarded_dag);
    if (!checked.ok()) return checked.status();
    Result<SimplerFigures> streamed = measure_simpler(tmr.worker, tmr.callable, tmr.current, *tmr_dag);
    if (!streamed.ok()) return streamed.status();
    Result<SimplerFigures> on_cores =
        measure_simpler(resident.worker, resident.callable, resident.current, *resident_dag);
    if (!on_cores.ok()) return on_cores.status();
    const auto [peer, peer_run_only] = measure_flow_graph(*dag);
    const double ratio = mine->ns_per_task.p50 / peer.p50;
    Json s;
    s["edges"] = dag->edges;
    s["reps"] = mine->ns_per_task.n;
    s["ns_per_task"] = round3(mine->ns_per_task.p50);
    s["ns_per_task_min"] = round3(mine->ns_per_task.min);
    s["build_ns_per_task"] = round3(mine->build_ns_per_task.p50);
    s["device_ns_per_task"] = round3(mine->device_ns_per_task.p50);
    s["reference_ns_per_task"] = round3(serial->ns_per_task.p50);
    s["reference_device_ns_per_task"] = round3(serial->device_ns_per_task.p50);
    s["guarded_ns_per_task"] = round3(checked->ns_per_task.p50);
    s["guarded_device_ns_per_task"] = round3(checked->device_ns_per_task.p50);
    const double tmr_vs_hbg = streamed->ns_per_task.p50 / mine->ns_per_task.p50;
    s["tmr_ns_per_task"] = round3(streamed->ns_per_task.p50);
    s["tmr_ns_per_task_min"] = round3(streamed->ns_per_task.min);
    s["tmr_device_ns_per_task"] = round3(streamed->device_ns_per_task.p50);
    s["tmr_ratio_vs_peer"] = round3(streamed->ns_per_task.p50 / peer.p50);
    s["tmr_ratio_vs_host_build_graph"] = round3(tmr_vs_hbg);
    s["tmr_goal_met"] = tmr_vs_hbg <= 1.0;
    s["resident_ns_per_task"] = round3(on_cores->ns_per_task.p50);
    s["resident_ns_per_task_min"] = round3(on_cores->ns_per_task.min);
    s["resident_device_ns_per_task"] = round3(on_cores->device_ns_per_task.p50);
    s["resident_ratio_vs_peer"] = round3(on_cores->ns_per_task.p50 / peer.p50);
    s["resident_ratio_vs_host_build_graph"] = round3(on_cores->ns_per_task.p50 / mine->ns_per_task.p50);
    s["peer_ns_per_task"] = round3(peer.p50);
    s["peer_run_only_ns_per_task"] = round3(peer_run_only.p50);
    s["ratio_vs_peer"] = round3(ratio);
    if (spec.goal_ns_per_task > 0) {
      s["goal_ns_per_task_max"] = spec.goal_ns_per_task;
      s["goal_met"] = mine->ns_per_task.p50 <= spec.goal_ns_per_task;
    }
    s["peer_goal_ratio_max"] = peer_goal_ratio;
    s["peer_goal_met"] = ratio <= peer_goal_ratio;
    shapes[spec.name] = s;
  }
  if (Status st = hbg.worker.close(); !st.ok()) return st;
  if (Status st = reference.worker.close(); !st.ok()) return st;
  if (Status st = guarded.worker.close(); !st.ok()) return st;
  if (Status st = tmr.worker.close(); !st.ok()) return st;
  if (Status st = resident.worker.close(); !st.ok()) return st;

  Json j;
  j["geometry"] = Geometry::small().name;
  j["tasks"] = tasks;
  j["layer_width"] = kLayerWidth;
  j["shapes"] = shapes;
  j["runtime"] =
      "host_build_graph; reference_*: the reference runtime (serial, no hand-off) on the same DAG; guarded_*: "
      "host_build_graph with guard_device_memory (every task's buffers checked for out-of-bounds writes); tmr_*: "
      "tensormap_and_ringbuffer, its orchestration on "
      "the device (its build is inside tmr_device_ns_per_task), goal tmr_ns_per_task <= ns_per_task; resident_*: the "
      "resident route, the same graph built on the host as "
      "host_build_graph's, scheduled by the cores themselves (no AICPU hand-off)";
  j["peer"] = "oneTBB flow graph of continue_nodes, same DAG: build + run (ratio basis) and run only";
  return j;
}

}  // namespace simpler::bench
