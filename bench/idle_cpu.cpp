// idle_cpu: CPU burned by an idle a2a3-geometry chip, against the same process
// idling with no Worker.
#include <algorithm>
#include <chrono>
#include <thread>

#include "benchmarks.h"

namespace simpler::bench {
namespace {

constexpr std::chrono::milliseconds kWindow{1000};
// Lets thread start-up finish so that only the steady idle state is measured.
constexpr std::chrono::milliseconds kSettle{100};
constexpr int kRunsBeforeIdle = 100;
constexpr double kGoalPct = 5.0;

// Percent of one CPU used by this process while the calling thread sleeps.
double idle_pct() {
  const uint64_t c0 = process_cpu_ns();
  const uint64_t w0 = wall_ns();
  std::this_thread::sleep_for(kWindow);
  const uint64_t c1 = process_cpu_ns();
  const uint64_t w1 = wall_ns();
  return 100.0 * static_cast<double>(c1 - c0) / static_cast<double>(w1 - w0);
}

}  // namespace

Result<Json> idle_cpu() {
  const int threads_before = process_threads();
  const double baseline = idle_pct();

  WorkerConfig config;
  config.geometry = Geometry::a2a3();
  Worker worker(Level::Chip, config);
  const uint64_t init_cpu0 = process_cpu_ns();
  const uint64_t init_wall0 = wall_ns();
  Result<CallableHandle> callable = prepare_chip(worker, "bench_idle", one_noop_task);
  if (!callable.ok()) return callable.status();
  const uint64_t init_cpu_ns = process_cpu_ns() - init_cpu0;
  const uint64_t init_wall_ns = wall_ns() - init_wall0;
  std::this_thread::sleep_for(kSettle);
  const int threads_with_chip = process_threads();
  const double after_init = idle_pct();

  // Idle right after work, spin windows included: what a chip between runs costs.
  for (int i = 0; i < kRunsBeforeIdle; ++i) {
    if (Status s = worker.run(*callable, TaskArgs{}); !s.ok()) return s;
  }
  const double after_runs = idle_pct();
  if (Status s = worker.close(); !s.ok()) return s;

  const double worst = std::max(after_init, after_runs);
  Json j;
  j["geometry"] = config.geometry.name;
  j["window_s"] = std::chrono::duration<double>(kWindow).count();
  j["threads"] = {{"without_chip", threads_before}, {"with_chip", threads_with_chip}};
  j["init_ms"] = {{"wall", round3(static_cast<double>(init_wall_ns) / 1e6)},
                  {"cpu", round3(static_cast<double>(init_cpu_ns) / 1e6)}};
  j["cpu_pct"] = {{"idle_after_init", round3(after_init)}, {"idle_after_runs", round3(after_runs)}};
  j["peer_cpu_pct"] = round3(baseline);
  j["peer"] = "this process idling with no Worker";
  // A ratio to a near-zero baseline is meaningless; the excess is the figure.
  j["excess_pct_vs_peer"] = round3(worst - baseline);
  j["goal"] = {{"cpu_pct_max", kGoalPct}, {"met", worst < kGoalPct}};
  return j;
}

}  // namespace simpler::bench
