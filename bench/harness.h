// Shared machinery of the benchmarks: clocks, sample statistics, process CPU
// time, and setting up a chip Worker with the no-op kernel. Called by one
// benchmark at a time from the CLI's main thread; owns nothing long-lived.
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

// Registers `orchestrate` with the no-op kernel (AIV, kNoopFuncId) and an empty
// signature on a fresh `worker`, then inits it.
Result<CallableHandle> prepare_chip(Worker& worker, const std::string& name,
                                    OrchestrationFn orchestrate);

// Human-readable rendering of a benchmark's JSON: one "path  value" line per leaf.
std::string render_table(const Json& j);

}  // namespace simpler::bench
