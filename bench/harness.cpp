#include "harness.h"

#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <numeric>

#include <fmt/format.h>

namespace simpler::bench {
namespace {

extern "C" void simpler_bench_noop_kernel(int64_t* /*args*/) {}

void flatten(const Json& j, const std::string& prefix, std::vector<std::pair<std::string, std::string>>& rows) {
  if (j.is_object()) {
    for (const auto& [key, value] : j.items()) flatten(value, prefix.empty() ? key : prefix + "." + key, rows);
  } else if (j.is_string()) {
    rows.emplace_back(prefix, j.get<std::string>());
  } else {
    rows.emplace_back(prefix, j.dump());
  }
}

uint32_t g_busy_neighbours = 0;  // CLI main thread only, like every benchmark

}  // namespace

uint32_t busy_neighbours() { return g_busy_neighbours; }
void set_busy_neighbours(uint32_t n) { g_busy_neighbours = n; }

uint64_t wall_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

uint64_t process_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t reaped_children_cpu_ns() {
  rusage u{};
  getrusage(RUSAGE_CHILDREN, &u);
  const auto ns = [](const timeval& t) {
    return static_cast<uint64_t>(t.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(t.tv_usec) * 1000ull;
  };
  return ns(u.ru_utime) + ns(u.ru_stime);
}

int process_threads() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return 0;
}

Summary summarize(std::vector<double> samples) {
  Summary s;
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  // Nearest-rank percentiles: every reported figure is a measured sample.
  const auto rank = [&](double p) {
    const size_t r = static_cast<size_t>(std::ceil(p * static_cast<double>(samples.size())));
    return samples[std::clamp<size_t>(r, 1, samples.size()) - 1];
  };
  s.n = samples.size();
  s.min = samples.front();
  s.p50 = rank(0.50);
  s.p99 = rank(0.99);
  s.max = samples.back();
  s.mean = std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(samples.size());
  return s;
}

Json summary_json(const Summary& s) {
  return Json{{"n", s.n},
              {"min", round3(s.min)},
              {"p50", round3(s.p50)},
              {"p99", round3(s.p99)},
              {"max", round3(s.max)},
              {"mean", round3(s.mean)}};
}

double round3(double v) { return std::round(v * 1000.0) / 1000.0; }

Result<ChipCallable> noop_callable(const std::string& name, OrchestrationFn orchestrate) {
  KernelLibrary kernels;
  if (Status s =
          kernels.add_function(kNoopFuncId, CoreType::AIV, "simpler_bench_noop_kernel", &simpler_bench_noop_kernel);
      !s.ok()) {
    return s;
  }
  return ChipCallable(name, std::move(orchestrate), std::move(kernels), {});
}

Status one_noop_task(ChipOrchestrator& o, const TaskArgs& /*run_args*/) {
  return o.submit_aiv(kNoopFuncId, TaskArgs{}).status();
}

Result<CallableHandle> prepare_chip(Worker& worker, const std::string& name, OrchestrationFn orchestrate) {
  Result<ChipCallable> callable = noop_callable(name, std::move(orchestrate));
  if (!callable.ok()) return callable.status();
  Result<CallableHandle> handle = worker.register_callable(std::move(callable).value());
  if (!handle.ok()) return handle;
  if (Status s = worker.init(); !s.ok()) return s;
  return handle;
}

std::string render_table(const Json& j) {
  std::vector<std::pair<std::string, std::string>> rows;
  flatten(j, "", rows);
  size_t width = 0;
  for (const auto& row : rows) width = std::max(width, row.first.size());
  std::string out;
  for (const auto& [key, value] : rows) out += fmt::format("{:<{}}  {}\n", key, width, value);
  return out;
}

Result<double> chip_runs_per_s(const WorkerConfig& config, uint64_t window_ns, int windows, int warmup_runs) {
  const uint32_t depth = config.pipeline_depth;
  Worker worker(Level::Chip, config);
  Result<CallableHandle> callable = prepare_chip(worker, "bench_one_task", one_noop_task);
  if (!callable.ok()) return callable.status();
  const TaskArgs no_args;
  for (int i = 0; i < warmup_runs; ++i) {
    if (Status s = worker.run(*callable, no_args); !s.ok()) return s;
  }
  std::vector<RunHandle> ring(depth);
  Result<double> rate = median_rate(
      depth, window_ns, windows, [&](uint32_t k) { ring[k] = worker.submit(*callable, no_args); },
      [&](uint32_t k) { return ring[k].wait(); });
  if (Status s = worker.close(); !s.ok()) return s;
  return rate;
}

Result<double> node_runs_per_s(const WorkerConfig& config, uint64_t window_ns, int windows, int warmup_runs) {
  const uint32_t depth = config.pipeline_depth;
  const uint32_t chips = config.chips;
  Worker worker(Level::Node, config);
  Result<ChipCallable> callable = noop_callable("bench_node_fan_out", one_noop_task);
  if (!callable.ok()) return callable.status();
  Result<CallableHandle> handle = worker.register_callable(std::move(callable).value());
  if (!handle.ok()) return handle.status();
  if (Status s = worker.init(); !s.ok()) return s;
  const CallableHandle chip = *handle;
  const TaskArgs no_args;
  const std::function<Status(Orchestrator&)> fan_out = [&](Orchestrator& o) -> Status {
    for (uint32_t k = 0; k < chips; ++k) {
      if (Result<uint32_t> t = o.submit_next_level(chip, no_args, k); !t.ok()) return t.status();
    }
    return Status();
  };
  for (int i = 0; i < warmup_runs; ++i) {
    if (Status s = worker.submit(fan_out).wait(); !s.ok()) return s;
  }
  std::vector<RunHandle> ring(depth);
  Result<double> rate = median_rate(
      depth, window_ns, windows, [&](uint32_t k) { ring[k] = worker.submit(fan_out); },
      [&](uint32_t k) { return ring[k].wait(); });
  if (Status s = worker.close(); !s.ok()) return s;
  return rate;
}

std::vector<std::string> env_list(const char* name, const char* fallback) {
  const char* s = std::getenv(name);
  std::stringstream in(s != nullptr && *s != '\0' ? s : fallback);
  std::vector<std::string> out;
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

Result<std::vector<uint32_t>> env_sizes(const char* name, const char* fallback, uint32_t max) {
  std::vector<uint32_t> out;
  for (const std::string& item : env_list(name, fallback)) {
    char* end = nullptr;
    const unsigned long v = std::strtoul(item.c_str(), &end, 10);
    if (end == item.c_str() || *end != '\0' || v == 0 || v > max) {
      return Status(StatusCode::kInvalidArgument, fmt::format("{}: '{}' is not a size in 1..{}", name, item, max));
    }
    out.push_back(static_cast<uint32_t>(v));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  if (out.empty()) return Status(StatusCode::kInvalidArgument, fmt::format("{} names no size", name));
  return out;
}

}  // namespace simpler::bench
