// Shared machinery of the benchmarks: clocks, sample statistics, CPU time of
// the process and its reaped children, the no-op callable, and the windowed
// runs-in-flight rate. Called by one benchmark at a time from the CLI's main
// thread; owns nothing long-lived.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "simpler/simpler.h"

namespace simpler::bench {

// Ordered, so figures print in the order a benchmark adds them.
using Json = nlohmann::ordered_json;

// The no-op kernel's func_id in every benchmark callable.
inline constexpr uint32_t kNoopFuncId = 0;

uint64_t wall_ns();
// CPU time of every thread of this process (user + system).
uint64_t process_cpu_ns();
// CPU time of this process's children that have been reaped (user + system):
// the forked chip, sub worker and peer processes, once their benchmark closed them.
uint64_t reaped_children_cpu_ns();
// Threads of this process, from /proc/self/status; 0 if unreadable.
int process_threads();

struct Summary {
  size_t n = 0;
  double min = 0;
  double p50 = 0;
  double p99 = 0;
  double max = 0;
  double mean = 0;
};
Summary summarize(std::vector<double> samples);
Json summary_json(const Summary& s);

// Keeps JSON readable and diffs across commits small: 3 significant decimals
// are far below run-to-run noise.
double round3(double v);

// A callable named `name` running `orchestrate` over the no-op kernel (AIV,
// kNoopFuncId), with an empty signature.
Result<ChipCallable> noop_callable(const std::string& name, OrchestrationFn orchestrate);

// Registers noop_callable(name, orchestrate) on a fresh `worker`, then inits it.
Result<CallableHandle> prepare_chip(Worker& worker, const std::string& name, OrchestrationFn orchestrate);

// One chip run of a single no-op AIV task: the unit of the latency benchmarks.
Status one_noop_task(ChipOrchestrator& o, const TaskArgs& run_args);

// Sizes from the environment (quick runs and experiments shrink or pick
// them): `name` holds a comma-separated list of integers in 1..max, returned
// sorted and without repeats; unset or empty gives `fallback`. Anything else
// is an INVALID_ARGUMENT naming the variable and the item.
Result<std::vector<uint32_t>> env_sizes(const char* name, const char* fallback, uint32_t max = 16'000'000);
// A comma-separated list of names from the environment, or `fallback`.
std::vector<std::string> env_list(const char* name, const char* fallback);

// The busy neighbour processes beside the benchmark that is running (set by
// the registry around each measurement): a benchmark whose goal differs
// quiet and loaded reads it.
uint32_t busy_neighbours();
void set_busy_neighbours(uint32_t n);

inline double to_us(uint64_t ns) { return static_cast<double>(ns) / 1000.0; }

// Throughput with a fixed number of operations outstanding: start(k) begins one
// in slot k, finish(k) waits for it (a Status). Each window keeps `depth`
// slots busy for window_ns and returns completions per second; the figure is
// the median over `windows`, so one window lost to a neighbour's burst does
// not decide it.
template <typename Start, typename Finish>
Result<double> in_flight_rate(uint32_t depth, uint64_t window_ns, Start&& start, Finish&& finish) {
  std::vector<bool> live(depth, true);
  const uint64_t t0 = wall_ns();
  for (uint32_t k = 0; k < depth; ++k) start(k);
  uint64_t completed = 0;
  // Slots are refilled in order, so the ring drains in order once the window ends.
  for (uint32_t k = 0; live[k]; k = (k + 1) % depth) {
    if (Status s = finish(k); !s.ok()) return s;
    ++completed;
    live[k] = wall_ns() - t0 < window_ns;
    if (live[k]) start(k);
  }
  return static_cast<double>(completed) * 1e9 / static_cast<double>(wall_ns() - t0);
}

template <typename Start, typename Finish>
Result<double> median_rate(uint32_t depth, uint64_t window_ns, int windows, Start&& start, Finish&& finish) {
  std::vector<double> rates;
  for (int w = 0; w < windows; ++w) {
    Result<double> r = in_flight_rate(depth, window_ns, start, finish);
    if (!r.ok()) return r;
    rates.push_back(*r);
  }
  return summarize(std::move(rates)).p50;
}

// One-task runs per second on an L2 Worker of `config` with
// config.pipeline_depth runs in flight, after `warmup_runs` runs: the figure
// runs_in_flight reports and l3_pipelined compares against.
Result<double> chip_runs_per_s(const WorkerConfig& config, uint64_t window_ns, int windows, int warmup_runs);

// The node counterpart: runs per second of a Level::Node Worker of `config`
// whose every run sends one no-op chip task to each of its config.chips
// children, config.pipeline_depth runs in flight. The Worker forks at init, so
// the caller runs no other thread.
Result<double> node_runs_per_s(const WorkerConfig& config, uint64_t window_ns, int windows, int warmup_runs);

// Human-readable rendering of a benchmark's JSON: one "path  value" line per leaf.
std::string render_table(const Json& j);

}  // namespace simpler::bench
