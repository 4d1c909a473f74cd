// l2_latency and runs_in_flight: one-task runs on the small geometry, against a
// condition-variable thread pool doing the same hand-off.
#include <algorithm>
#include <array>
#include <cmath>
#include <thread>

#include <fmt/format.h>

#include "base/errors.h"
#include "benchmarks.h"
#include "peers.h"

namespace simpler::bench {
namespace {

constexpr int kWarmupRuns = 200;
constexpr int kLatencyRuns = 2000;
constexpr int kSpinRoundTrips = 20000;
constexpr double kLatencyGoalP50Us = 50.0;
// The depths measured; SIMPLER_BENCH_IN_FLIGHT picks others (an experiment
// on one depth need not run all five).
constexpr const char* kInFlight = "1,2,4,8,16";
constexpr uint64_t kThroughputWindowNs = 200'000'000;
constexpr int kThroughputWindows = 5;

unsigned pool_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

double pool_runs_per_s(uint32_t depth) {
  CondvarPool pool(pool_threads());
  std::vector<CondvarPool::Job> jobs(depth);
  return *median_rate(
      depth, kThroughputWindowNs, kThroughputWindows, [&](uint32_t k) { pool.post(jobs[k]); },
      [&](uint32_t k) {
        CondvarPool::wait(jobs[k]);
        return Status();
      });
}

}  // namespace

Result<Json> l2_latency() {
  Worker worker(Level::Chip, WorkerConfig{});
  Result<CallableHandle> callable = prepare_chip(worker, "bench_one_task", one_noop_task);
  if (!callable.ok()) return callable.status();
  const TaskArgs no_args;
  std::vector<double> latency_us, build_us, device_us;
  for (int i = 0; i < kWarmupRuns + kLatencyRuns; ++i) {
    const uint64_t t0 = wall_ns();
    RunHandle run = worker.submit(*callable, no_args);
    Status s = run.wait();
    const uint64_t t1 = wall_ns();
    if (!s.ok()) return s;
    if (i < kWarmupRuns) continue;
    latency_us.push_back(to_us(t1 - t0));
    const RunStats stats = run.stats();
    build_us.push_back(stats.build_us);
    device_us.push_back(stats.device_us);
  }
  if (Status s = worker.close(); !s.ok()) return s;

  std::vector<double> peer_us;
  {
    CondvarPool pool(pool_threads());
    CondvarPool::Job job;
    for (int i = 0; i < kWarmupRuns + kLatencyRuns; ++i) {
      const uint64_t t0 = wall_ns();
      pool.post(job);
      CondvarPool::wait(job);
      if (i >= kWarmupRuns) peer_us.push_back(to_us(wall_ns() - t0));
    }
  }
  const Summary mine = summarize(std::move(latency_us));
  const Summary peer = summarize(std::move(peer_us));
  const Summary floor = spin_round_trip_us(kSpinRoundTrips);

  Json j;
  j["geometry"] = Geometry::small().name;
  j["unit"] = "us";
  j["simpler"] = summary_json(mine);
  j["simpler_split_p50"] = {{"build_us", round3(summarize(std::move(build_us)).p50)},
                            {"device_us", round3(summarize(std::move(device_us)).p50)}};
  j["peer"] = summary_json(peer);
  j["peer"]["what"] = fmt::format("condvar thread pool ({} threads): post + wait one no-op job", pool_threads());
  j["ratio_vs_peer"] = {{"p50", round3(mine.p50 / peer.p50)}, {"p99", round3(mine.p99 / peer.p99)}};
  j["floor_spin_round_trip"] = {{"p50", round3(floor.p50)}, {"p99", round3(floor.p99)}};
  j["goal"] = {{"p50_us_max", kLatencyGoalP50Us}, {"met", mine.p50 <= kLatencyGoalP50Us}};
  return j;
}

Result<Json> runs_in_flight() {
  SIMPLER_ASSIGN_OR_RETURN(const std::vector<uint32_t> depths, env_sizes("SIMPLER_BENCH_IN_FLIGHT", kInFlight, 64));
  Json per_depth;
  double runs_per_s_at_1 = 0;
  for (uint32_t depth : depths) {
    WorkerConfig config;
    config.pipeline_depth = depth;
    config.launch_depth = depth;
    Result<double> mine = chip_runs_per_s(config, kThroughputWindowNs, kThroughputWindows, kWarmupRuns);
    if (!mine.ok()) return mine.status();
    const double peer = pool_runs_per_s(depth);
    if (runs_per_s_at_1 == 0) runs_per_s_at_1 = *mine;
    per_depth[std::to_string(depth)] = {{"runs_per_s", std::round(*mine)},
                                        {"peer_runs_per_s", std::round(peer)},
                                        {"ratio_vs_peer", round3(*mine / peer)},
                                        {"scaling_vs_1", round3(*mine / runs_per_s_at_1)}};
  }
  Json j;
  // pipeline_depth = launch_depth = in-flight count; upstream never published
  // what a second set buys, so it is reported on its own.
  if (per_depth.contains("1") && per_depth.contains("2")) {
    j["gain_depth2_over_depth1"] = per_depth["2"]["scaling_vs_1"];
  }
  j["geometry"] = Geometry::small().name;
  j["window_s"] = static_cast<double>(kThroughputWindowNs) / 1e9;
  j["windows"] = kThroughputWindows;
  j["in_flight"] = per_depth;
  j["peer"] = fmt::format("condvar thread pool ({} threads), same number of no-op jobs outstanding", pool_threads());
  return j;
}

}  // namespace simpler::bench
