// swimlane: the cost of diagnostics on the matmul_chain example (its 32 runs
// of 384 AIC/AIV tasks, pipeline depth 4): swimlane levels 1 and 4 and a FULL
// argument dump against diagnostics off, in one process; and the capture
// cost on the resident route (Mechanism R), FULL against its own dumps-off
// run and against host_build_graph's FULL dump. The configurations
// alternate round by round so a neighbour's burst lands on all of them, and
// the figure is each one's median. "off" runs twice per round, its second
// copy the A/A noise floor that "off is indistinguishable" is judged against.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <time.h>
#include <unistd.h>

#include "base/errors.h"
#include "benchmarks.h"
#include "examples.h"

namespace simpler::bench {
namespace {

constexpr int kRounds = 11;
constexpr double kGoalLevel1 = 1.05;

double process_cpu_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

Result<Json> swimlane() {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("simpler_bench_swimlane_" + std::to_string(::getpid()))).string();
  struct Config {
    const char* name;
    uint32_t level;
    DumpArgs dump;
    const char* runtime;  // null: the default (host_build_graph)
    std::vector<double> wall_s;
    std::vector<double> cpu_s;  // the whole process's CPU time over the example (its device threads included)
  };
  std::vector<Config> configs = {{"off", 0, DumpArgs::Off, nullptr, {}, {}},
                                 {"off_again", 0, DumpArgs::Off, nullptr, {}, {}},
                                 {"level1", 1, DumpArgs::Off, nullptr, {}, {}},
                                 {"level4", 4, DumpArgs::Off, nullptr, {}, {}},
                                 {"dump_full", 0, DumpArgs::Full, nullptr, {}, {}},
                                 {"resident_off", 0, DumpArgs::Off, "resident", {}, {}},
                                 {"resident_dump_full", 0, DumpArgs::Full, "resident", {}, {}}};
  uint64_t tasks = 0;
  for (int round = 0; round < kRounds; ++round) {
    for (Config& c : configs) {
      examples::ExampleOptions options;
      options.call.swimlane_level = c.level;
      options.call.dump_args = c.dump;
      if (c.runtime != nullptr) options.runtime = c.runtime;
      if (c.level > 0 || c.dump != DumpArgs::Off) options.call.trace_dir = dir;
      const double cpu0 = process_cpu_s();
      Result<examples::ExampleReport> r = examples::run_example("matmul_chain", options);
      c.cpu_s.push_back(process_cpu_s() - cpu0);
      if (!r.ok()) return r.status();
      if (!r->verified) return internal_error("matmul_chain ({}) did not verify: {}", c.name, r->detail);
      c.wall_s.push_back(r->wall_s);
      tasks = r->tasks;
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  const double off = median(configs[0].wall_s);
  Json j;
  j["workload"] = "matmul_chain example, default options (small geometry, host_build_graph, pipeline depth 4)";
  j["tasks_per_measurement"] = tasks;
  j["rounds"] = kRounds;
  Json medians;
  Json spread;
  for (const Config& c : configs) {
    medians[c.name] = round3(median(c.wall_s) * 1e3);
    const auto [lo, hi] = std::minmax_element(c.wall_s.begin(), c.wall_s.end());
    spread[c.name] = {round3(*lo * 1e3), round3(*hi * 1e3)};
  }
  j["median_wall_ms"] = medians;
  j["min_max_wall_ms"] = spread;
  // CPU time is what a neighbour's load distorts least on a shared machine
  // (it includes the example's Worker start and close, wall time does not).
  Json cpu;
  for (const Config& c : configs) cpu[c.name] = round3(median(c.cpu_s) / median(configs[0].cpu_s));
  j["cpu_ratio_vs_off"] = cpu;
  j["peer"] = "the same example with diagnostics off, in the same process, alternating";
  const double r1 = median(configs[2].wall_s) / off;
  j["ratio_vs_off"] = {{"off_again", round3(median(configs[1].wall_s) / off)},
                       {"level1", round3(r1)},
                       {"level4", round3(median(configs[3].wall_s) / off)},
                       {"dump_full", round3(median(configs[4].wall_s) / off)}};
  j["goal"] = {{"level1_ratio_max", kGoalLevel1}, {"met", r1 <= kGoalLevel1}};
  // Mechanism R's capture cost: the resident route's FULL dump against the
  // same route with dumps off, and against host_build_graph's FULL dump.
  const double res_off = median(configs[5].wall_s);
  const double res_full = median(configs[6].wall_s);
  j["resident_capture"] = {{"full_vs_resident_off", round3(res_full / res_off)},
                           {"full_vs_host_build_graph_full", round3(res_full / median(configs[4].wall_s))},
                           {"resident_off_vs_host_build_graph_off", round3(res_off / off)}};
  return j;
}

}  // namespace simpler::bench
