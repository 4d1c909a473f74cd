// scaling: how cost grows with the work. ns per no-op task for graphs of 10k,
// 100k and 1M tasks of each dependency shape (independent, chain, layered), on
// host_build_graph (one run holding the whole graph) and
// tensormap_and_ringbuffer (one run streaming it through its default task
// window), per geometry; and runs/s of a node whose every run sends one task
// to each of its 1, 2 or 4 chip children. The peer of each size is the
// smallest size of the same cell: the goal is a flat cost per task.
// The node part forks, so it runs first, while this process has no thread of
// its own; every chip Worker is closed before the next is made.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/errors.h"
#include "benchmarks.h"

namespace simpler::bench {
namespace {

constexpr int64_t kRowElems = 16;  // one 64-byte row of F32 per task
constexpr uint32_t kLayerWidth = 64;
constexpr int kWarmupReps = 1;
constexpr int kMinReps = 3;
constexpr int kMaxReps = 9;
constexpr uint64_t kCellBudgetNs = 3'000'000'000;
constexpr double kFlatGoalRatio = 1.3;
constexpr uint32_t kNodeDepth = 8;
constexpr uint64_t kNodeWindowNs = 200'000'000;
constexpr int kNodeWindows = 5;
constexpr int kNodeWarmupRuns = 200;

enum class Shape { Independent, Chain, Layered };
struct ShapeName {
  Shape shape;
  const char* name;
};
constexpr ShapeName kShapes[] = {
    {Shape::Independent, "independent"}, {Shape::Chain, "chain"}, {Shape::Layered, "layered"}};

// The same splitmix64 step as dispatch's DAG, keyed by (task, draw) so that
// the layered graph is generated while it is submitted, with no table.
uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Task i owns row i (chain: all share row 0, each InOut, so each depends on
// the one before); a layered task reads 1-3 distinct rows of the previous
// layer of kLayerWidth tasks.
Status submit_graph(ChipOrchestrator& o, Shape shape, uint32_t tasks, const TensorView& rows) {
  for (uint32_t i = 0; i < tasks; ++i) {
    TaskArgs args;
    SIMPLER_ASSIGN_OR_RETURN(TensorView own, rows.tile({shape == Shape::Chain ? 0u : i, 0}, {1, kRowElems}));
    if (shape == Shape::Chain) {
      args.add_tensor(own, Tag::InOut);
    } else {
      args.add_tensor(own, Tag::OutputExisting);
    }
    if (shape == Shape::Layered && i >= kLayerWidth) {
      const uint32_t prev_layer = i / kLayerWidth * kLayerWidth - kLayerWidth;
      const uint32_t want = 1 + static_cast<uint32_t>(mix(i) % 3);
      uint32_t picked[3] = {};
      uint32_t n = 0;
      for (uint64_t draw = 1; n < want; ++draw) {
        const uint32_t p = prev_layer + static_cast<uint32_t>(mix((uint64_t{i} << 8) ^ draw) % kLayerWidth);
        if (std::find(picked, picked + n, p) != picked + n) continue;
        picked[n++] = p;
        SIMPLER_ASSIGN_OR_RETURN(TensorView input, rows.tile({p, 0}, {1, kRowElems}));
        args.add_tensor(input, Tag::Input);
      }
    }
    if (Result<TaskRef> t = o.submit_aiv(kNoopFuncId, args); !t.ok()) return t.status();
  }
  return Status();
}

struct Cell {
  Summary ns_per_task;
  Summary build_ns_per_task;
  Summary device_ns_per_task;
};

// One chip Worker of `runtime` on `geometry`, whose callable submits the
// graph that `shape` and `tasks` name.
class ScalingChip {
 public:
  ScalingChip(const Geometry& geometry, const std::string& runtime, uint32_t max_tasks)
      : max_tasks_(max_tasks), worker_(Level::Chip, config(geometry, runtime, max_tasks)) {}

  Status open() {
    Result<CallableHandle> c = prepare_chip(worker_, "bench_scaling", [this](ChipOrchestrator& o, const TaskArgs&) {
      return submit_graph(o, shape_, tasks_, rows_);
    });
    if (!c.ok()) return c.status();
    callable_ = *c;
    SIMPLER_ASSIGN_OR_RETURN(DeviceBuffer b, worker_.malloc(uint64_t{max_tasks_} * kRowElems * sizeof(float)));
    rows_ = b.view({max_tasks_, kRowElems}, DType::F32);
    return Status();
  }

  Result<Cell> measure(Shape shape, uint32_t tasks) {
    shape_ = shape;
    tasks_ = tasks;
    std::vector<double> total, build, device;
    const uint64_t start = wall_ns();
    for (int rep = 0; rep < kWarmupReps + kMaxReps; ++rep) {
      const uint64_t t0 = wall_ns();
      RunHandle run = worker_.submit(callable_, TaskArgs{});
      Status s = run.wait();
      const uint64_t t1 = wall_ns();
      if (!s.ok()) return s;
      const RunStats stats = run.stats();
      if (stats.tasks != tasks) {
        return Status(StatusCode::kInternal, fmt::format("run has {} tasks, expected {}", stats.tasks, tasks));
      }
      if (rep < kWarmupReps) continue;
      total.push_back(static_cast<double>(t1 - t0) / tasks);
      build.push_back(stats.build_us * 1000.0 / tasks);
      device.push_back(stats.device_us * 1000.0 / tasks);
      if (static_cast<int>(total.size()) >= kMinReps && wall_ns() - start > kCellBudgetNs) break;
    }
    return Cell{summarize(std::move(total)), summarize(std::move(build)), summarize(std::move(device))};
  }

  Status close() { return worker_.close(); }

 private:
  static WorkerConfig config(const Geometry& geometry, const std::string& runtime, uint32_t max_tasks) {
    WorkerConfig c;
    c.geometry = geometry;
    c.runtime = runtime;
    c.guard_device_memory = false;
    c.pipeline_depth = 1;
    // host_build_graph holds the whole graph in one run; the streaming
    // runtime keeps its default window and streams a larger graph through it.
    if (runtime == "host_build_graph") c.max_tasks_per_run = std::max(c.max_tasks_per_run, max_tasks);
    c.device_memory_bytes = std::max<uint64_t>(c.device_memory_bytes, uint64_t{max_tasks} * kRowElems * 8);
    c.run_timeout = std::chrono::minutes(2);
    return c;
  }

  uint32_t max_tasks_;
  Worker worker_;
  CallableHandle callable_;
  TensorView rows_;
  Shape shape_ = Shape::Independent;
  uint32_t tasks_ = 0;
};

Json cell_json(const Cell& c) {
  return Json{{"reps", c.ns_per_task.n},
              {"ns_per_task", round3(c.ns_per_task.p50)},
              {"ns_per_task_min", round3(c.ns_per_task.min)},
              {"build_ns_per_task", round3(c.build_ns_per_task.p50)},
              {"device_ns_per_task", round3(c.device_ns_per_task.p50)}};
}

// One runtime on one geometry: every shape at every size, and the ratio of
// the largest size's ns/task to the smallest's.
Json runtime_row(const Geometry& geometry, const std::string& runtime, const std::vector<uint32_t>& sizes,
                 bool& all_flat) {
  ScalingChip chip(geometry, runtime, sizes.back());
  // A chip that cannot open or close is this row's figure; the other rows
  // still run (a failure is never the whole benchmark's).
  if (Status s = chip.open(); !s.ok()) {
    all_flat = false;
    return Json{{"error", s.to_string()}};
  }
  Json row;
  for (const ShapeName& shape : kShapes) {
    Json per_size;
    double first = 0, last = 0;
    for (uint32_t tasks : sizes) {
      Result<Cell> c = chip.measure(shape.shape, tasks);
      if (!c.ok()) {
        // A size this runtime or geometry cannot take is a figure too; the
        // larger ones are not tried.
        per_size[std::to_string(tasks)] = {{"error", c.status().to_string()}};
        last = 0;
        break;
      }
      per_size[std::to_string(tasks)] = cell_json(*c);
      if (first == 0) first = c->ns_per_task.p50;
      last = c->ns_per_task.p50;
    }
    Json s{{"sizes", per_size}};
    if (sizes.size() > 1) {
      const bool complete = last > 0;
      const double ratio = complete ? last / first : 0;
      s["ratio_largest_over_smallest"] = round3(ratio);
      s["goal_met"] = complete && ratio <= kFlatGoalRatio;
      all_flat = all_flat && complete && ratio <= kFlatGoalRatio;
    }
    row[shape.name] = s;
  }
  if (Status s = chip.close(); !s.ok()) row["close_error"] = s.to_string();
  return row;
}

// Runs/s of a node whose every run sends one no-op task to each of `chips`
// chip children, kNodeDepth runs in flight.
Result<Json> node_row(uint32_t chips) {
  WorkerConfig c;
  c.geometry = Geometry::small();
  c.chips = chips;
  c.pipeline_depth = kNodeDepth;
  c.launch_depth = kNodeDepth;
  c.device_memory_bytes = 64ull << 20;
  c.max_tasks_per_run = 16;
  c.shared_heap_bytes = 16ull << 20;
  SIMPLER_ASSIGN_OR_RETURN(double rate, node_runs_per_s(c, kNodeWindowNs, kNodeWindows, kNodeWarmupRuns));
  return Json{{"runs_per_s", std::round(rate)}, {"chip_tasks_per_s", std::round(rate * chips)}};
}

}  // namespace

Result<Json> scaling() {
  SIMPLER_ASSIGN_OR_RETURN(std::vector<uint32_t> sizes,
                           env_sizes("SIMPLER_BENCH_SCALING_SIZES", "10000,100000,1000000"));
  // The larger geometries run up to this size: 108 spinning core threads on
  // 2 vCPUs make their 1M-task runs long.
  SIMPLER_ASSIGN_OR_RETURN(std::vector<uint32_t> wide_max, env_sizes("SIMPLER_BENCH_SCALING_WIDE_MAX", "100000"));
  SIMPLER_ASSIGN_OR_RETURN(std::vector<uint32_t> chip_counts, env_sizes("SIMPLER_BENCH_SCALING_CHIPS", "1,2,4"));
  const std::vector<std::string> geometries = env_list("SIMPLER_BENCH_SCALING_GEOMETRIES", "small,a2a3,a5");
  const std::vector<std::string> runtimes =
      env_list("SIMPLER_BENCH_SCALING_RUNTIMES", "host_build_graph,tensormap_and_ringbuffer");

  Json node;
  double runs_at_1 = 0;
  for (uint32_t chips : chip_counts) {
    Result<Json> row = node_row(chips);
    if (!row.ok()) {
      node[std::to_string(chips)] = {{"error", row.status().to_string()}};
      continue;
    }
    if (runs_at_1 == 0) runs_at_1 = (*row)["runs_per_s"].get<double>();
    (*row)["runs_per_s_vs_first"] = round3((*row)["runs_per_s"].get<double>() / runs_at_1);
    node[std::to_string(chips)] = *row;
  }

  Json per_geometry;
  bool all_flat = true;
  for (const std::string& name : geometries) {
    SIMPLER_ASSIGN_OR_RETURN(Geometry geometry, Geometry::by_name(name));
    std::vector<uint32_t> mine = sizes;
    if (name != Geometry::small().name) {
      mine.erase(std::remove_if(mine.begin(), mine.end(), [&](uint32_t s) { return s > wide_max.back(); }), mine.end());
      if (mine.empty()) mine.push_back(sizes.front());
    }
    Json g;
    for (const std::string& runtime : runtimes) g[runtime] = runtime_row(geometry, runtime, mine, all_flat);
    per_geometry[name] = g;
  }
  // An a5 chip within 4x of small on the same graph (the goal for
  // the dispatch shapes), at the smallest size both ran.
  Json wide;
  if (per_geometry.contains("small")) {
    const std::string at = std::to_string(sizes.front());
    for (const std::string& name : geometries) {
      if (name == "small") continue;
      for (const std::string& runtime : runtimes) {
        for (const ShapeName& shape : kShapes) {
          const Json& mine = per_geometry[name][runtime][shape.name]["sizes"][at];
          const Json& base = per_geometry["small"][runtime][shape.name]["sizes"][at];
          if (!mine.contains("ns_per_task") || !base.contains("ns_per_task")) continue;
          wide[name][runtime][shape.name] =
              round3(mine["ns_per_task"].get<double>() / base["ns_per_task"].get<double>());
        }
      }
    }
  }

  Json j;
  j["sizes"] = sizes;
  j["wide_geometry_max_size"] = wide_max.back();
  j["layer_width"] = kLayerWidth;
  j["geometries"] = per_geometry;
  j["vs_small_at_smallest_size"] = wide;
  j["node"] = {{"depth", kNodeDepth}, {"geometry", Geometry::small().name}, {"chips", node}};
  j["goal"] = {{"ratio_largest_over_smallest_max", kFlatGoalRatio}, {"met", all_flat}};
  j["runtime"] =
      "host_build_graph: one run holds the whole graph (max_tasks_per_run = the largest size); "
      "tensormap_and_ringbuffer: one run streams the graph through its default task window; pipeline_depth 1";
  j["peer"] = "the same cell at the smallest size: ratio_largest_over_smallest = ns/task at the largest ÷ smallest";
  return j;
}

}  // namespace simpler::bench
