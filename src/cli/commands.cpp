#include "commands.h"

#include <filesystem>
#include <iostream>

#include <fmt/core.h>
#include <simpler/simpler.h>

#include "base/load_sense.h"
#include "progress.h"

#ifdef SIMPLER_HAVE_EXAMPLES
#include "examples.h"
#endif
#ifdef SIMPLER_HAVE_BENCH
#include "bench.h"
#endif

namespace simpler::cli {
namespace {

std::string describe(const Geometry& g) {
  return fmt::format("{} ({} clusters: {} AIC + {} AIV, {} AICPU threads)", g.name, g.clusters, g.aic_cores(),
                     g.aiv_cores(), g.aicpu_threads);
}

// OpenMPI binds each rank to one core when -np is at most 2, and every
// process a rank's workers fork inherits the mask: a node's children and its
// simulated cores then take turns on one CPU, and each hand-off between them
// is a context switch (docs/remote_nodes.md, "CPU binding"). Said on stderr,
// once per rank, by the commands that run workers.
void warn_if_rank_has_one_cpu() {
  if (mpi_size() < 2 || usable_cpus() > 1) return;
  fmt::print(stderr,
             "simpler: MPI rank {} of {} may run on 1 CPU only (its affinity mask; mpirun binds each rank to one "
             "core when -np is at most 2): every process and simulated core of its workers shares it. "
             "`mpirun --bind-to none` or `--map-by slot:PE=N` gives a rank more.\n",
             mpi_rank(), mpi_size());
}

std::string human_rate(double per_s) {
  if (per_s >= 1e6) return fmt::format("{:.2f}M/s", per_s / 1e6);
  if (per_s >= 1e3) return fmt::format("{:.1f}k/s", per_s / 1e3);
  return fmt::format("{:.0f}/s", per_s);
}

std::string human_time(double s) {
  if (s >= 1) return fmt::format("{:.2f} s", s);
  return fmt::format("{:.1f} ms", s * 1e3);
}

#ifdef SIMPLER_HAVE_EXAMPLES

struct Row {
  std::string name;
  std::string runtime;
  bool applies;  // the example runs on this runtime (examples::applies_to)
  Result<examples::ExampleReport> report;
};

enum class Verdict { kOk, kNotApplicable, kMismatch, kError };

// A row whose example does not apply to its runtime is n/a only when the
// example refused it as such; anything else there is an error.
Verdict verdict(const Row& row) {
  if (!row.report.ok()) {
    const bool refused = !row.applies && row.report.status().code() == StatusCode::kFailedPrecondition;
    return refused ? Verdict::kNotApplicable : Verdict::kError;
  }
  if (!row.applies) return Verdict::kError;
  return row.report->verified ? Verdict::kOk : Verdict::kMismatch;
}

void print_table(const std::vector<Row>& rows) {
  constexpr const char* kFormat = "{:<16} {:<24} {:>5} {:>8} {:>10} {:>10}  {}\n";
  fmt::print(kFormat, "example", "runtime", "runs", "tasks", "wall", "tasks/s", "verdict");
  for (const Row& row : rows) {
    const Verdict v = verdict(row);
    if (!row.report.ok()) {
      fmt::print(kFormat, row.name, row.runtime, "-", "-", "-", "-", v == Verdict::kNotApplicable ? "n/a" : "ERROR");
      continue;
    }
    const examples::ExampleReport& r = *row.report;
    const double rate = r.wall_s > 0 ? static_cast<double>(r.tasks) / r.wall_s : 0;
    fmt::print(kFormat, r.name, row.runtime, r.runs, r.tasks, human_time(r.wall_s), human_rate(rate),
               v == Verdict::kOk         ? "ok"
               : v == Verdict::kMismatch ? "MISMATCH"
                                         : "ERROR (ran where it does not apply)");
  }
  fmt::print("\n");
  // One line per example and text, naming every runtime it holds for.
  std::string label, text;
  auto flush = [&] {
    if (!label.empty()) fmt::print("{}]: {}\n", label, text);
  };
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    std::string t;
    switch (verdict(row)) {
      case Verdict::kNotApplicable:
        t = fmt::format("n/a: {}", row.report.status().message());
        break;
      case Verdict::kError:
        t = fmt::format("error: {}",
                        row.report.ok() ? "it ran on a runtime it does not apply to" : row.report.status().to_string());
        break;
      case Verdict::kOk:
      case Verdict::kMismatch:
        t = row.report->detail;
        break;
    }
    if (i > 0 && rows[i - 1].name == row.name && t == text) {
      label += fmt::format(", {}", row.runtime);
      continue;
    }
    flush();
    label = fmt::format("{} [{}", row.name, row.runtime);
    text = std::move(t);
  }
  flush();
}

Row run_one(const examples::ExampleInfo& example, examples::ExampleOptions options, ProgressLine& progress) {
  options.progress = [&progress, runtime = options.runtime](const examples::ExampleProgress& p) {
    progress.update(fmt::format("{} [{}]: {}/{} runs, {} tasks", p.name, runtime, p.runs_done, p.runs_total, p.tasks));
  };
  Row row{example.name, options.runtime, examples::applies_to(example, options.runtime),
          examples::run_example(example.name, options)};
  progress.clear();
  return row;
}

#else

int no_examples() {
  fmt::print(stderr, "simpler was built without examples (SIMPLER_BUILD_EXAMPLES=OFF)\n");
  return kExitFailure;
}

#endif  // SIMPLER_HAVE_EXAMPLES

}  // namespace

std::vector<std::string> geometry_names() {
  std::vector<std::string> names;
  for (const Geometry& g : Geometry::presets()) names.push_back(g.name);
  return names;
}

std::vector<std::string> runtime_names() {
  std::vector<std::string> names;
  for (const ComponentInfo& r : available_runtimes()) names.push_back(r.name);
  return names;
}

std::vector<std::string> example_names() {
#ifdef SIMPLER_HAVE_EXAMPLES
  return examples::example_names();
#else
  return {};
#endif
}

int cmd_demo() {
#ifdef SIMPLER_HAVE_EXAMPLES
  const examples::ExampleOptions defaults;
  fmt::print("simpler {} demo on the simulated chip, geometry {}\n\n", version_string(), describe(defaults.geometry));
  std::fflush(stdout);
  ProgressLine progress;
  std::vector<Row> rows;
  // Example after example, in the registry's order (the forking node and
  // network examples first), each on every runtime.
  for (const examples::ExampleInfo& example : examples::example_list()) {
    for (const std::string& runtime : runtime_names()) {
      examples::ExampleOptions options = defaults;
      options.runtime = runtime;
      options.tasks_per_run = example.demo_tasks;
      rows.push_back(run_one(example, options, progress));
    }
  }
  print_table(rows);
  size_t ok = 0, not_applicable = 0;
  for (const Row& row : rows) {
    const Verdict v = verdict(row);
    ok += v == Verdict::kOk ? 1 : 0;
    not_applicable += v == Verdict::kNotApplicable ? 1 : 0;
  }
  const size_t failed = rows.size() - ok - not_applicable;
  fmt::print("\n{}/{} rows verified, {} not applicable (n/a), {} failed: {}\n", ok, rows.size(), not_applicable, failed,
             failed == 0 ? "PASS" : "FAIL");
  return failed == 0 ? kExitOk : kExitFailure;
#else
  return no_examples();
#endif
}

int cmd_run(const RunFlags& flags) {
  warn_if_rank_has_one_cpu();
#ifdef SIMPLER_HAVE_EXAMPLES
  examples::ExampleOptions options;
  Result<Geometry> geometry = Geometry::by_name(flags.geometry);
  if (!geometry.ok()) {
    fmt::print(stderr, "--geometry: {}\n", geometry.status().message());
    return kExitUsage;
  }
  options.geometry = *geometry;
  options.runtime = flags.runtime;
  options.runs = flags.runs;
  options.tasks_per_run = flags.tasks;
  options.pipeline_depth = flags.pipeline_depth;
  if (!flags.trace_dir.empty()) {
    options.call.swimlane_level = flags.swimlane;
    options.call.trace_dir = flags.trace_dir;
    options.call.dump_args = flags.dump_args == "full"      ? DumpArgs::Full
                             : flags.dump_args == "hybrid"  ? DumpArgs::Hybrid
                             : flags.dump_args == "partial" ? DumpArgs::Partial
                                                            : DumpArgs::Off;
  }
  if (examples::serves_on_this_rank(flags.example)) {
    // An MPI example's other ranks serve its nodes, silently unless they fail.
    const Status served = examples::serve_example(flags.example, options);
    if (!served.ok()) fmt::print(stderr, "MPI rank {}: {}\n", mpi_rank(), served.to_string());
    return served.ok() ? kExitOk : kExitFailure;
  }
  fmt::print("simpler {} run {} with runtime {} on geometry {}, pipeline depth {}\n\n", version_string(), flags.example,
             options.runtime, describe(options.geometry), options.pipeline_depth);
  std::fflush(stdout);
  ProgressLine progress;
  std::vector<Row> rows;
  for (const examples::ExampleInfo& example : examples::example_list()) {
    if (example.name == flags.example) rows.push_back(run_one(example, options, progress));
  }
  if (rows.empty()) {
    fmt::print(stderr, "unknown example '{}'\n", flags.example);
    return kExitUsage;
  }
  print_table(rows);
  const bool ok = verdict(rows[0]) == Verdict::kOk;
  if (ok && !flags.trace_dir.empty() && flags.swimlane > 0) {
    fmt::print("\ntrace (swimlane level {}, the last run): {}/trace.json\n", flags.swimlane, flags.trace_dir);
  }
  if (ok && !flags.trace_dir.empty() && flags.dump_args != "off") {
    // A node's or network's runs leave one dump per chip and node task, under run<R>/.
    if (std::filesystem::exists(std::filesystem::path(flags.trace_dir) / "args_dump")) {
      fmt::print("argument dump ({}, the last run): {}/args_dump\n", flags.dump_args, flags.trace_dir);
    } else {
      fmt::print(
          "argument dumps ({}, one per chip and node task of each run): under {}/run<R>/ (simpler dump show {})\n",
          flags.dump_args, flags.trace_dir, flags.trace_dir);
    }
  }
  return ok ? kExitOk : kExitFailure;
#else
  (void)flags;
  return no_examples();
#endif
}

int cmd_info() {
  fmt::print("simpler {}\n", version_string());
  fmt::print("build: {}\n", build_options());
  fmt::print("usable CPUs: {} (this process's affinity mask)\n\n", usable_cpus());
  fmt::print("geometry presets (default {}):\n", Geometry::small().name);
  fmt::print("  {:<8} {:>8} {:>4} {:>4} {:>6} {:>6}\n", "name", "clusters", "AIC", "AIV", "cores", "AICPU");
  for (const Geometry& g : Geometry::presets()) {
    fmt::print("  {:<8} {:>8} {:>4} {:>4} {:>6} {:>6}\n", g.name, g.clusters, g.aic_cores(), g.aiv_cores(), g.cores(),
               g.aicpu_threads);
  }
  fmt::print("\nruntimes (default {}):\n", WorkerConfig().runtime);
  for (const ComponentInfo& r : available_runtimes()) fmt::print("  {:<18} {}\n", r.name, r.description);
  fmt::print("\nbackends (default {}):\n", WorkerConfig().backend);
  for (const ComponentInfo& b : available_backends()) fmt::print("  {:<18} {}\n", b.name, b.description);
  fmt::print("\nexamples:");
  for (const std::string& name : example_names()) fmt::print(" {}", name);
#ifdef SIMPLER_HAVE_EXAMPLES
  // Where an installed or moved simpler finds the examples' kernels.
  const Result<std::string> kernels = examples::kernel_dir();
  fmt::print("\nexample kernels: {}", kernels.ok() ? *kernels : kernels.status().message());
#endif
#ifdef SIMPLER_HAVE_BENCH
  fmt::print("\nbenchmarks:");
  for (const bench::BenchInfo& b : bench::list()) fmt::print(" {}", b.name);
  fmt::print("\n");
#else
  fmt::print("\nbenchmarks: not built (SIMPLER_BUILD_BENCH=OFF)\n");
#endif
  return kExitOk;
}

int cmd_bench(const BenchFlags& flags) {
  warn_if_rank_has_one_cpu();
#ifdef SIMPLER_HAVE_BENCH
  const std::vector<bench::BenchInfo> all = bench::list();
  if (flags.list) {
    for (const bench::BenchInfo& b : all) fmt::print("{:<24} {}\n", b.name, b.description);
    return kExitOk;
  }
  std::vector<std::string> names = flags.names;
  for (const std::string& name : names) {
    bool known = false;
    for (const bench::BenchInfo& b : all) known = known || b.name == name;
    if (!known) {
      fmt::print(stderr, "bench: unknown benchmark '{}' (see `simpler bench --list`)\n", name);
      return kExitUsage;
    }
  }
  if (names.empty()) {
    for (const bench::BenchInfo& b : all) {
      if (!b.needs_mpi) names.push_back(b.name);
    }
  }
  if (mpi_rank() != 0) {
    // An MPI job's other ranks play their part of each MPI benchmark, silently.
    for (const std::string& name : names) {
      if (!bench::serves_on_this_rank(name)) {
        fmt::print(stderr, "bench: MPI rank {} has no part in '{}'; run it without mpirun\n", mpi_rank(), name);
        return kExitUsage;
      }
      if (const int r = bench::serve_rank(name); r != kExitOk) return r;
    }
    return kExitOk;
  }
  int rc = kExitOk;
  for (const std::string& name : names) {
    const int r = bench::run(name, {flags.json, flags.neighbours, flags.compare_load}, std::cout);
    if (r != kExitOk && rc == kExitOk) rc = r;
  }
  return rc;
#else
  (void)flags;
  fmt::print(stderr, "simpler was built without benchmarks (SIMPLER_BUILD_BENCH=OFF)\n");
  return kExitFailure;
#endif
}

}  // namespace simpler::cli
