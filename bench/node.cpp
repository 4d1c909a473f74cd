// l3_sub_latency and l3_pipelined: one-task runs through the node level (L3),
// i.e. through the Scheduler, a mailbox and a forked child. Each Level::Node
// Worker is created while this process runs no other thread (every earlier
// Worker is closed), since init forks its children.
#include <sys/resource.h>

#include <array>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "benchmarks.h"
#include "peers.h"

namespace simpler::bench {
namespace {

constexpr int kWarmupRuns = 200;
constexpr int kLatencyRuns = 3000;
constexpr int kFloorRoundTrips = 20000;
constexpr double kSubGoalP50Us = 10.0;
constexpr double kPipelinedGoalRunsPerS = 50'000;
constexpr std::array<uint32_t, 7> kDepths = {1, 2, 4, 8, 16, 32, 64};
constexpr uint64_t kWindowNs = 200'000'000;
constexpr int kWindows = 5;

// The same chip for the node's child and for the L2 peer, so that the ratio
// is the cost of the node level alone.
WorkerConfig bench_config(uint32_t chips, uint32_t subs, uint32_t depth) {
  WorkerConfig c;
  c.chips = chips;
  c.sub_workers = subs;
  c.pipeline_depth = depth;
  c.launch_depth = depth;
  // A chip Worker (the L2 peer) refuses a shared heap size of its own.
  if (chips != 0 || subs != 0) c.shared_heap_bytes = 16ull << 20;
  // A node without a chip refuses a chip's fields.
  if (chips == 0 && subs != 0) return c;
  c.geometry = Geometry::small();
  c.device_memory_bytes = 64ull << 20;
  c.max_tasks_per_run = 16;
  return c;
}

Status noop_sub(const TaskArgsView& /*args*/) { return Status(); }

// Context switches of every thread of this process (not of its children).
uint64_t context_switches() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_nvcsw + u.ru_nivcsw);
}

}  // namespace

Result<Json> l3_sub_latency() {
  std::vector<double> latency_us, build_us, child_us;
  uint64_t switches = 0;
  {
    Worker worker(Level::Node, bench_config(0, 1, 2));
    Result<FunctionHandle> fn = worker.register_function(noop_sub);
    if (!fn.ok()) return fn.status();
    if (Status s = worker.init(); !s.ok()) return s;
    const FunctionHandle sub = *fn;
    const TaskArgs no_args;
    const std::function<Status(Orchestrator&)> one_sub_task = [&](Orchestrator& o) {
      return o.submit_sub(sub, no_args).status();
    };
    for (int i = 0; i < kWarmupRuns + kLatencyRuns; ++i) {
      if (i == kWarmupRuns) switches = context_switches();
      const uint64_t t0 = wall_ns();
      RunHandle run = worker.submit(one_sub_task);
      Status s = run.wait();
      const uint64_t t1 = wall_ns();
      if (!s.ok()) return s;
      if (i < kWarmupRuns) continue;
      latency_us.push_back(to_us(t1 - t0));
      build_us.push_back(run.stats().build_us);
      child_us.push_back(run.stats().device_us);
    }
    switches = context_switches() - switches;
    if (Status s = worker.close(); !s.ok()) return s;
  }
  Result<Summary> peer = pipe_round_trip_us(kWarmupRuns, kLatencyRuns);
  if (!peer.ok()) return peer.status();
  Result<Summary> floor = forked_spin_round_trip_us(kFloorRoundTrips);
  if (!floor.ok()) return floor.status();
  const Summary mine = summarize(std::move(latency_us));

  Json j;
  j["unit"] = "us";
  j["simpler"] = summary_json(mine);
  j["simpler"]["what"] = "Level::Node, 1 sub worker: submit(one submit_sub of a no-op function) -> wait";
  // build: the orchestration on this thread; publish_to_terminal: the Scheduler's
  // publication to the terminal it saw (mailbox, child serve loop, the sub
  // worker's thread); the rest is this thread -> Scheduler -> this thread.
  j["simpler_split_p50"] = {{"build_us", round3(summarize(std::move(build_us)).p50)},
                            {"publish_to_terminal_us", round3(summarize(std::move(child_us)).p50)}};
  j["parent_context_switches_per_run"] = round3(static_cast<double>(switches) / static_cast<double>(kLatencyRuns));
  j["peer"] = summary_json(*peer);
  j["peer"]["what"] = "pipe ping-pong with a forked child: write one byte, block until its answer";
  j["ratio_vs_peer"] = {{"p50", round3(mine.p50 / peer->p50)}, {"p99", round3(mine.p99 / peer->p99)}};
  j["floor_forked_spin_round_trip"] = {{"p50", round3(floor->p50)}, {"p99", round3(floor->p99)}};
  j["upstream_p50_us"] = "147-227 on these machines";
  j["goal"] = {{"p50_us_max", kSubGoalP50Us}, {"met", mine.p50 <= kSubGoalP50Us}};
  return j;
}

Result<Json> l3_pipelined() {
  Json per_depth;
  double best = 0, node_at_1 = 0;
  uint32_t best_depth = 0;
  for (uint32_t depth : kDepths) {
    Result<double> node = node_runs_per_s(bench_config(1, 0, depth), kWindowNs, kWindows, kWarmupRuns);
    if (!node.ok()) return node.status();
    Result<double> chip = chip_runs_per_s(bench_config(0, 0, depth), kWindowNs, kWindows, kWarmupRuns);
    if (!chip.ok()) return chip.status();
    if (depth == 1) node_at_1 = *node;
    if (*node > best) {
      best = *node;
      best_depth = depth;
    }
    per_depth[std::to_string(depth)] = {{"runs_per_s", std::round(*node)},
                                        {"peer_runs_per_s", std::round(*chip)},
                                        {"ratio_vs_peer", round3(*node / *chip)},
                                        {"scaling_vs_1", round3(*node / node_at_1)}};
  }
  Json j;
  j["geometry"] = Geometry::small().name;
  j["window_s"] = static_cast<double>(kWindowNs) / 1e9;
  j["windows"] = kWindows;
  j["in_flight"] = per_depth;
  j["peer"] = "the L2 Worker (Level::Chip) in this process, same chip config, same depth: no mailbox, no process hop";
  j["best"] = {{"depth", best_depth}, {"runs_per_s", std::round(best)}};
  j["upstream_runs_per_s"] = "4k-7k";
  j["goal"] = {{"runs_per_s_min", kPipelinedGoalRunsPerS}, {"met", best >= kPipelinedGoalRunsPerS}};
  return j;
}

}  // namespace simpler::bench
